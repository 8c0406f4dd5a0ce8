"""gpt/apps/prepare.py: `tinygpt prepare` prepares what `tinygpt train` then reuses.
Run: pytest tests/apps/test_prepare.py"""

from __future__ import annotations

import pytest

from helpers import run_script


@pytest.mark.slow
def test_prepare_command_and_bpe_training(tmp_path, data_root, gpt2_ranks):
    root, data_overrides = data_root
    data = tmp_path / "data"  # a data root of its own, sharing the downloaded corpus
    data.mkdir()
    (data / "tinyshakespeare").symlink_to(root / "tinyshakespeare")
    prep = run_script("prepare", ["data=shakespeare", *data_overrides, f"paths.data_dir={data}"], tmp_path, root)
    assert prep.returncode == 0, prep.stderr
    assert "prepared 1 document:" in prep.stdout and "tokenizer tiktoken" in prep.stdout
    proc = run_script("train.py", ["data=shakespeare", *data_overrides, "debug=tiny", f"paths.data_dir={data}"], tmp_path, root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "vocab 50257" in proc.stdout and "prepared" not in proc.stdout  # reused what prepare made
    sample = run_script("sample.py", ["num_samples=1", "max_new_tokens=20", "prompt=ROMEO:"], tmp_path, root)
    assert sample.returncode == 0 and "ROMEO:" in sample.stdout
