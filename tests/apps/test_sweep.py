"""gpt/apps/sweep.py: `tinygpt sweep <dir>` writes and prints a sweep's leaderboard.
Run: pytest tests/apps/test_sweep.py"""

from __future__ import annotations

import json

from helpers import run_script


def test_sweep_command_summarises_a_folder(tmp_path):
    for n, loss in ((0, 2.0), (1, 1.5)):
        job = tmp_path / "sweep" / str(n)
        job.mkdir(parents=True)
        (job / "summary.json").write_text(json.dumps({"status": "finished", "best_val_loss": loss, "overrides": [f"x={n}"]}))
    for args in ([str(tmp_path / "sweep")], [f"dir={tmp_path / 'sweep'}"]):
        proc = run_script("sweep", args, tmp_path, tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "| 1 | 1 | finished | 1.5000 |" in proc.stdout and "wrote leaderboard.md" in proc.stdout
        assert (tmp_path / "sweep" / "leaderboard.csv").is_file()
