"""`tinygpt plot` (gpt/apps/plot.py, gpt/tracking/plots.py): a run's loss curves and its model's
attention maps as PNG files, through the real command; mistakes are one line, nothing written.
Run: pytest tests/apps/test_plot.py"""

from __future__ import annotations

import json

from helpers import assert_one_line_error, run_script

PNG = b"\x89PNG\r\n\x1a\n"


def test_curves_and_attention_maps_of_a_run(trained_run, tmp_path, data_root):
    cwd, run, _ = trained_run
    root, _ = data_root
    proc = run_script("plot", [], cwd, root)  # the newest run
    assert proc.returncode == 0, proc.stderr
    curves = run / "curves.png"
    assert curves.read_bytes()[:8] == PNG and f"wrote {curves.relative_to(cwd)}" in proc.stdout
    out = tmp_path / "maps" / "a.png"
    proc = run_script("plot", [f"run_dir={run}", "attention=ROMEO: But soft", "layers=[0]", f"out={out}"], cwd, root)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == PNG


def test_the_curves_follow_metrics_jsonl(trained_run, tmp_path):
    """The plotted points are the run's records: a run with evals only (no logged step yet) plots
    its evals; a line cut short by a crash is skipped."""
    from gpt.tracking import plots

    _, run, _ = trained_run
    train, evals = plots.read_metrics(run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals] == [r["step"] for r in records if r["kind"] == "eval"]
    assert [r["loss"] for r in train] == [r["loss"] for r in records if r["kind"] == "train"]
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "metrics.jsonl").write_text('{"kind": "eval", "step": 0, "train": 5.0, "val": 5.1}\n{"kind": "tra')
    assert plots.read_metrics(cut) == ([], [{"kind": "eval", "step": 0, "train": 5.0, "val": 5.1}])
    assert plots.plot_curves(cut, cut / "c.png").read_bytes()[:8] == PNG


def test_mistakes_are_one_line_and_write_nothing(trained_run, tmp_path, data_root):
    cwd, run, _ = trained_run
    root, data_overrides = data_root
    before = sorted(p.name for p in run.iterdir())
    assert_one_line_error(
        run_script("plot", [f"run_dir={run}", "attention=ROMEO", "layers=[3]"], cwd, root), "layers=[3]", "0..0"
    )
    assert_one_line_error(run_script("plot", [f"run_dir={tmp_path / 'nope'}"], cwd, root), "does not exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(run_script("plot", [f"run_dir={empty}"], cwd, root), "has no metrics.jsonl")
    assert_one_line_error(run_script("plot", [f"run_dir={run}", "attention="], cwd, root), "attention= needs a prompt")
    assert sorted(p.name for p in run.iterdir()) == before
    lstm = run_script(
        "train.py", ["debug=tiny", "model=lstm", *data_overrides, f"hydra.run.dir={tmp_path / 'lstm'}"], tmp_path, root
    )
    assert lstm.returncode == 0, lstm.stderr
    assert_one_line_error(run_script("plot", [f"run_dir={tmp_path / 'lstm'}", "attention=ROMEO"], cwd, root), "recurrent model")
