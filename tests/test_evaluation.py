"""gpt/evaluation.py: every token scored once, bytes counted per token, the numbers consistent.
Run: pytest tests/test_evaluation.py"""

from __future__ import annotations

import math

import numpy as np
import torch

from gpt.evaluation import evaluate_tokens, split_tokens, token_bytes
from gpt.model import GPT, GPTConfig
from gpt.tokenizer import ByteTokenizer, TiktokenTokenizer
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
    assert r["tokens"] == (78 - 1) // 8 * 8 and r["bytes"] == r["tokens"]
    assert math.isclose(r["perplexity"], math.exp(r["loss"]), rel_tol=1e-9)
    assert math.isclose(r["bits_per_byte"], r["loss"] / math.log(2), rel_tol=1e-9)
    windows = torch.from_numpy(
        tokens[: 9 * 9].reshape(-1, 9)[:9] if False else np.stack([tokens[i * 8 : i * 8 + 9] for i in range(9)])
    )
    with torch.no_grad():
        expected = model(windows[:, :-1], windows[:, 1:])[1].item()
    assert math.isclose(r["loss"], expected, rel_tol=1e-5)


def test_split_tokens_reads_only_what_is_scored():
    shards = [np.arange(10), np.arange(10, 25)]
    assert split_tokens(shards, None).tolist() == list(range(25))
    assert split_tokens(shards, 12).tolist() == list(range(13))  # max_tokens targets need one token more
