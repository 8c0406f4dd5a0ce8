"""gpt/model/lora.py: adapters on the right layers only, merged equals unmerged.
Run: pytest tests/test_lora.py"""

from __future__ import annotations

import torch

from gpt.model import GPT, GPTConfig
from gpt.model.lora import apply_lora, merge_lora, merged_state_dict


def test_lora_merged_equals_unmerged():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)).eval()
    assert apply_lora(model, rank=4, alpha=8.0) == 8  # c_attn, c_proj, c_fc, c_proj per block
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".lora_" in n
    }
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B" in n:
                p.normal_(0, 0.5)  # a trained adapter is not zero
    idx = torch.randint(0, 32, (2, 8))
    with torch.no_grad():
        unmerged = model(idx)[0]
        plain = GPT(model.config).eval()
        plain.load_state_dict(merged_state_dict(model))
        merged = merge_lora(model)(idx)[0]
    assert (unmerged - merged).abs().max().item() < 1e-5
    assert (unmerged - plain(idx)[0]).abs().max().item() < 1e-5
    assert not any(".lora_" in n for n, _ in model.named_parameters())
