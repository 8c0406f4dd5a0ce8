"""train.py and sample.py as a user runs them (subprocesses), and the one-line errors for user
mistakes. Run: pytest tests/test_entrypoints.py"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TINY_RUN, run_script
from gpt import checkpoint


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, data_root):
    """One tiny training run shared by the tests below: (working dir, run dir, stdout)."""
    root, data_overrides = data_root
    cwd = tmp_path_factory.mktemp("work")
    proc = run_script("train.py", [*TINY_RUN, *data_overrides], cwd, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((cwd / "outputs" / "runs").iterdir())
    assert len(runs) == 1
    return cwd, runs[0], proc.stdout


def _assert_one_line_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_train_writes_checkpoints_logs_and_events(trained_run):
    cwd, run_dir, stdout = trained_run
    assert "best val loss" in stdout and "python sample.py run_dir=" in stdout
    assert "device cpu" in stdout and "dtype float32" in stdout
    assert (run_dir / "train.log").read_text().count("eval step") == 3  # steps 0, 10, 20
    names = sorted(p.name for p in (run_dir / checkpoint.CKPT_DIR).iterdir())
    assert names == ["best.pt", "ckpt-0000010.pt", "ckpt-0000020.pt"]
    for name in names:
        ckpt = checkpoint.load(run_dir / checkpoint.CKPT_DIR / name)
        assert ckpt["tokenizer"]["kind"] == "char" and ckpt["model_config"]["n_embd"] == 16
    last = checkpoint.load(checkpoint.latest(run_dir))
    assert last["step"] == 20 and {"optimizer", "rng", "loader", "scaler"} <= set(last)
    assert "optimizer" not in checkpoint.load(run_dir / checkpoint.CKPT_DIR / "best.pt")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 10, 20]
    assert [r["step"] for r in records if r["kind"] == "train"] == [5, 10, 15, 20]

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"loss/train", "loss/val", "loss/train_eval", "lr", "perf/tokens_per_s"} <= scalars
    assert [e.step for e in events.Scalars("loss/val")] == [0, 10, 20]
    assert {"config/text_summary", "sample/text_summary"} <= set(events.Tags()["tensors"])


def test_sample_from_latest_run_and_from_run_dir(trained_run, data_root):
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    latest = run_script("sample.py", ["num_samples=2", "max_new_tokens=40", "prompt=ROMEO:"], cwd, root)
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout.count("---------- sample") == 2 and latest.stdout.count("ROMEO:") == 2
    assert f"{run_dir.name}/checkpoints/best.pt" in latest.stderr

    again = run_script("sample.py", [f"run_dir={run_dir}", "num_samples=2", "max_new_tokens=40", "prompt=ROMEO:"], cwd, root)
    assert again.returncode == 0 and again.stdout == latest.stdout  # same seed, same text

    prompt = cwd / "prompt.txt"
    prompt.write_text("JULIET:\n")
    from_file = run_script("sample.py", [f"ckpt={run_dir}/checkpoints/ckpt-0000020.pt", f"prompt_file={prompt}", "num_samples=1", "max_new_tokens=20"], cwd, root)
    assert from_file.returncode == 0 and "JULIET:\n" in from_file.stdout
    assert not (cwd / "sample.log").exists() and not (cwd / ".hydra").exists()  # sampling writes nothing


def test_sample_from_stdin_batch_file_stop_strings_and_jsonl(trained_run, data_root):
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    piped = run_script("sample.py", ["prompt=-", "num_samples=1", "max_new_tokens=30", "temperature=0"], cwd, root, stdin="KING:\n")
    assert piped.returncode == 0 and "KING:\n" in piped.stdout

    prompts = cwd / "prompts.jsonl"
    prompts.write_text('"ROMEO:"\n{"prompt": "JULIET: O"}\n')
    out = cwd / "samples.jsonl"
    args = [f"prompt_file={prompts}", "num_samples=2", "max_new_tokens=30", "stream=false", f"out_file={out}"]
    batched = run_script("sample.py", args, cwd, root)
    assert batched.returncode == 0, batched.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["prompt"], r["sample"]) for r in records] == [("ROMEO:", 0), ("ROMEO:", 1), ("JULIET: O", 0), ("JULIET: O", 1)]
    assert all(len(r["text"]) == 30 and r["settings"]["max_new_tokens"] == 30 for r in records)
    streamed = run_script("sample.py", args[:-2], cwd, root)  # streaming, one at a time: same text
    assert all(r["prompt"] + r["text"] in streamed.stdout for r in records)

    stop = records[0]["text"][10:12]
    cut = run_script("sample.py", [f"prompt_file={prompts}", "num_samples=1", "max_new_tokens=30", f"stop=[{json.dumps(stop)}]"], cwd, root)
    assert cut.returncode == 0, cut.stderr
    first = cut.stdout.split("----------\n", 1)[1].split("\n---------- sample 2", 1)[0]
    assert first == "ROMEO:" + records[0]["text"][: records[0]["text"].index(stop)]


def test_user_mistakes_get_one_line_errors_and_earlier_runs_survive(trained_run, data_root, tmp_path):
    cwd, run_dir, _ = trained_run
    root, data_overrides = data_root
    before = _snapshot(cwd / "outputs")

    cases = [
        ("train.py", ["model.n_embd=30", "model.n_head=4"], ["n_embd=30", "n_head=4", "multiple"]),
        ("train.py", ["model=gpt5"], ["unknown model config 'gpt5'", "gpt-micro"]),
        ("train.py", [*TINY_RUN, *data_overrides, "model.block_size=200000"], ["block_size=200000", "val split"]),
        ("sample.py", ["prompt=Ωmega"], ["'Ω'", "vocabulary"]),
        ("sample.py", ["ckpt=nowhere/best.pt"], ["nowhere/best.pt", "does not exist"]),
        ("sample.py", ["temperature=-1"], ["temperature"]),
        ("train.py", [f"hydra.run.dir={run_dir}", "resume=false", *TINY_RUN, *data_overrides], ["already holds a run", "resume=false"]),
        ("train.py", ["optim.lr=fast"], ["optim.lr must be a number", "'fast'"]),
        ("train.py", ["compile=maybe"], ["compile=", "true"]),
        ("train.py", ["train.max_iter=20"], ["unknown setting 'train.max_iter'", "--cfg job"]),
        ("train.py", ["experiment=shakespeare_char", "optim.muon_lr=0.05"], ["optim.muon_lr is a Muon setting", "add optim=muon"]),
        ("sample.py", ["top_p=1.5"], ["top_p must be in (0, 1]"]),
    ]
    for script, args, needles in cases:
        _assert_one_line_error(run_script(script, args, cwd, root), *needles)
    after = _snapshot(cwd / "outputs")
    # A failed run may leave a new run directory holding its log; no earlier file changes.
    assert {k: after.get(k) for k in before} == before


def test_sample_without_any_run(tmp_path, data_root):
    root, _ = data_root
    _assert_one_line_error(run_script("sample.py", [], tmp_path, root), "no trained run found", "python train.py")


def test_no_network_and_no_local_copy(tmp_path):
    empty = tmp_path / "empty-data"
    proc = run_script("train.py", [*TINY_RUN, "data.source.url=http://127.0.0.1:9/input.txt"], tmp_path, empty)
    _assert_one_line_error(proc, "could not download", str(empty / "tinyshakespeare" / "input.txt"), "TINYGPT_DATA_DIR")
    assert not any(p.is_file() for p in empty.rglob("*"))


def test_smoke_shakespeare_char_experiment(tmp_path, data_root):
    root, data_overrides = data_root
    args = ["experiment=shakespeare_char", "train.max_iters=3", "train.eval_iters=1", "train.eval_interval=3",
            "train.batch_size=2", "train.sample_tokens=5", *data_overrides]
    proc = run_script("train.py", args, tmp_path, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "6L 6H 384D block 256" in proc.stdout
