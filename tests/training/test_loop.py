"""gpt/training/loop.py: exact resume, the public step/evaluate API, and what a run records
(TensorBoard, metrics.jsonl, summary.json).
Run: pytest tests/training/test_loop.py"""

from __future__ import annotations

import io
import json
import os
import signal

import numpy as np
import PIL.Image
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

from gpt.checkpoints import checkpoint, runs
from gpt.errors import TinyGPTError
from gpt.runtime.preemption import Preempted
from gpt.training import Trainer, build_run, train
from gpt.training import step as steps
from helpers import ENGINE_RUN, compose, poison_forward, train_recording_losses

# 30 steps, evals every 10, a loss logged at every step
QUICK = ["debug=tiny", "train.max_iters=10", "train.eval_interval=5"]


@pytest.mark.parametrize("stop_at, accum, optim", [(13, 1, "adamw"), (10, 2, "adamw"), (13, 1, "muon")])
def test_resume_continues_the_exact_trajectory(tmp_path, data_root, stop_at, accum, optim):
    root, data_overrides = data_root
    # dropout: the RNG must resume too; accumulation: the data stream must
    overrides = [
        *ENGINE_RUN,
        *data_overrides,
        f"paths.data_dir={root}",
        "model.dropout=0.1",
        f"train.grad_accum_steps={accum}",
        f"optim={optim}",
    ]
    full = train_recording_losses(compose(overrides, tmp_path / "full"))
    assert sorted(full) == list(range(1, 31))

    first = train_recording_losses(compose(overrides, tmp_path / "split"), stop_after=stop_at)
    assert sorted(first) == list(range(1, stop_at + 1))  # stopped after finishing that step
    assert runs.latest(tmp_path / "split").name == runs.step_file(stop_at)
    rest = train_recording_losses(compose(overrides, tmp_path / "split"))  # same run dir: resume=auto
    assert sorted(rest) == list(range(stop_at + 1, 31))
    assert {**first, **rest} == full  # bitwise: same floats at every step
    a, b = (checkpoint.load(runs.latest(tmp_path / d)) for d in ("full", "split"))
    assert a.best_val_loss == b.best_val_loss
    assert all(torch.equal(a.model[k], b.model[k]) for k in a.model)
    evals = lambda d: [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]  # noqa: E731
    assert [e["step"] for e in evals("split")] == [0, 10, 20, 30]  # no eval repeated or skipped at the resume


def test_a_run_resumed_where_auto_picks_another_dtype_computes_as_it_was_trained(tmp_path, data_root, monkeypatch, caplog):
    """Trained in fp32 (a CPU without bf16: dtype=float32 and fp32 Newton-Schulz stand for it),
    resumed under dtype=auto on a CPU with native bf16 (pretended), where auto would pick bf16 for
    both: the checkpoint's dtypes are kept, so the steps are bitwise the uninterrupted run's."""
    from gpt.runtime import devices

    root, data_overrides = data_root
    base = [*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "optim=muon"]
    fp32 = [*base, "dtype=float32", "optim.ns_dtype=float32"]
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: True)
    full = train_recording_losses(compose(fp32, tmp_path / "full"))
    first = train_recording_losses(compose(fp32, tmp_path / "split"), stop_after=13)
    with caplog.at_level("INFO", logger="tinygpt"):
        rest = train_recording_losses(compose(base, tmp_path / "split"))  # dtype=auto, ns_dtype=auto
    assert {**first, **rest} == full
    assert "notice: dtype float32, the dtype the checkpoint was trained in (dtype=auto here picks bfloat16)" in caplog.text
    assert "Newton-Schulz in float32" in caplog.text
    ckpt = checkpoint.load(runs.latest(tmp_path / "split"))
    assert (ckpt.training.dtype, ckpt.training.ns_dtype, ckpt.training.device_type) == ("float32", "float32", "cpu")


