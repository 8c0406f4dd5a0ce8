"""Shared fixtures; helpers to import live in tests/helpers.py. Run the suite with
`python -m pytest` from the repository root (`-m "not slow"` skips the end-to-end runs)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# Under pytest-xdist (`-n 2`, as CI runs the suite) the workers share the cores: one thread each,
# for this process's torch and every process a test starts (tinygpt's runs and torchrun read
# OMP_NUM_THREADS), set before torch starts its thread pool. Two trainings of two threads each on
# two cores run many times slower than one (gpt.runtime.threads). An OMP_NUM_THREADS given stays.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import R50K_CACHE_NAME, SHARED_RANKS, SHARED_TEXT  # noqa: E402

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
    dest.write_text(stand_in_corpus(), encoding="utf-8")
    sha = hashlib.sha256(dest.read_bytes()).hexdigest()
    return root, [f"data.source.sha256={sha}"]


def stand_in_corpus(n_speeches: int = 3000) -> str:
    """Shakespeare-shaped text whose alphabet holds every printable ASCII character, so that any
    prompt a test types (ROMEO:, KING:, JULIET: O, digits, punctuation) fits a char model trained
    on it. Deterministic."""
    speakers = ["ROMEO", "JULIET", "KING", "QUEEN", "First Citizen", "All", "MENENIUS", "HAMLET", "PROSPERO", "VIOLA"]
    lines = [
        "The quick brown fox jumps over the lazy dog.",
        "PACK MY BOX WITH FIVE DOZEN LIQUOR JUGS!",
        "But soft, what light through yonder window breaks?",
        "Is this a dagger which I see before me; 'tis 0123456789 & no more.",
        "We are accounted poor citizens, the patricians good (so they say) -- #1 of @ll.",
        'Speak: "what [news] {from} <Rome>?" -- 50% + $3 * 2 = ~6 / |x| ^ 2 _ ` \\ end.',
    ]
    speeches = [
        f"{speakers[i % len(speakers)]}:\n{lines[i % len(lines)]}\n{lines[(i * 7 + 3) % len(lines)]}\n\n"
        for i in range(n_speeches)
    ]
    return "".join(speeches)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def gpt2_ranks() -> Path:
    """GPT-2's real BPE ranks file; the test is skipped, saying where it was looked for, without."""
    if not SHARED_RANKS.is_file():
        pytest.skip(
            f"needs GPT-2's BPE ranks at {SHARED_RANKS} (TINYGPT_TEST_SHARED=<folder> points elsewhere); "
            "tiktoken cannot download them offline"
        )
    return SHARED_RANKS


def pytest_collection_modifyitems(config, items):
    """Mark `shared` the tests that need ../shared/ and skip without it (GPT-2's real ranks, via
    the gpt2_ranks fixture, or asked for by name in a test's tiktoken case; test_device_script.py
    marks itself): CI runs them where ../shared/
    is, and every other fast test in an empty environment (.ci/run), each test once."""
    asks = {}  # module path -> whether it asks for the ranks by name (request.getfixturevalue) in tiktoken's cases
    for item in items:
        path = str(item.path)
        if path not in asks:
            asks[path] = 'getfixturevalue("gpt2_ranks")' in item.path.read_text(encoding="utf-8")
        if "gpt2_ranks" in getattr(item, "fixturenames", ()) or (asks[path] and "tiktoken" in item.name):
            item.add_marker(pytest.mark.shared)


@pytest.fixture(scope="session", autouse=True)
def _offline_tiktoken(tmp_path_factory):
    """Seed a private tiktoken cache so get_encoding("gpt2"/"r50k_base") works offline (also in
    subprocesses, which inherit the environment), and keep tests off the Hub."""
    if SHARED_RANKS.is_file() and not os.environ.get("TIKTOKEN_CACHE_DIR"):
        cache = tmp_path_factory.mktemp("tiktoken")
        (cache / R50K_CACHE_NAME).write_bytes(SHARED_RANKS.read_bytes())
        os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
