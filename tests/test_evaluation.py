"""gpt/evals/perplexity.py: every token scored once, bytes counted per token, the numbers consistent.
Run: pytest tests/test_evaluation.py"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpt.evals.perplexity import evaluate_tokens, split_tokens, token_bytes, windows
from gpt.model import GPT, GPTConfig
from gpt.tokenizers import ByteTokenizer, TiktokenTokenizer
from helpers import write_ranks


def test_bits_per_byte_counts_bytes_per_token(tmp_path):
    tok = TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "r.tiktoken")))
    ids = tok.encode("héllo 日本") + [tok.eot_id]
    assert token_bytes(tok, ids) == len("héllo 日本".encode())  # end-of-text counts nothing
    assert token_bytes(ByteTokenizer(), list("日".encode()) + [256]) == 3


def test_every_window_is_scored_and_the_figures_agree():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=257, block_size=8, n_layer=1, n_head=2, n_embd=16))
    tokens = np.array(list(b"abcdefghijklmnopqrstuvwxyz" * 3), dtype=np.int64)  # 78 tokens
    r = evaluate_tokens(model, tokens, ByteTokenizer(), torch.device("cpu"), batch_size=3)
    assert r["tokens"] == 78 - 1 and r["bytes"] == r["tokens"]  # the 5 targets after the last full window too
    assert math.isclose(r["perplexity"], math.exp(r["loss"]), rel_tol=1e-9)
    assert math.isclose(r["bits_per_byte"], r["loss"] / math.log(2), rel_tol=1e-9)
    full = torch.from_numpy(np.stack([tokens[i * 8 : i * 8 + 9] for i in range(9)]))  # 72 targets
    tail = torch.from_numpy(tokens[72:])[None]  # the last 5
    with torch.no_grad():
        expected = (model(full[:, :-1], full[:, 1:])[1].item() * 72 + model(tail[:, :-1], tail[:, 1:])[1].item() * 5) / 77
    assert math.isclose(r["loss"], expected, rel_tol=1e-5)


def test_split_tokens_reads_only_what_is_scored():
    shards = [np.arange(10), np.arange(10, 25)]
    assert split_tokens(shards, None).tolist() == list(range(25))
    assert split_tokens(shards, 12).tolist() == list(range(13))  # max_tokens targets need one token more


@pytest.mark.parametrize("n, block, stride", [(2, 8, 8), (9, 8, 8), (10, 8, 8), (78, 8, 8), (78, 8, 3), (78, 8, 1), (5, 8, 2)])
def test_each_target_is_scored_once_with_at_least_block_minus_stride_context(n, block, stride):
    spans = windows(n, block, stride)
    scored = [j for b, e, first in spans for j in range(first, e)]
    assert scored == list(range(n - 1))  # every target once, in order, the tail included
    for k, (b, e, first) in enumerate(spans):
        assert e - b <= block and b <= first
        if k > 0:  # context of a window's first scored target: the positions before it in the window
            assert first - b >= min(block - stride, first)


def test_a_short_text_is_scored_and_a_smaller_stride_sees_more_context():
    """Fewer tokens than block_size + 1 (refused before) and the tail after the last full window
    (dropped before) are scored; stride=1 equals scoring each target with the longest context the
    model allows, computed one target at a time."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=257, block_size=8, n_layer=1, n_head=2, n_embd=16))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    short = np.array(list(b"abc"), dtype=np.int64)
    assert evaluate_tokens(model, short, ByteTokenizer(), torch.device("cpu"))["tokens"] == 2
    tokens = np.array(list(b"the quick brown fox jumps over the lazy dog"), dtype=np.int64)
    r = evaluate_tokens(model, tokens, ByteTokenizer(), torch.device("cpu"), batch_size=4, stride=1)
    expected = 0.0
    with torch.no_grad():
        for j in range(len(tokens) - 1):
            x = torch.from_numpy(tokens[max(0, j + 1 - 8) : j + 1])[None]
            expected += torch.nn.functional.cross_entropy(model(x)[0][0, -1:], torch.tensor([int(tokens[j + 1])])).item()
    assert r["tokens"] == len(tokens) - 1
    assert math.isclose(r["loss"], expected / (len(tokens) - 1), rel_tol=1e-5)
    wide = evaluate_tokens(model, tokens, ByteTokenizer(), torch.device("cpu"), stride=8)
    assert wide["tokens"] == r["tokens"] and not math.isclose(wide["loss"], r["loss"], rel_tol=1e-6)
