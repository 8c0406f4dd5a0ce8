"""gpt/evals/scoring.py: continuation log-likelihoods, batched and padded, equal to scoring every
token alone (transformers in windows of their context, recurrent models whole).
Run: pytest tests/test_scoring.py"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpt.evals.scoring import score
from gpt.model import GPT, GPTConfig
from gpt.model.rnn import RecurrentLM, RNNConfig

CPU = torch.device("cpu")


@pytest.mark.parametrize("make", ["gpt", "rnn"])
def test_batched_padded_scores_equal_one_token_at_a_time(make):
    """Every continuation token's log-probability, computed alone: a transformer predicts it from
    the window (up to block_size tokens) that ends where its piece ends, a piece being the
    continuation cut in block_size chunks; a recurrent model from everything before it."""
    torch.manual_seed(0)
    block = 12
    if make == "gpt":
        model = GPT(GPTConfig(vocab_size=50, block_size=block, n_layer=2, n_head=2, n_embd=16, dropout=0.0))
    else:
        model = RecurrentLM(RNNConfig(arch="lstm", vocab_size=50, block_size=block, n_layer=1, n_embd=16, n_hidden=24))
    g = torch.Generator().manual_seed(1)
    shapes = [(3, 2), (20, 4), (1, 1), (9, 3), (11, 1), (4, 30), (15, 12)]  # (20, 4): context cut; (4, 30): 3 pieces
    requests = [(torch.randint(50, (n,), generator=g).tolist(), torch.randint(50, (m,), generator=g).tolist()) for n, m in shapes]
    together = score(model, requests, CPU, batch_size=4)
    for (ctx, cont), s in zip(requests, together):
        full, expected = ctx + cont, 0.0
        for j, token in enumerate(cont):
            t = len(ctx) + j  # the token's place in the request
            piece_end = len(ctx) + min((j // block + 1) * block, len(cont)) - 1
            begin = 0 if make == "rnn" else max(0, piece_end - block)
            with torch.no_grad():
                logits, _ = model(torch.tensor(full[begin:t])[None])
            expected += F.log_softmax(logits[0, -1], dim=-1)[token].item()
        assert abs(s.logprob - expected) < 1e-4 and s.tokens == len(cont), (ctx, cont)
