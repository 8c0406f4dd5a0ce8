"""Experiments: TensorBoard contents, summary.json, sweeps and their leaderboard, Optuna.
Run: pytest tests/test_experiments.py"""

from __future__ import annotations

import csv
import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from conftest import TINY_RUN, compose, run_script
from gpt.errors import TinyGPTError
from gpt.sweep import write_leaderboard
from gpt.trainer import train

QUICK = [o for o in TINY_RUN if not o.startswith("train.max_iters")] + ["train.max_iters=10", "train.eval_interval=5"]


def _events(run_dir) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0, "histograms": 0, "images": 0})
    acc.Reload()
    return acc


def test_event_file_holds_scalars_text_hparams_histograms_and_attention(tmp_path, data_root):
    root, data_overrides = data_root
    cfg = compose([*QUICK, *data_overrides, f"paths.data_dir={root}", "train.eval_sample_tokens=20",
                   "train.histogram_every=1", "train.attention_every=2"], tmp_path)
    train(cfg, overrides=["train.max_iters=10"])
    acc = _events(tmp_path)
    tags = acc.Tags()
    assert {"loss/train", "loss/val", "loss/train_eval", "lr", "grad_norm", "perf/tokens_per_s", "perf/ms_per_step",
            "hparams/best_val_loss", "hparams/final_val_loss"} <= set(tags["scalars"])
    assert {"config/text_summary", "samples/text_summary", "sample/text_summary"} <= set(tags["tensors"])
    assert [e.step for e in acc.Tensors("samples/text_summary")] == [0, 5, 10]
    assert any(t.startswith("weights/") for t in tags["histograms"]) and any(t.startswith("grads/") for t in tags["histograms"])
    assert {"attention/layer_0"} <= set(tags["images"])
    # The hparams live in this run's own event file, with the scores the HParams tab sorts by.
    plugin = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["optim.lr"].number_value == pytest.approx(cfg["optim"]["lr"])
    assert start.hparams["optim.name"].string_value == cfg["optim"]["name"]
    assert start.hparams["model.name"].string_value == "gpt-nano"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == {"hparams/best_val_loss", "hparams/final_val_loss"}
    best = [e.value for e in acc.Scalars("hparams/best_val_loss")]
    assert best == sorted(best, reverse=True) and len(best) == 3

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 10 and summary["overrides"] == ["train.max_iters=10"]
    assert summary["best_val_loss"] == pytest.approx(best[-1]) and summary["params"] > 0
    assert summary["tokens_seen"] == 10 * 4 * 16 and summary["tokens_per_s"] > 0 and summary["wall_s"] > 0


def test_failed_run_leaves_a_failed_summary(tmp_path, data_root, monkeypatch):
    root, data_overrides = data_root
    from gpt import trainer

    def explode(*args, **kwargs):
        raise TinyGPTError("simulated failure")

    monkeypatch.setattr(trainer.Trainer, "_apply_or_skip", explode)
    with pytest.raises(TinyGPTError):
        train(compose([*QUICK, *data_overrides, f"paths.data_dir={root}"], tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "simulated failure"
    assert summary["best_val_loss"] is not None  # the step-0 eval had happened


def _fake_job(sweep, n, status=None, best=None, curve=()):
    job = sweep / str(n)
    job.mkdir(parents=True)
    if status:
        (job / "summary.json").write_text(json.dumps({"status": status, "best_val_loss": best, "final_val_loss": best,
                                                      "step": 10, "overrides": [f"x={n}"]}))
    with open(job / "metrics.jsonl", "w") as f:
        for step, val in curve:
            f.write(json.dumps({"kind": "eval", "step": step, "train": val, "val": val}) + "\n")
        f.write('{"kind": "eval", "st')  # a record cut short by a crash


def test_leaderboard_marks_partial_and_crashed_runs(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    assert write_leaderboard(sweep) == []
    assert "No runs yet" in (sweep / "leaderboard.md").read_text() and (sweep / "val_curves.png").exists()

    _fake_job(sweep, 0, "finished", 2.0, [(0, 4.0), (10, 2.0)])
    _fake_job(sweep, 1, "failed", 1.5, [(0, 4.0), (5, 1.5)])
    _fake_job(sweep, 2, "running", None, [])
    _fake_job(sweep, 3, None)  # crashed before writing anything
    _fake_job(sweep, 4, "finished", 1.8, [(0, 4.0), (10, 1.8)])
    (sweep / "multirun.yaml").write_text("not a job")
    rows = write_leaderboard(sweep)
    assert [(r["run"], r["status"]) for r in rows] == [("1", "failed"), ("4", "finished"), ("0", "finished"),
                                                       ("2", "running"), ("3", "no summary")]
    with open(sweep / "leaderboard.csv") as f:
        assert [r["run"] for r in csv.DictReader(f)] == ["1", "4", "0", "2", "3"]
    assert (sweep / "val_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(TinyGPTError, match="does not exist"):
        write_leaderboard(tmp_path / "nope")


@pytest.mark.slow
def test_two_by_two_multirun_ends_in_a_leaderboard(tmp_path, data_root):
    root, data_overrides = data_root
    args = ["-m", *QUICK, *data_overrides, "optim.lr=1e-3,3e-3", "model.n_layer=1,2", "train.sample_tokens=0",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = run_script("train.py", args, tmp_path, root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step/s" not in proc.stderr and "it/s" not in proc.stderr  # no progress bar without a TTY
    sweep = tmp_path / "sweep"
    summaries = [json.loads((sweep / str(i) / "summary.json").read_text()) for i in range(4)]
    assert all(s["status"] == "finished" for s in summaries)
    with open(sweep / "leaderboard.csv") as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["best_val_loss"]) for r in rows]
    assert len(rows) == 4 and losses == sorted(losses)
    assert {frozenset(r["overrides"].split()) for r in rows} == {
        frozenset({f"optim.lr={lr}", f"model.n_layer={n}"}) for lr in ("0.001", "0.003") for n in (1, 2)}
    assert (sweep / "val_curves.png").stat().st_size > 1000 and "leaderboard:" in proc.stdout


@pytest.mark.slow
def test_optuna_search_runs_three_trials(tmp_path, data_root):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the optuna extra: pip install -e '.[optuna]'")
    root, data_overrides = data_root
    args = ["-m", "hparams_search=optuna", "hydra.sweeper.n_trials=3", *QUICK, *data_overrides, "train.sample_tokens=0",
            f"hydra.sweep.dir={tmp_path / 'search'}"]
    proc = run_script("train.py", args, tmp_path, root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads((tmp_path / "search" / str(i) / "summary.json").read_text()) for i in range(3)]
    assert all(s["status"] == "finished" for s in summaries)
    assert len({tuple(s["overrides"]) for s in summaries}) == 3  # three different trials
    assert "Best value" in proc.stdout + proc.stderr or (tmp_path / "search" / "optimization_results.yaml").exists()


def test_slurm_launcher_config_composes(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the slurm extra: pip install -e '.[slurm]'")
    from hydra import compose as hydra_compose, initialize_config_dir
    from conftest import REPO

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = hydra_compose("config", overrides=["hydra/launcher=slurm", f"paths.output_dir={tmp_path}"], return_hydra_config=True)
    assert cfg.hydra.launcher.gpus_per_node == 1 and "submitit" in cfg.hydra.launcher._target_