def test_resume_from_another_run_leaves_it_untouched(tmp_path, data_root):
    root, data_overrides = data_root
    overrides = [*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}"]
    train(compose(overrides, tmp_path / "a"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "a" / "checkpoints").iterdir()}
    more = train_recording_losses(compose([*overrides, "train.max_iters=40", f"resume={tmp_path / 'a'}"], tmp_path / "b"))
    assert sorted(more) == list(range(31, 41))
    assert {p.name: p.read_bytes() for p in (tmp_path / "a" / "checkpoints").iterdir()} == before
    assert runs.latest(tmp_path / "b").name == "ckpt-0000040.pt"


def _events(run_dir) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0, "histograms": 0, "images": 0})
    acc.Reload()
    return acc


def test_event_file_holds_scalars_text_hparams_histograms_and_attention(tmp_path, data_root):
    root, data_overrides = data_root
    cfg = compose(
        [
            *QUICK,
            *data_overrides,
            f"paths.data_dir={root}",
            "train.eval_sample_tokens=20",
            "train.histogram_every=1",
            "train.attention_every=2",
        ],
        tmp_path,
    )
    train(cfg, overrides=["train.max_iters=10"])
    acc = _events(tmp_path)
    tags = acc.Tags()
    assert {
        "loss/train",
        "loss/val",
        "loss/train_eval",
        "lr",
        "grad_norm",
        "perf/tokens_per_s",
        "perf/ms_per_step",
        "hparams/best_val_loss",
        "hparams/final_val_loss",
    } <= set(tags["scalars"])
    assert {"config/text_summary", "samples/text_summary", "sample/text_summary"} <= set(tags["tensors"])
    assert [e.step for e in acc.Tensors("samples/text_summary")] == [0, 5, 10]
    # Every eval's weights, and the gradients of the step that ends at it: the last eval's too.
    assert [e.step for e in acc.Histograms("weights/transformer.wte.weight")] == [0, 5, 10]
    assert [e.step for e in acc.Histograms("grads/transformer.wte.weight")] == [5, 10]
    assert {"attention/layer_0"} <= set(tags["images"])
    # Attention maps: each query row scaled to its own maximum, so every row has a white pixel.
    image = acc.Images("attention/layer_0")[-1]
    pixels = np.asarray(PIL.Image.open(io.BytesIO(image.encoded_image_string)).convert("L"), dtype=np.float32)
    T, heads = pixels.shape[0], pixels.shape[1] // pixels.shape[0]
    for h in range(heads):
        assert (pixels[:, h * T : (h + 1) * T].max(axis=1) == 255).all()
    # The hparams live in this run's own event file, with the scores the HParams tab sorts by.
    plugin = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["optim.lr"].number_value == pytest.approx(cfg.optim.lr)
    assert start.hparams["optim.name"].string_value == cfg.optim.name
    assert start.hparams["model.name"].string_value == "gpt-nano"
    end = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/session_end_info"]).session_end_info
    assert api_pb2.Status.Name(end.status) == "STATUS_SUCCESS"  # written at the end, with the run's status
    experiment = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == {"hparams/best_val_loss", "hparams/final_val_loss"}
    best = [e.value for e in acc.Scalars("hparams/best_val_loss")]
    assert best == sorted(best, reverse=True) and len(best) == 3

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 10 and summary["overrides"] == ["train.max_iters=10"]
    assert summary["best_val_loss"] == pytest.approx(best[-1]) and summary["params"] > 0
    assert summary["tokens_seen"] == 10 * 4 * 16 and summary["tokens_per_s"] > 0 and summary["wall_s"] > 0


