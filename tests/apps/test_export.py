"""gpt/apps/export.py: `tinygpt export` writes a folder transformers loads with the same logits.
Run: pytest tests/apps/test_export.py"""

from __future__ import annotations

import pytest
import torch

from gpt import loading
from helpers import assert_one_line_error, run_script

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")


def test_export_command(tmp_path, trained_run, data_root):
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    proc = run_script("export", [f"paths.runs_dir={cwd / 'outputs'}", f"out={tmp_path / 'hf'}"], tmp_path, root)
    assert proc.returncode == 0, proc.stderr  # the newest run under paths.runs_dir
    assert f"exported {run_dir / 'checkpoints' / 'best.pt'}" in proc.stdout
    ours = loading.load(str(run_dir)).model
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, ours.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
    assert_one_line_error(run_script("export", [f"run_dir={tmp_path / 'nope'}", "out=x"], tmp_path, root), "nope does not exist")
