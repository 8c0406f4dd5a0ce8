"""gpt/interop/tinygpt.py and modeling_tinygpt.py: any GPT block exports to a folder transformers
loads (its modeling code travels with it, trust_remote_code=True) with tinygpt's logits and
greedy text, batched and left-padded too, past the context as well; tinygpt reads the folder back
bitwise. (Each tokenizer kind's files: tests/interop/test_tokenizer_export.py.)
Run: pytest tests/interop/test_tinygpt.py"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")

from gpt import interop  # noqa: E402
from gpt.config import SamplingSettings  # noqa: E402
from gpt.errors import TinyGPTError  # noqa: E402
from gpt.generation import generate  # noqa: E402
from gpt.model import GPT, GPTConfig, registry  # noqa: E402
from gpt.tokenizers import ByteTokenizer  # noqa: E402

QUICKSTART = dict(norm="rmsnorm", pos_encoding="rope", qk_norm=True, bias=False)
BLOCKS = {
    "quickstart": QUICKSTART,
    "modded": dict(QUICKSTART, mlp="relu2", logit_softcap=15.0, n_kv_head=2),
    "sinusoidal": dict(pos_encoding="sinusoidal", qk_norm=True),
    "learned-qk-norm": dict(qk_norm=True),
    "no-positions-swiglu-untied": dict(pos_encoding="none", mlp="swiglu", tie_embeddings=False, norm="rmsnorm", bias=False),
    "head-dim-gqa-qkv-bias": dict(QUICKSTART, head_dim=24, n_kv_head=1, qkv_bias=True, mlp="gelu", activation="gelu_tanh"),
}


def _model(options: dict, vocab: int = 257) -> GPT:
    """Weights scaled up from the 0.02 init so outputs depend on the context (a wrong position or
    mask moves the logits by far more than the tolerance)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=48, n_layer=2, n_head=4, n_embd=64, **options)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


@pytest.mark.parametrize("name", list(BLOCKS))
def test_any_block_exports_with_its_modeling_code(name, tmp_path):
    model = _model(BLOCKS[name])
    tok = ByteTokenizer()
    out, cls = interop.export(model, tok, tmp_path / "hf")
    assert cls.startswith("TinyGPTForCausalLM") and (out / "modeling_tinygpt.py").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    idx = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
    prompts = ["ROMEO:", "To be, or", "x"]
    # 60 new tokens: past the context (48), where each token is predicted from the last 48 re-encoded
    ours = [rows[0] for rows in generate(model, tok, prompts, SamplingSettings(max_new_tokens=60, temperature=0.0))]
    for prompt, text in zip(prompts, ours):  # one at a time: greedy, through the KV cache
        ids = torch.tensor([tok.encode(prompt)])
        got = hf.generate(ids, max_new_tokens=60, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert tok.decode(got[0, ids.size(1) :].tolist()) == text
    encoded = [tok.encode(p) for p in prompts]  # together, left-padded as tinygpt batches them
    width = max(map(len, encoded))
    ids = torch.tensor([[0] * (width - len(e)) + e for e in encoded])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    got = hf.generate(ids, attention_mask=mask, max_new_tokens=60, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert [tok.decode(row[width:].tolist()) for row in got] == ours
    back, spec = interop.load(str(out))  # and back into tinygpt, without running the folder's code
    assert back.config == model.config and spec == tok.to_dict()
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))


def test_the_tie_survives_transformers_and_a_recurrent_model_is_refused(tmp_path):
    out, _ = interop.export(_model(QUICKSTART), ByteTokenizer(), tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # one matrix, as in tinygpt
    lstm = registry.build(registry.config_from_dict({"arch": "lstm", "vocab_size": 8, "n_embd": 8, "n_hidden": 8}))
    with pytest.raises(TinyGPTError, match="recurrent model"):
        interop.export(lstm, ByteTokenizer(), tmp_path / "rnn")
    assert not (tmp_path / "rnn").exists()
