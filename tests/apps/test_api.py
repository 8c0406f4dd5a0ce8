"""gpt/__init__.py: `from gpt import train, sample` composes the same configs as the commands,
prints each log line once and returns the run's summary.
Run: pytest tests/apps/test_api.py"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpt.errors import TinyGPTError
from helpers import REPO

_NOTEBOOK = """
import json, sys
from gpt import sample, train
summary = train(["debug=tiny", "data=shakespeare_char", "train.max_iters=10", "train.eval_interval=5", *sys.argv[1:]])  # characters: 12 tokens, 12 characters
print("SUMMARY " + json.dumps(summary))
texts = sample([f"run_dir={summary['run_dir']}", "num_samples=2", "max_new_tokens=12"], prompt="ROMEO:")
print("TEXTS " + json.dumps(texts))
"""


def test_train_and_sample_from_python(tmp_path, data_root):
    root, data_overrides = data_root
    proc = subprocess.run(
        [sys.executable, "-c", _NOTEBOOK, *data_overrides, f"paths.data_dir={root}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    logged = [line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith(("SUMMARY ", "TEXTS "))]
    repeated = sorted({line for line in logged if line.strip() and not set(line) <= {"-"} and logged.count(line) > 1})
    assert not repeated, repeated  # each log line once
    summary = json.loads(next(line for line in lines if line.startswith("SUMMARY "))[8:])
    on_disk = json.loads((tmp_path / summary["run_dir"] / "summary.json").read_text())
    assert summary["best_val_loss"] == on_disk["best_val_loss"] and summary["status"] == "finished"
    assert summary["run_dir"].startswith(str(tmp_path / "outputs" / "runs"))  # no hidden paths.output_dir needed
    texts = json.loads(next(line for line in lines if line.startswith("TEXTS "))[6:])
    assert len(texts) == 1 and len(texts[0]) == 2 and all(len(t) == 12 for t in texts[0])
    assert not any(line.startswith("----------") and "sample 1/2" in line for line in lines)  # sample() prints nothing


def test_mistakes_raise_from_python():
    from gpt import train

    with pytest.raises(TinyGPTError, match="unknown setting 'train.max_iter'"):
        train(["train.max_iter=3"])
    assert REPO.is_dir()


def test_the_documented_python_api_runs_as_written(tmp_path, data_root):
    """docs/sampling.md's "From Python" snippet, as it stands on the page (the run directory put
    in for its placeholder), on a run trained through `gpt.train`: `from gpt import loading`,
    `gpt.config.SamplingSettings`, `gpt.generation.generate` / `stream`."""
    import re

    root, data_overrides = data_root
    page = (REPO / "docs" / "sampling.md").read_text()
    snippet = re.search(r"## From Python\n\n```python\n(.*?)```", page, re.S)[1]
    assert "from gpt import loading" in snippet and "<stamp>" in snippet
    run = tmp_path / "run"
    setup = (
        "from gpt import train\n"
        # characters, so 20 new tokens are 20 characters of text
        f"train(['debug=tiny', 'data=shakespeare_char', 'train.max_iters=4', 'train.sample_tokens=0', 'paths.output_dir={run}', "
        f"'paths.data_dir={root}', *{data_overrides!r}])\n"
    )
    code = setup + snippet.replace("outputs/runs/<stamp>", str(run)).replace("max_new_tokens=200", "max_new_tokens=20")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout.splitlines()
    import ast

    at = next(i for i, line in enumerate(printed) if line.startswith("[["))
    batch = ast.literal_eval(printed[at])  # print(generate(...)): 2 prompts x 2 samples of 20 characters
    assert len(batch) == 2 and all(len(row) == 2 and all(len(text) == 20 for text in row) for row in batch)
    assert len("\n".join(printed[at + 1 :])) == 20  # stream(): the pieces of one more, printed as they came
