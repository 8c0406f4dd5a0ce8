"""Fixtures of the command tests: one tiny trained run that the read-only tests share."""

from __future__ import annotations

import pytest

from helpers import run_script


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, data_root):
    """(working dir, run dir, stdout) of `python train.py debug=tiny data=shakespeare_char` in a
    fresh folder: a char model, so that its tests can count generated characters as tokens and
    meet a vocabulary's limits (the quickstart's byte default is run end to end by
    tests/test_readme_chain.py). Tests using it must not train into that folder again: it would
    no longer be the newest run."""
    root, data_overrides = data_root
    cwd = tmp_path_factory.mktemp("work")
    proc = run_script("train.py", ["debug=tiny", "data=shakespeare_char", *data_overrides], cwd, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((cwd / "outputs" / "runs").iterdir())
    assert len(runs) == 1
    return cwd, runs[0], proc.stdout
