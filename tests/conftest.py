"""Shared fixtures. Run the suite with `pytest` from the repository root (`pytest -m "not slow"`
skips the end-to-end runs)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SHARED_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
SHARED_RANKS = REPO.parent / "shared" / "data" / "tiktoken" / "r50k_base.tiktoken"
R50K_CACHE_NAME = "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4"  # sha1 of tiktoken's r50k_base URL

# A tiny model and run that every end-to-end test can afford on 2 CPU cores.
TINY_RUN = [
    "model=gpt-nano",
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=16",
    "model.block_size=16",
    "train.max_iters=20",
    "train.batch_size=4",
    "train.eval_interval=10",
    "train.eval_iters=2",
    "train.log_interval=5",
    "train.sample_tokens=20",
]


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


def run_script(script: str, args: list[str], cwd: Path, data_dir: Path, timeout: float = 300, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TINYGPT_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, str(REPO / script), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=stdin,
    )


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
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def compose(overrides: list[str], output_dir: Path, config_name: str = "config") -> dict:
    """The resolved config as train.py would see it (compose API: no run dir, so we set one)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=[f"paths.output_dir={output_dir}", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)
