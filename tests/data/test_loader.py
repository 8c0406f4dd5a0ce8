"""gpt/data/loader.py: random training windows, shifted targets, reproducible, within shards.
Run: pytest tests/data/test_loader.py"""

from __future__ import annotations

import numpy as np
import torch

from gpt.data.loader import Prefetched, RandomWindows
from helpers import data_settings, load, write_corpus


def test_random_windows_are_shifted_and_reproducible():
    tokens = np.arange(1000, dtype=np.uint16)
    a = RandomWindows(tokens, block_size=8, batch_size=5, device=torch.device("cpu"), seed=7)
    b = RandomWindows(tokens, block_size=8, batch_size=5, device=torch.device("cpu"), seed=7)
    batch = a.next()
    x, y = batch.x, batch.y
    assert x.shape == y.shape == (5, 8) and x.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    assert batch.tokens == 40 and batch.trained is None  # text: every target trains
    assert torch.equal(x, b.next().x)
    assert int(x.max()) < 1000 - 1


def test_shards_and_windows_across_them(tmp_path):
    folder = write_corpus(tmp_path / "corpus", "txt")
    data = load(data_settings("s", {"kind": "local", "path": str(folder)}, {"kind": "byte"}, shard_tokens=200), tmp_path / "root")
    assert len(data.train) > 2 and all(len(s) <= 200 for s in data.train)
    a = RandomWindows(data.train, 16, 32, torch.device("cpu"), seed=1)
    b = RandomWindows(data.train, 16, 32, torch.device("cpu"), seed=1)
    batch = a.next()
    x, y = batch.x, batch.y
    assert torch.equal(x, b.next().x) and torch.equal(x[:, 1:], y[:, :-1])
    joined = [np.asarray(s).tolist() for s in data.train]
    for row in x.tolist():  # every window lies inside one shard
        assert any(any(s[i : i + 16] == row for i in range(len(s) - 15)) for s in joined)


def test_two_ranks_see_the_batch_of_one_process_with_twice_the_batch():
    tokens = np.arange(5000, dtype=np.uint16)
    one = RandomWindows(tokens, 8, 6, torch.device("cpu"), seed=3).next().x
    halves = [RandomWindows(tokens, 8, 3, torch.device("cpu"), seed=3, rank=r, world_size=2).next().x for r in (0, 1)]
    assert torch.equal(torch.cat(halves), one)


def test_prefetching_one_batch_ahead_keeps_the_stream_and_its_resume_point():
    """gpt.data.loader.Prefetched (a GPU run's training batches) yields the batches of the
    stream it wraps, in order, and its state is the one before the batch it holds ahead: a
    stream resumed from it (prefetching or not) goes on with the very next batch."""
    tokens = np.arange(3000, dtype=np.uint16)
    plain = RandomWindows(tokens, 16, 4, torch.device("cpu"), seed=3)
    ahead = Prefetched(RandomWindows(tokens, 16, 4, torch.device("cpu"), seed=3), torch.device("cpu"))
    for _ in range(5):
        assert torch.equal(plain.next().x, ahead.next().x)
    state = ahead.state_dict()  # six batches drawn, five handed out
    expected = [plain.next().x for _ in range(3)]
    for resumed in (RandomWindows(tokens, 16, 4, torch.device("cpu"), seed=99), ahead):
        resumed.load_state_dict(state)  # (`ahead` drops the batch it held)
        assert all(torch.equal(resumed.next().x, x) for x in expected)