def _hparams_tab(logdir) -> dict[str, tuple[str, dict]]:
    """What TensorBoard's HParams tab lists for a logdir ({session: (status, hparams)}), through
    the plugin's own code: the server's event multiplexer and the handler behind its
    /data/plugin/hparams/session_groups."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context, list_session_groups

    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    tb = backend_context.Context(base_plugin.TBContext(logdir=str(logdir), data_provider=provider, multiplexer=mux))
    request = api_pb2.ListSessionGroupsRequest(slice_size=100, allowed_statuses=list(api_pb2.Status.values()))
    groups = list_session_groups.Handler(context.RequestContext(), tb, "", request).run().session_groups
    return {s.name: (api_pb2.Status.Name(s.status), dict(g.hparams)) for g in groups for s in g.sessions}


def test_the_hparams_tab_shows_a_resumed_runs_latest_settings_and_its_end(tmp_path, data_root):
    """Each start of a run declares its HParams session again, and TensorBoard keeps the first
    declaration it reads of a run: the tab showed a run's first start (interrupted, its settings
    before a train-on) even after it finished or trained on."""
    root, data_overrides = data_root
    overrides = [*QUICK, *data_overrides, f"paths.data_dir={root}"]

    def tab() -> tuple[str, float]:
        (status, hparams), *others = _hparams_tab(tmp_path).values()
        assert not others
        return status, hparams["train.max_iters"].number_value

    train_recording_losses(compose(overrides, tmp_path), stop_after=3)  # SIGTERM: interrupted
    assert tab() == ("STATUS_UNKNOWN", 10)
    train(compose(overrides, tmp_path))  # resumed, finished
    assert tab() == ("STATUS_SUCCESS", 10)
    train(compose([*overrides, "train.max_iters=15"], tmp_path))  # trained on
    assert tab() == ("STATUS_SUCCESS", 15)


def test_failed_run_leaves_a_failed_summary(tmp_path, data_root, monkeypatch):
    root, data_overrides = data_root

    def explode(*args, **kwargs):
        raise TinyGPTError("simulated failure")

    monkeypatch.setattr(steps, "apply_or_skip", explode)
    with pytest.raises(TinyGPTError):
        train(compose([*QUICK, *data_overrides, f"paths.data_dir={root}"], tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "simulated failure"
    assert summary["best_val_loss"] is not None  # the step-0 eval had happened
    assert summary["pid"] == os.getpid() and summary["heartbeat"] > 0  # who wrote it, and when
    plugin = _events(tmp_path).PluginTagToContent("hparams")
    end = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/session_end_info"]).session_end_info
    assert api_pb2.Status.Name(end.status) == "STATUS_FAILURE"  # TensorBoard shows the failure too


def test_a_run_cut_short_by_a_peer_that_exited_says_so_in_its_summary(tmp_path, data_root, monkeypatch):
    """Under torchrun, a collective fails when another process has gone (gloo's words): that is
    the other process's failure, which the summary names, beside gloo's line."""
    root, data_overrides = data_root

    def gone(*args, **kwargs):
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:41386: Connection reset by peer")

    monkeypatch.setattr(steps, "apply_or_skip", gone)
    with pytest.raises(RuntimeError):
        train(compose([*QUICK, *data_overrides, f"paths.data_dir={root}"], tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"].startswith("another process of this run exited (RuntimeError: [../gloo")


def test_public_step_and_evaluate_api(tmp_path, data_root):
    """What benchmarks and notebooks drive: build a run, take steps, evaluate, save."""
    root, data_overrides = data_root
    run = build_run(compose([*QUICK, *data_overrides, f"paths.data_dir={root}"], tmp_path))
    trainer = Trainer(run)
    first = trainer.evaluate()
    losses = [trainer.step()[0].item() for _ in range(5)]
    assert run.progress.step == 5 and all(loss > 0 for loss in losses)
    after = trainer.evaluate()
    assert set(after) == {"train", "val"} and after["val"] < first["val"]
    path = trainer.save()
    assert path == tmp_path / "checkpoints" / "ckpt-0000005.pt" and checkpoint.load(path).training is not None
    assert not (tmp_path / "summary.json").exists()  # records belong to fit()


def test_training_samples_decode_in_fp32_on_a_cpu_that_trains_in_bf16(tmp_path, data_root, monkeypatch):
    """The samples a run shows are decoded as sample.py decodes on a CPU: fp32, no autocast, even
    where the steps train under bf16 autocast (faster there, docs/performance.md); on the device
    the run computes on, named (not the weights', which CPU offload keeps in host memory)."""

    root, data_overrides = data_root
    run = build_run(compose([*QUICK, *data_overrides, f"paths.data_dir={root}", "dtype=bfloat16"], tmp_path))
    assert run.rt.dtype == torch.bfloat16  # the steps' autocast
    seen = []

    def generate(model, *args, device=None, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), device))
        return [["text"]]

    monkeypatch.setattr("gpt.generation.generate", generate)  # the loop imports it as it samples
    assert Trainer(run).sample(8) == "text"
    # and on the run's device, named: under FSDP2's CPU offload the weights are not there
    assert seen == [(False, run.rt.device)]


