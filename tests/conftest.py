"""Shared fixtures; helpers to import live in tests/helpers.py. Run the suite with
`python -m pytest` from the repository root (`-m "not slow"` skips the end-to-end runs)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from helpers import R50K_CACHE_NAME, SHARED_RANKS, SHARED_TEXT

# Tests never reach the Hub. Set before anything imports huggingface_hub, which reads it once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> tuple[Path, list[str]]:
    """A data root holding tinyshakespeare/input.txt, and the overrides that make the config
    accept it. Uses the real corpus from ../shared when present, else a generated stand-in
    (whose checksum the overrides supply)."""
    root = tmp_path_factory.mktemp("data")
    dest = root / "tinyshakespeare" / "input.txt"
    dest.parent.mkdir(parents=True)
    if SHARED_TEXT.is_file():
        dest.write_bytes(SHARED_TEXT.read_bytes())
        return root, []
    lines = [f"CITIZEN {i % 7}:\nWe are accounted poor citizens, the patricians good {i}.\n\n" for i in range(4000)]
    dest.write_text("".join(lines), encoding="utf-8")
    sha = hashlib.sha256(dest.read_bytes()).hexdigest()
    return root, [f"data.source.sha256={sha}"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def gpt2_ranks() -> Path | None:
    """GPT-2's real BPE ranks file when ../shared has it (None otherwise)."""
    return SHARED_RANKS if SHARED_RANKS.is_file() else None


@pytest.fixture(scope="session", autouse=True)
def _offline_tiktoken(tmp_path_factory, gpt2_ranks):
    """Seed a private tiktoken cache so get_encoding("gpt2"/"r50k_base") works offline (also in
    subprocesses, which inherit the environment), and keep tests off the Hub."""
    if gpt2_ranks is not None and not os.environ.get("TIKTOKEN_CACHE_DIR"):
        cache = tmp_path_factory.mktemp("tiktoken")
        (cache / R50K_CACHE_NAME).write_bytes(gpt2_ranks.read_bytes())
        os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