def test_rerunning_a_finished_run_keeps_its_record(tmp_path, data_root):
    """The same command again (resume=auto) finds nothing left to train: it returns and keeps
    the run's figures instead of an empty record."""
    root, data_overrides = data_root
    overrides = [*QUICK, *data_overrides, f"paths.data_dir={root}", "train.sample_tokens=0"]
    first = train(compose(overrides, tmp_path))
    again = train(compose(overrides, tmp_path))
    for key in ("best_val_loss", "final_val_loss", "step", "tokens_seen", "run_dir"):
        assert again[key] == first[key], key
    assert again["status"] == "finished" and json.loads((tmp_path / "summary.json").read_text()) == again


def test_a_resumed_run_reports_the_figures_its_checkpoint_holds(tmp_path, data_root):
    """summary.json may be ahead of the checkpoint a run resumes from (a kill -9 after the eval's
    summary, before its checkpoint) or gone: the figures come from the checkpoint."""
    root, data_overrides = data_root
    overrides = [*QUICK, *data_overrides, f"paths.data_dir={root}", "train.sample_tokens=0", "threads=1"]
    first = train(compose(overrides, tmp_path))
    (tmp_path / "summary.json").unlink()
    again = train(compose(overrides, tmp_path))
    for key in ("best_val_loss", "final_val_loss", "step", "tokens_seen"):
        assert again[key] == first[key], key


def test_tokens_seen_count_each_step_as_it_was_trained_across_resumes(tmp_path, data_root):
    """A resume may train with another number of tokens a step (another world size under
    torchrun, or batch size): summary.json's tokens_seen and flops add each stretch's own, not
    the last step count times the last run's tokens a step. A checkpoint from before they were
    counted resumes from step x that run's tokens a step, as it reported them."""
    root, data_overrides = data_root
    overrides = [*QUICK, *data_overrides, f"paths.data_dir={root}", "train.sample_tokens=0"]
    first = train(compose(overrides, tmp_path / "run"))
    per_step = first["tokens_seen"] // 10
    assert first["tokens_seen"] == 10 * per_step and first["flops"] == first["tokens_seen"] * first["flops_per_token"]
    bigger = [*overrides, "train.max_iters=20", f"train.batch_size={2 * compose(overrides).train.batch_size}"]
    second = train(compose(bigger, tmp_path / "run"))
    assert second["step"] == 20 and second["tokens_seen"] == 10 * per_step + 10 * 2 * per_step
    assert second["flops"] == second["tokens_seen"] * second["flops_per_token"]

    older = checkpoint.load(runs.latest(tmp_path / "run"))
    older.training.tokens_seen = None  # as a checkpoint of an earlier tinygpt reads
    checkpoint.save(tmp_path / "run" / "checkpoints" / runs.step_file(20), older)
    third = train(compose([*bigger, "train.max_iters=25"], tmp_path / "run"))
    assert third["tokens_seen"] == 20 * 2 * per_step + 5 * 2 * per_step


def test_a_signal_during_set_up_stops_cleanly_and_leaves_the_run_as_it_was(tmp_path, data_root, monkeypatch):
    """SIGTERM while the run is being built (data preparation, model): no step to finish, nothing
    unsaved: `Preempted` at once (the command exits 0 with its resume line), the earlier summary
    and checkpoints as they were."""
    import os

    import gpt.training as training
    from gpt.runtime.preemption import Preempted

    root, data_overrides = data_root
    overrides = [*QUICK, *data_overrides, f"paths.data_dir={root}", "train.sample_tokens=0", "threads=1"]
    train(compose(overrides, tmp_path))
    before = {p.name: p.read_bytes() for p in [tmp_path / "summary.json", *runs.step_checkpoints(tmp_path)]}
    real = training.build_run

    def build_run_then_sigterm(cfg, *args):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(cfg, *args)

    monkeypatch.setattr(training, "build_run", build_run_then_sigterm)
    with pytest.raises(Preempted, match="SIGTERM received outside the training loop"):
        train(compose([*overrides, "train.max_iters=20"], tmp_path))
    assert {p.name: p.read_bytes() for p in [tmp_path / "summary.json", *runs.step_checkpoints(tmp_path)]} == before
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


ARC_ITEMS = [
    {"id": "1", "question": "Which is a bird?", "choices": {"text": ["crow", "stone"], "label": ["A", "B"]}, "answerKey": "A"},
    {
        "id": "2",
        "question": "What falls?",
        "choices": {"text": ["rain", "up", "sky"], "label": ["A", "B", "C"]},
        "answerKey": "A",
    },
    {"id": "3", "question": "Who rules?", "choices": {"text": ["the king", "a fish"], "label": ["A", "B"]}, "answerKey": "A"},
]


def test_eval_tasks_are_scored_at_every_eval_and_recorded(tmp_path, data_root, monkeypatch):
    """train.eval_tasks: the task's figures at each eval in TensorBoard (also as HParams
    metrics), metrics.jsonl and summary.json, equal to scoring the final model afresh; the model
    trains on in training mode afterwards."""
    from gpt.evals.tasks import TaskSettings, evaluate_task, examples

    root, data_overrides = data_root
    monkeypatch.setenv("TINYGPT_DATA_DIR", str(tmp_path / "root"))  # a data root of its own: the task copy goes there
    (tmp_path / "root" / "tasks").mkdir(parents=True)
    (tmp_path / "root" / "tasks" / "arc_easy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ARC_ITEMS))
    for entry in root.iterdir():  # the prepared data, linked
        (tmp_path / "root" / entry.name).symlink_to(entry)
    out = tmp_path / "run"
    run = build_run(compose([*QUICK, *data_overrides, "train.eval_tasks=[arc_easy]", "train.eval_task_limit=2"], out))
    assert [len(items) for items in run.tasks.values()] == [2]  # the first eval_task_limit items
    modes = []
    Trainer(run).fit(on_eval=lambda step, losses: modes.append(run.model.training))
    assert modes == [True, True, True]
    summary = json.loads((out / "summary.json").read_text())
    items = examples(TaskSettings("arc_easy", limit=2), tmp_path / "root")
    fresh = evaluate_task(run.model, run.data.tokenizer, "arc_easy", items, torch.device("cpu"))
    assert summary["tasks"] == {"arc_easy": {"acc": fresh["acc"], "acc_norm": fresh["acc_norm"], "step": 10}}
    acc = _events(out)
    assert [e.step for e in acc.Scalars("tasks/arc_easy/acc_norm")] == [0, 5, 10]
    assert acc.Scalars("tasks/arc_easy/acc")[-1].value == pytest.approx(fresh["acc"])
    plugin = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/experiment"]).experiment
    assert {"tasks/arc_easy/acc", "tasks/arc_easy/acc_norm"} <= {m.name.tag for m in experiment.metric_infos}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "tasks"] == [0, 5, 10]


def test_eval_tasks_that_cannot_be_had_fail_before_training(tmp_path, data_root, monkeypatch):
    root, data_overrides = data_root
    with pytest.raises(TinyGPTError, match="task='hellaswa' is unknown"):  # checked by build_run, before the data
        build_run(
            compose([*QUICK, *data_overrides, "paths.data_dir=/nonexistent", "train.eval_tasks=[hellaswa]"], tmp_path / "a")
        )
    with pytest.raises(TinyGPTError, match="train.eval_tasks must be a list of strings, e.g. \\[a, b\\]"):
        compose([*QUICK, *data_overrides, "train.eval_tasks=hellaswag"], tmp_path / "a")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(TinyGPTError, match="task lambada: cannot reach Hub dataset EleutherAI/lambada_openai"):
        build_run(compose([*QUICK, *data_overrides, f"paths.data_dir={root}", "train.eval_tasks=[lambada]"], tmp_path / "b"))
    assert not (tmp_path / "b" / "checkpoints").exists()


def test_an_eval_that_is_not_saved_is_not_recorded_as_the_best(tmp_path, data_root, monkeypatch):
    """One non-finite step right before the last eval: that eval's state is not saved (item 13's
    rule), so its val loss must not become the run's best either: summary.json's best is what
    best.pt holds."""
    root, data_overrides = data_root
    poison_forward(monkeypatch, {20})
    train(compose([*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "train.max_iters=20"], tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    best = checkpoint.load(tmp_path / "checkpoints" / "best.pt")
    assert best.step == 10 and summary["best_val_loss"] == pytest.approx(best.best_val_loss)
    assert summary["final_val_loss"] < best.best_val_loss  # the eval at 20 was better, and is reported as the last


def test_a_run_shorter_than_the_log_interval_reports_its_speed(tmp_path, data_root):
    root, data_overrides = data_root
    overrides = [*QUICK, *data_overrides, f"paths.data_dir={root}", "train.max_iters=3", "train.log_interval=10"]
    summary = train(compose([*overrides, "train.sample_tokens=0"], tmp_path))
    assert summary["step"] == 3 and summary["tokens_per_s"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["tokens_per_s"] == summary["tokens_per_s"]


def test_a_stop_right_after_an_eval_saves_once(tmp_path, data_root, monkeypatch):
    """SIGTERM in the step before an eval: the eval saves that step, and the stop does not save
    it a second time (a preemption's grace period is short); nor does a stop before the first
    step of a resumed run rewrite the checkpoint it resumed from."""
    from gpt.runtime.preemption import StopRequest
    from gpt.training import saving

    root, data_overrides = data_root
    saved = []
    real = saving.save
    monkeypatch.setattr(saving, "save", lambda run, *a, **k: (saved.append(run.progress.step), real(run, *a, **k))[1])
    overrides = [*QUICK, *data_overrides, f"paths.data_dir={root}", "train.sample_tokens=0", "threads=1"]
    train_recording_losses(compose(overrides, tmp_path), stop_after=5)
    assert saved == [5] and runs.latest(tmp_path).name == runs.step_file(5)
    saved.clear()
    stop = StopRequest(log=lambda *a: None)
    stop.request("SIGTERM")  # as a signal kept through a distributed run's set-up
    with pytest.raises(Preempted):
        Trainer(build_run(compose(overrides, tmp_path))).fit(stop=stop)
    assert saved == []  # ckpt-5, where it resumed from, is not written again


def test_small_eval_batches_go_through_one_pass_together_with_the_same_means(tmp_path, data_root, monkeypatch):
    """An eval's small batches of text are concatenated, up to EVAL_PASS_TOKENS tokens and a
    divisor of train.eval_iters, into fewer forward passes (the quickstart's 50 in 10 passes of
    5): the same batches, so the same means as one pass each; conversations go one by one."""
    from gpt.training import build as state

    root, data_overrides = data_root
    run = build_run(compose([*QUICK, *data_overrides, f"paths.data_dir={root}", "train.eval_iters=6"], tmp_path))
    trainer = Trainer(run)
    passes = []
    run.eval_model.register_forward_pre_hook(lambda module, args: passes.append(args[0].shape))
    rows, block = run.cfg.train.batch_size, run.model_config.block_size
    monkeypatch.setattr(state, "EVAL_PASS_TOKENS", 4 * rows * block)  # room for 4; 3 divides 6
    grouped = trainer.evaluate()
    assert run.eval_group(6) == 3 and passes == [(3 * rows, block)] * 4  # 2 passes a split
    passes.clear()
    monkeypatch.setattr(state, "EVAL_PASS_TOKENS", rows * block)  # room for one: a pass each
    single = trainer.evaluate()
    assert run.eval_group(6) == 1 and passes == [(rows, block)] * 12
    assert all(abs(grouped[s] - single[s]) < 1e-5 for s in ("train", "val")), (grouped, single)
    monkeypatch.setattr(run.data, "kind", "chat")  # conversations: of other widths, one at a time
    assert run.eval_group(6) == 1
