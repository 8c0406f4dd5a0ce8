"""The first GPU run, measured in one go (benchmarks/device.sh runs this on the device machine):

    python benchmarks/device.py --out DIR                        # the default run: at most 280 s of parts
    python benchmarks/device.py --out DIR --device cpu --smoke   # the plumbing, tiny sizes (~1 min on 2 cores)

(a) cuda tests: `python -m pytest -m cuda` (the tests that need a GPU).
(b) training throughput of the 124M shape through the real training step (build_run ->
    Trainer.step: forward, backward, clip, update, the non-finite guard) with
    experiment=gpt2_124m's settings (bf16, micro-batch 16 x 1024), AdamW and Muon compiled, after
    warm-up steps, dynamo's graph breaks and recompiles counted (TORCH_LOGS); then
    experiment=speedrun_124m's recipe compiled cold (its first step is the compile time); then
    AdamW eager once.
    Tiny Shakespeare's characters stand in for FineWeb-Edu (speed does not depend on the text;
    model.vocab_size=50257 keeps GPT-2's LM head). tokens/s, MFU against the peak in
    gpt/runtime/devices.py, peak memory (torch.cuda.max_memory_allocated).
(c) the baby GPT: `python train.py experiment=shakespeare_char device=cuda ...` until its first
    eval with val <= 1.47 (read from the run's metrics.jsonl), then stopped (SIGTERM: a clean
    stop); the step, the run's elapsed seconds at that eval, the wall time, peak memory.
(d) generation tokens/s of the 124M shape (random weights, bf16 autocast, sample.py's sampling
    defaults) at batch 1 and 8, with and without the KV cache; time to the first token; peak memory.
(e) peak memory of each of the above, in one table.
(f) distributed=fsdp on the GPU: the 124M shape for 20 steps in one process, then the same under
    `torchrun --nproc_per_node=1` with distributed=fsdp (FSDP2's bf16 mixed precision over NCCL),
    with cpu_offload=true, and with Muon; the losses side by side, ms/step and peak memory; then
    sample.py on the FSDP run's sharded checkpoint. One GPU, so world size 1: the sharding code,
    the mixed-precision policy, the offload and DCP on CUDA run; splitting over GPUs does not.

(c) and (f) run only when asked for (--parts); the default is (a), (b), (d) and (e).

Every part runs in its own process with a time cap (CAPS), none past --budget seconds from the
start, so one that fails, runs out of memory or hangs is recorded and the next one runs; what
the budget leaves no time for is skipped and listed. The report is written at the start and
rewritten after each part; a SIGTERM stops the part running and writes what ran: DIR/device_report.md (tables, every exact command) and
DIR/device_report.json (every figure); the parts' output goes to DIR/device_log.txt. `--smoke`
runs the same plumbing on tiny shapes for a couple of steps and skips what only a GPU makes
worthwhile (compiling); tests/test_device_script.py runs it. The child modes
(`python benchmarks/device.py child ...`) are the parts themselves.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the device machine runs the checkout, uninstalled

BABY_TARGET = 1.47  # nanoGPT's baby GPT reaches val ~1.47 on one A100 (its README's figure)
GIB = 2**30

# Each part's time cap in seconds (full run), within the 280 s default budget: with device.sh's
# set-up and the parent's start the whole stays under 5 minutes, and a rerun fits in the device
# time a task is lent (15 minutes, the machine's start included). The parts run in order of
# importance: the CUDA tests, the compiled training steps (the first compiles the 124M model
# cold; the second finds Inductor's caches warm), the speedrun recipe's cold compile, the
# generation, one eager run. What does not fit what is left of the budget is skipped and listed
# in the report; (f) FSDP2 and (c) the baby GPT run only when asked for (--parts / PARTS=).
CAPS = {
    "cuda_tests": 35,
    "compile_cold": 70,
    "compile_on": 40,
    "speedrun": 85,
    "compile_off": 20,
    "generation": 30,
    "fsdp": 150,
    "baby_gpt": 160,
}
MIN_S = 15  # less than this left of the budget: a part is skipped, not started to be cut off
PARTS = ("cuda_tests", "throughput", "generation", "fsdp", "baby_gpt")  # --parts: some of these
DEFAULT_PARTS = ("cuda_tests", "throughput", "generation")
GRACE = {"timeout": 5, "baby_gpt": 15}  # seconds between SIGTERM and SIGKILL
# The tiny shape of --smoke: every code path, seconds on a CPU.
TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "train.batch_size=2"]


# --- the parent: runs each part in a child process, writes the report ----------------------------


class Interrupted(Exception):
    """SIGTERM to the parent (the device tool's timeout, a user's kill): the part running is
    stopped and the report written with what ran."""


class Report:
    def __init__(self, out: Path, mode: str, device: str, budget: float):
        self.out, self.t0 = out, time.monotonic()
        self.running: str | None = None  # the label of the child running now
        self.data = {
            "mode": mode,
            "device": device,
            "budget_s": budget,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "env": environment(device),
            "parts": {},
            "not_run": [],  # (what, why): skipped for the budget, left out by --parts, or stopped
        }
        self.log = open(out / "device_log.txt", "a", encoding="utf-8")

    def part(self, name: str, record: dict) -> None:
        self.data["parts"][name] = record
        self.write()

    def not_run(self, what: str, why: str) -> None:
        self.data["not_run"].append({"what": what, "why": why})
        self.write()

    def write(self) -> None:
        """The report as it stands, both files replaced atomically: a run cut off at any point
        leaves the last one whole."""
        self.data["seconds"] = round(time.monotonic() - self.t0, 1)
        write_atomic(self.out / "device_report.json", json.dumps(self.data, indent=2, default=str))
        write_atomic(self.out / "device_report.md", markdown(self.data))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def environment(device: str) -> dict:
    """What ran: versions, the GPU, the peak used for MFU, how device.sh set up the packages."""
    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    for name in ("torch", "hydra", "omegaconf", "datasets", "tiktoken", "numpy"):
        try:
            module = __import__(name)
            env[name] = getattr(module, "__version__", "?")
        except Exception as e:  # noqa: BLE001 (a missing package is a finding, not a crash)
            env[name] = f"missing: {type(e).__name__}: {e}"
    try:
        import gpt

        env["tinygpt"] = f"{gpt.__version__} from {Path(gpt.__file__).parent}"  # the checkout's, installed or not
    except Exception as e:  # noqa: BLE001
        env["tinygpt"] = f"missing: {type(e).__name__}: {e}"
    try:
        import torch

        from gpt.runtime import devices

        env["cuda_available"] = torch.cuda.is_available()
        env["torch_cuda"] = torch.version.cuda
        if device == "cuda" and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env["gpu"] = props.name
            env["gpu_memory_gib"] = round(props.total_memory / GIB, 1)
            env["capability"] = f"{props.major}.{props.minor}"
            env["peak_flops"] = devices.peak_flops(torch.device("cuda"))
    except Exception as e:  # noqa: BLE001
        env["torch_error"] = f"{type(e).__name__}: {e}"
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
        )
        env["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        env["nvidia_smi"] = f"unavailable: {e}"
    setup = os.environ.get("DEVICE_SETUP")  # device.sh: what it installed, or why not
    if setup:
        env["setup"] = setup
    return env


def run_child(
    report: Report, label: str, argv: list[str], cap: float, watch=None, grace: float = GRACE["timeout"], env_extra=None
) -> dict:
    """Run one part in its own process group (compile workers included) for at most `cap`
    seconds; its output goes to the log. `watch(proc)` is polled every 2 s and may return a
    reason to stop the part early (SIGTERM, then SIGKILL after a grace). Returns rc, seconds, the
    end of its output and whether it timed out or was stopped. A SIGTERM to this process
    (Interrupted) ends the child's group first."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        **(env_extra or {}),
    }
    report.log.write(f"\n===== {label}: {' '.join(argv)} (cap {cap:.0f} s)\n")
    report.log.flush()
    t0 = time.monotonic()
    report.running = label
    with tempfile.TemporaryFile("w+", encoding="utf-8") as output:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out, stopped = False, None
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > cap:
                    timed_out = True
                    _end(proc, grace)
                    break
                if watch is not None and stopped is None:
                    stopped = watch(proc)
                    if stopped:
                        _end(proc, grace=GRACE["baby_gpt"])
                        break
                time.sleep(0.5 if watch is None else 2.0)
        except Interrupted:
            _end(proc, grace=2)
            _end_group(proc)
            output.seek(0)
            report.log.write(output.read() + f"\n===== {label}: stopped by SIGTERM after {time.monotonic() - t0:.1f} s\n")
            report.log.flush()
            raise
        proc.wait()
        _end_group(proc)
        output.seek(0)
        text = output.read()
    report.running = None
    report.log.write(text)
    report.log.write(f"\n===== {label}: rc {proc.returncode}, {time.monotonic() - t0:.1f} s\n")
    report.log.flush()
    return {
        "rc": proc.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "timed_out": timed_out,
        "stopped": stopped,
        "tail": text[-1500:],
        "graph_breaks": text.count("Graph break"),  # TORCH_LOGS=graph_breaks,recompiles: one record each
        "recompiles": text.count("Recompiling function"),
    }


def _end(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the child's process group (a clean stop for training), SIGKILL after `grace`."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _end_group(proc: subprocess.Popen) -> None:
    """Whatever the child left running in its group (compile workers) goes with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def status_of(run: dict, result: dict | None) -> str:
    if result is not None and result.get("status"):
        return result["status"]
    if run["timed_out"]:
        return "timeout"
    return "ok" if run["rc"] == 0 and result is not None else "failed"


def child_argv(mode: str, *args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "child", mode, *args]


def part_cuda_tests(report: Report, smoke: bool, cap: float) -> None:
    """`pytest -m cuda` over the test files that use the marker (collecting all ~900 tests would
    spend the part's cap on imports); --continue-on-collection-errors: a module whose optional
    package the image lacks (fastapi, selenium, ...) must not stop the others."""
    files = sorted(
        p.relative_to(REPO).as_posix()
        for p in (REPO / "tests").rglob("test_*.py")
        if "mark.cuda" in p.read_text(encoding="utf-8")
    )
    record = {"files": files, "marker_registered": cuda_marker_registered()}
    if smoke and not files:  # the plumbing still runs: one quick file, nothing selected
        files = ["tests/test_gpu_recipes.py"]
    shown = " ".join(["python -m pytest -m cuda -q -rs --continue-on-collection-errors", *files])
    record["command"] = shown
    if not files:
        record["status"] = "no test file uses the cuda marker: nothing to run"
        report.part("cuda_tests", record)
        return
    run = run_child(report, "cuda tests", [sys.executable, *shown.split()[1:], "-p", "no:cacheprovider"], cap)
    lines = [line for line in run["tail"].strip().splitlines() if line.strip()]
    status = "timeout" if run["timed_out"] else {0: "ok", 5: "no tests selected"}.get(run["rc"], "failed")
    if "Unknown marker" in run["tail"]:
        status = "failed: the cuda marker is not registered in pyproject.toml"
    record.update(
        status=status, rc=run["rc"], seconds=run["seconds"], summary=lines[-1] if lines else "", tail=run["tail"][-800:]
    )
    report.part("cuda_tests", record)


def cuda_marker_registered() -> bool | None:
    """Whether pyproject.toml registers the `cuda` marker (with --strict-markers, `-m cuda` fails without it)."""
    try:
        import tomllib

        markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    except (ImportError, OSError, KeyError, ValueError):
        return None
    return any(m.split(":")[0].strip() == "cuda" for m in markers)


def throughput_configs(smoke: bool) -> list[dict]:
    """(recipe, optimizer, compile) of each timed run, its turn and its cap: "compiled" runs
    right after the CUDA tests (AdamW compiling cold, then Muon), "speedrun" (the speedrun
    recipe compiling cold: its first step is the compile time) after them, "eager" (once, for
    the compile's speed-up) last."""
    configs = [
        {"recipe": "gpt2_124m", "optim": "adamw", "compile": "true", "turn": "compiled", "cap": "compile_cold"},
        {"recipe": "gpt2_124m", "optim": "muon", "compile": "true", "turn": "compiled", "cap": "compile_on"},
        {"recipe": "speedrun_124m", "optim": "muon", "compile": "true", "turn": "speedrun", "cap": "speedrun"},
        {"recipe": "gpt2_124m", "optim": "adamw", "compile": "false", "turn": "eager", "cap": "compile_off"},
    ]
    if smoke:  # compiling on a CPU takes minutes: the smoke run checks the plumbing of the rest
        for c in configs[:2]:
            c["skip"] = "smoke: compile=true is left to the GPU run"
        configs[2]["compile"] = "false"
    return configs


def part_throughput(report: Report, args, deadline: float, turn: str) -> None:
    key = "throughput"
    record = report.data["parts"].get(key) or {
        "status": "ok",
        "runs": [],
        "note": "character data standing in for FineWeb-Edu; model.vocab_size=50257 keeps GPT-2's LM head",
    }
    scale = 2.0 if args.smoke else 1.0
    for c in throughput_configs(args.smoke):
        if c["turn"] != turn:
            continue
        name = f"{c['recipe']} {c['optim']} compile={c['compile']}"
        row = {"name": name, **{k: c[k] for k in ("recipe", "optim", "compile")}}
        left = deadline - time.monotonic()
        cap = min(CAPS[c["cap"]] * scale, left)
        if c.get("skip"):
            row["status"] = "skipped: " + c["skip"]
        elif left < MIN_S:
            row["status"] = f"skipped: out of budget ({max(left, 0):.0f} s left)"
            report.not_run(f"(b) {name}", row["status"].removeprefix("skipped: "))
        else:
            # dynamo's own account of the graphs: each graph break and recompile logged once
            logs = {"TORCH_LOGS": "graph_breaks,recompiles"} if c["compile"] == "true" else {}
            with tempfile.TemporaryDirectory(prefix="tinygpt-device-") as tmp:
                if logs and c["cap"] in ("compile_cold", "speedrun"):  # cold: an empty Inductor cache of its own
                    logs["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")
                result_file = Path(tmp) / "result.json"
                shown = [
                    *("--recipe", c["recipe"], "--optim", c["optim"], "--compile", c["compile"]),
                    *("--device", args.device, "--warmup", str(args.warmup), "--steps", str(args.steps)),
                    *("--accum", str(args.accum), *(["--smoke"] if args.smoke else [])),
                ]
                argv = child_argv("throughput", *shown, "--result", str(result_file), "--runs-dir", tmp)
                run = run_child(report, f"throughput {name}", argv, cap, env_extra=logs)
                result = json.loads(result_file.read_text()) if result_file.exists() else None
            row.update(result or {})
            row["status"] = status_of(run, result)
            prefix = "TORCH_LOGS=graph_breaks,recompiles " if logs else ""
            prefix += "TORCHINDUCTOR_CACHE_DIR=<empty> " if "TORCHINDUCTOR_CACHE_DIR" in logs else ""
            row["command"] = prefix + " ".join(["python benchmarks/device.py child throughput", *shown])
            row["seconds"] = run["seconds"]
            if logs:
                row["graph_breaks"], row["recompiles"] = run["graph_breaks"], run["recompiles"]
            if row["status"] == "timeout":
                row["error"] = f"timed out after its {cap:.0f} s cap; the output ended: " + run["tail"][-500:]
            elif row["status"] != "ok":
                row["error"] = run["tail"][-600:]
        record["runs"].append(row)
        record["status"] = "ok" if any(r["status"] == "ok" for r in record["runs"]) else "failed"
        report.part(key, record)


def baby_overrides(device: str, smoke: bool, run_dir: Path) -> list[str]:
    """nanoGPT's baby GPT as experiment=shakespeare_char has it, with cheaper evals: every 100
    steps (to see the target's step closely) over 50 batches a split (~0.8M characters, seven
    passes over the val split), no samples."""
    out = [
        "experiment=shakespeare_char",
        f"device={device}",
        "train.eval_interval=100",
        "train.eval_iters=50",
        "train.sample_tokens=0",
        "train.eval_sample_tokens=0",
    ]
    if smoke:
        out = [*out[:2], *TINY, "compile=false", "train.max_iters=4", "train.eval_interval=2", "train.eval_iters=2"]
        out += ["train.log_interval=1", "train.sample_tokens=0", "train.eval_sample_tokens=0"]
    return [*out, f"hydra.run.dir={run_dir}"]


def part_baby(report: Report, args, cap: float) -> None:
    target = args.baby_target
    with tempfile.TemporaryDirectory(prefix="tinygpt-baby-") as tmp:
        run_dir, peak_file = Path(tmp) / "run", Path(tmp) / "peak.json"
        overrides = baby_overrides(args.device, args.smoke, run_dir)
        evals: list[dict] = []

        def watch(_proc) -> str | None:
            evals[:] = read_evals(run_dir / "metrics.jsonl")
            return f"val {evals[-1]['val']:.4f} <= {target}" if evals and evals[-1]["val"] <= target else None

        argv = child_argv("train", "--peak", str(peak_file), "--", *overrides)
        run = run_child(report, "baby GPT", argv, cap, watch=watch, grace=GRACE["baby_gpt"])
        evals[:] = read_evals(run_dir / "metrics.jsonl")
        peak = json.loads(peak_file.read_text()) if peak_file.exists() else {}
    reached = next((e for e in evals if e["val"] <= target), None)
    shown = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    record = {
        "command": "python train.py " + " ".join(shown),
        "target": target,
        "reached": reached is not None,
        "reached_step": reached["step"] if reached else None,
        "reached_elapsed_s": round(reached["elapsed_s"], 1) if reached else None,
        "best_val": min((e["val"] for e in evals), default=None),
        "last_step": evals[-1]["step"] if evals else None,
        "evals": [{k: round(e[k], 4) if isinstance(e[k], float) else e[k] for k in ("step", "val", "elapsed_s")} for e in evals],
        "wall_s": run["seconds"],
        "rc": run["rc"],
        "stopped": run["stopped"],
        "peak_gib": peak.get("peak_gib"),
    }
    if reached:
        record["status"] = "ok"
    elif run["timed_out"]:
        record["status"] = f"timeout: not <= {target} within the {cap:.0f} s cap"
    elif run["rc"] == 0:
        record["status"] = f"finished without reaching val <= {target}"
    else:
        record["status"] = "failed"
    if record["status"] != "ok":
        record["error"] = run["tail"][-800:]
    report.part("baby_gpt", record)


def read_evals(path: Path) -> list[dict]:
    """The eval rows of a run's metrics.jsonl so far (a partly written last line is skipped)."""
    rows = []
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if row.get("kind") == "eval":
                rows.append(row)
    except OSError:
        pass
    return rows


def part_generation(report: Report, args, cap: float) -> None:
    with tempfile.TemporaryDirectory(prefix="tinygpt-gen-") as tmp:
        result_file = Path(tmp) / "result.json"
        shown = ["--device", args.device, *(["--smoke"] if args.smoke else [])]
        run = run_child(report, "generation", child_argv("generate", *shown, "--result", str(result_file)), cap)
        result = json.loads(result_file.read_text()) if result_file.exists() else None
    record = {**(result or {}), "command": " ".join(["python benchmarks/device.py child generate", *shown])}
    record["status"] = status_of(run, result)
    record["seconds"] = run["seconds"]
    if record["status"] != "ok":
        record["error"] = run["tail"][-800:]
    report.part("generation", record)


def fsdp_overrides(device: str, smoke: bool) -> list[str]:
    """The 124M shape for 20 short steps (8 x 1024 tokens, no accumulation, eager: the part
    checks FSDP2's code on CUDA, not its speed), an eval and a checkpoint at the end."""
    out = [
        "experiment=gpt2_124m",
        "data=shakespeare_char",
        "model.vocab_size=50257",
        f"device={device}",
        "compile=false",
        "train.batch_size=8",
        "train.grad_accum_steps=1",
        "train.max_iters=20",
        "train.eval_interval=20",
        "train.eval_iters=2",
        "train.log_interval=1",
        "train.sample_tokens=0",
        "train.eval_sample_tokens=0",
    ]
    if smoke:
        out += [*TINY, "dtype=float32", "train.max_iters=3", "train.eval_interval=3"]
    return out


FSDP_RUNS = (  # (name, under torchrun, extra overrides)
    ("one process", False, []),
    ("fsdp", True, ["distributed=fsdp"]),
    ("fsdp cpu_offload", True, ["distributed=fsdp", "cpu_offload=true"]),
    ("fsdp muon", True, ["distributed=fsdp", "optim=muon"]),
)


def part_fsdp(report: Report, args, deadline: float) -> None:
    """(f): each run in its own process; the losses of every step from its metrics.jsonl."""
    base = fsdp_overrides(args.device, args.smoke)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    record = {
        "status": "ok",
        "common": "python train.py " + " ".join(base),
        "runs": [],
        "note": "torchrun with one process shards over a group of one (FSDP2's mixed precision and, with cpu_offload, "
        "its offload on one GPU); the CUDA tests shard a tiny model the same way "
        "(test_fsdp2_on_one_gpu_trains_as_the_whole_model_with_and_without_cpu_offload)",
    }
    with tempfile.TemporaryDirectory(prefix="tinygpt-fsdp-") as tmp:
        for name, torchrun, extra in FSDP_RUNS:
            cap = min(30.0 if not args.smoke else 90.0, deadline - time.monotonic())
            launcher = "torchrun --standalone --nproc_per_node=1 train.py" if torchrun else "python train.py"
            row = {"name": name, "command": f"{launcher} <common> {' '.join(extra)}".strip()}
            if cap < 10:
                row["status"] = "skipped: out of time"
                record["runs"].append(row)
                continue
            run_dir = Path(tmp) / name.replace(" ", "-")
            overrides = [*base, *extra, f"hydra.run.dir={run_dir}"]
            argv = child_argv("train", "--peak", f"{run_dir}.peak", "--", *overrides)  # train.py's main and its peak memory
            if torchrun:
                argv = [*launch, *argv[1:]]
            run = run_child(report, f"fsdp {name}", argv, cap)
            rows = [json.loads(line) for line in _lines(run_dir / "metrics.jsonl")]
            train = {r["step"]: r for r in rows if r.get("kind") == "train"}
            evals = [r for r in rows if r.get("kind") == "eval"]
            peak_file = Path(str(run_dir) + ".peak")
            row.update(
                losses={s: round(r["loss"], 4) for s, r in sorted(train.items())},
                ms_per_step=_median([r.get("ms_per_step") for s, r in train.items() if s > 3]),
                val=evals[-1].get("val") if evals else None,
                peak_gib=json.loads(peak_file.read_text()).get("peak_gib") if peak_file.exists() else None,
                seconds=run["seconds"],
                rc=run["rc"],
            )
            row["status"] = "timeout" if run["timed_out"] else ("ok" if run["rc"] == 0 and train else "failed")
            if row["status"] != "ok":
                row["error"] = run["tail"][-800:]
            if name == "fsdp" and row["status"] == "ok":
                record["sample"] = _sample_fsdp(report, args, run_dir, deadline)
            record["runs"].append(row)
            report.part("fsdp", record)
    ref = next((r for r in record["runs"] if r["name"] == "one process" and r.get("losses")), None)
    for r in record["runs"]:  # against the one-process run where the optimizer is the same (AdamW)
        same = "optim=muon" not in r["command"]
        if ref and r is not ref and same and r.get("losses") and r["losses"].keys() == ref["losses"].keys():
            r["max_loss_diff"] = max(abs(r["losses"][s] - ref["losses"][s]) for s in ref["losses"])
    if not any(r.get("status") == "ok" for r in record["runs"]) or record.get("sample", {}).get("status") not in (None, "ok"):
        record["status"] = "failed"
    elif any(r.get("status") not in ("ok",) and not str(r.get("status")).startswith("skipped") for r in record["runs"]):
        record["status"] = "failed"
    report.part("fsdp", record)


def _sample_fsdp(report: Report, args, run_dir: Path, deadline: float) -> dict:
    """sample.py reads the FSDP run's sharded checkpoint (DCP) whole onto one device."""
    shown = [f"device={args.device}", "num_samples=1", "max_new_tokens=16"]
    cap = min(30.0 if not args.smoke else 60.0, deadline - time.monotonic())
    if cap < 10:
        return {"status": "skipped: out of time"}
    env_argv = [sys.executable, str(REPO / "sample.py"), f"run_dir={run_dir}", *shown]
    run = run_child(report, "fsdp sample", env_argv, cap)
    out = {"command": "python sample.py run_dir=<the fsdp run> " + " ".join(shown), "seconds": run["seconds"], "rc": run["rc"]}
    out["status"] = "timeout" if run["timed_out"] else ("ok" if run["rc"] == 0 else "failed")
    out["tail"] = run["tail"][-400:]
    return out


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip().startswith("{")]
    except OSError:
        return []


def _median(values: list) -> float | None:
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


def part_peak_memory(report: Report) -> None:
    """(e): every part's peak memory in one place."""
    parts, rows = report.data["parts"], []
    for r in parts.get("throughput", {}).get("runs", []):
        rows.append({"part": f"(b) training {r['name']}", "peak_gib": r.get("peak_gib")})
    rows.append({"part": "(c) baby GPT (whole run)", "peak_gib": parts.get("baby_gpt", {}).get("peak_gib")})
    for r in parts.get("generation", {}).get("runs", []):
        rows.append(
            {
                "part": f"(d) generation batch {r['batch']}, KV cache {'on' if r['kv_cache'] else 'off'}",
                "peak_gib": r.get("peak_gib"),
            }
        )
    for r in parts.get("fsdp", {}).get("runs", []):
        rows.append({"part": f"(f) {r['name']} (whole run)", "peak_gib": r.get("peak_gib")})
    measured = any(r["peak_gib"] is not None for r in rows)
    report.part(
        "peak_memory",
        {
            "status": "ok" if measured else "no figures",
            "what": "torch.cuda.max_memory_allocated (CPU: the process's peak RSS)",
            "rows": rows,
        },
    )


def parent(args) -> None:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out, "smoke" if args.smoke else "full", args.device, args.budget)
    deadline = time.monotonic() + args.budget
    scale = 1.0 if not args.smoke else 2.0  # a CPU's tiny runs mostly wait on imports
    left = lambda: deadline - time.monotonic()  # noqa: E731

    wanted = set(args.parts.split(",")) if args.parts else set(DEFAULT_PARTS)
    if not wanted <= set(PARTS):
        sys.exit(f"--parts takes some of {','.join(PARTS)}; got {args.parts}")
    for name in (p for p in PARTS if p not in wanted):
        report.not_run(name, "not in --parts" if args.parts else "not in the default run: ask with --parts / PARTS=")

    def fits(name: str) -> bool:
        if left() >= MIN_S:
            return True
        report.part(name, {"status": f"skipped: out of budget ({max(left(), 0):.0f} s left)", "command": "", "runs": []})
        report.not_run(name, f"out of budget ({max(left(), 0):.0f} s left)")
        return False

    def interrupt(signum, frame):
        raise Interrupted

    signal.signal(signal.SIGTERM, interrupt)
    report.write()  # a report from the start: even a run killed outright leaves one
    try:
        if "cuda_tests" in wanted and fits("cuda_tests"):
            part_cuda_tests(report, args.smoke, min(CAPS["cuda_tests"] * scale, left()))
        if "throughput" in wanted:
            part_throughput(report, args, deadline, "compiled")
            part_throughput(report, args, deadline, "speedrun")
        if "generation" in wanted and fits("generation"):
            part_generation(report, args, min(CAPS["generation"] * scale, left()))
        if "throughput" in wanted:
            part_throughput(report, args, deadline, "eager")
        if "fsdp" in wanted and fits("fsdp"):
            part_fsdp(report, args, min(deadline, time.monotonic() + CAPS["fsdp"] * scale))
        if "baby_gpt" in wanted and fits("baby_gpt"):
            part_baby(report, args, min(CAPS["baby_gpt"] * scale, left()))
    except Interrupted:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the report is written once, whatever comes next
        report.data["interrupted"] = (
            f"SIGTERM after {time.monotonic() - report.t0:.0f} s, during {report.running or 'the parent'}"
        )
        ran = set(report.data["parts"]) | {n["what"] for n in report.data["not_run"]}
        for name in (p for p in PARTS if p in wanted and p not in ran):
            report.not_run(name, "stopped by SIGTERM")
    part_peak_memory(report)
    report.log.close()
    print(f"report: {out / 'device_report.md'} ({report.data['seconds']} s)")
    if "interrupted" in report.data:
        sys.exit(128 + signal.SIGTERM)


# --- the report as Markdown --------------------------------------------------------------------


def _f(value, fmt: str = "{:,.0f}", none: str = "-") -> str:
    return none if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip().replace("`", "'") if lines else ""


def _headline(part: dict) -> str:
    """A part's command and status, as the first line of its section."""
    status = f"**{part.get('status', 'not run')}**"
    return f"`{part['command']}`: {status}" if part.get("command") else status


def markdown(d: dict) -> str:
    env, parts = d["env"], d["parts"]
    lines = [
        "# tinygpt device report",
        "",
        f"{d['started']}; mode {d['mode']} on {d['device']}; {d.get('seconds', 0)} s of a {d['budget_s']:.0f} s budget.",
        "",
        *([f"**Interrupted**: {d['interrupted']}; the parts below are what ran.", ""] if d.get("interrupted") else []),
        "## Environment",
        "",
        *[f"- {k}: {v}" for k, v in env.items()],
        "",
    ]
    a = parts.get("cuda_tests", {})
    lines += ["## (a) CUDA tests", "", _headline(a), ""]
    lines += [
        f"Test files using the marker: {', '.join(a.get('files') or []) or 'none'}; marker registered in pyproject.toml: {a.get('marker_registered')}.",
        "",
    ]
    if a.get("summary"):
        lines += [f"    {a['summary']}", ""]
    b = parts.get("throughput", {})
    lines += ["## (b) Training throughput, the 124M shape", ""]
    if b.get("note"):
        lines += [f"{b['note']}.", ""]
    lines += [
        "| run | status | micro-batch x accum | ms/step | tokens/s | MFU | peak GiB | first step s | graph breaks | recompiles |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in b.get("runs", []):
        shape = f"{r['batch_size']} x {r['block_size']} x {r['accum']}" if "batch_size" in r else "-"
        mfu = _f(r.get("mfu"), "{:.1%}")
        lines.append(
            f"| {r['name']} | {r['status']} | {shape} | {_f(r.get('ms_per_step'), '{:.1f}')} | "
            f"{_f(r.get('tokens_per_s'))} | {mfu} | {_f(r.get('peak_gib'), '{:.2f}')} | {_f(r.get('first_step_s'), '{:.1f}')} | "
            f"{_f(r.get('graph_breaks'), '{}')} | {_f(r.get('recompiles'), '{}')} |"
        )
    lines += ["", "Commands:", ""] + [f"- `{r['command']}`" for r in b.get("runs", []) if r.get("command")]
    errors = [f"- {r['name']} ({r['status']}): `{_last_line(r['error'])}`" for r in b.get("runs", []) if r.get("error")]
    if errors:
        lines += ["", "The last line of each failed run's output (all of it in device_log.txt):", "", *errors]
    c = parts.get("baby_gpt", {})
    lines += [
        "",
        f"## (c) Baby GPT to val {c.get('target', BABY_TARGET)}",
        "",
        _headline(c),
        "",
    ]
    if c.get("reached"):
        ended = f"then stopped by this script ({c['stopped']})" if c.get("stopped") else "and ended by itself"
        lines.append(
            f"First eval with val <= {c['target']}: step {c['reached_step']}, {c['reached_elapsed_s']} s into the run "
            f"(metrics.jsonl's elapsed_s: start-up and compile included); the process ran {c['wall_s']} s, {ended}."
        )
    elif "wall_s" in c:
        lines.append(
            f"Best val {_f(c.get('best_val'), '{:.4f}')} by step {_f(c.get('last_step'), '{}')}; process {c.get('wall_s', '-')} s."
        )
    if "wall_s" in c:
        lines += ["", f"Peak memory: {_f(c.get('peak_gib'), '{:.2f}')} GiB.", ""]
    if c.get("evals"):
        lines += ["| step | val | elapsed s |", "|---|---|---|"] + [
            f"| {e['step']} | {e['val']:.4f} | {_f(e.get('elapsed_s'), '{:.1f}')} |" for e in c["evals"]
        ]
    g = parts.get("generation", {})
    lines += ["", "## (d) Generation", "", _headline(g), ""]
    if g.get("shape"):
        lines += [f"{g['shape']}.", ""]
    lines += ["| batch | KV cache | tokens/s (all rows) | first token ms | peak GiB |", "|---|---|---|---|---|"]
    for r in g.get("runs", []):
        lines.append(
            f"| {r['batch']} | {'on' if r['kv_cache'] else 'off'} | {_f(r.get('tokens_per_s'))} | "
            f"{_f(r.get('first_token_ms'), '{:.1f}')} | {_f(r.get('peak_gib'), '{:.2f}')} |"
        )
    e = parts.get("peak_memory", {})
    lines += [
        "",
        "## (e) Peak memory",
        "",
        f"{e.get('what', '')}: **{e.get('status', 'not run')}**",
        "",
        "| part | peak GiB |",
        "|---|---|",
    ]
    lines += [f"| {r['part']} | {_f(r.get('peak_gib'), '{:.2f}')} |" for r in e.get("rows", [])]
    f = parts.get("fsdp", {})
    lines += ["", "## (f) FSDP2 on the GPU, world size 1", "", f"**{f.get('status', 'not run')}**", ""]
    if f.get("note"):
        lines += [f"{f['note']}.", ""]
    if f.get("common"):
        lines += [f"<common>: `{f['common']}`", ""]
    lines += [
        "| run | status | loss at step 1 | loss at the last step | max loss diff vs one process | val | ms/step | peak GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in f.get("runs", []):
        losses = list((r.get("losses") or {}).values())
        lines.append(
            f"| {r['name']} | {r['status']} | {_f(losses[0] if losses else None, '{:.4f}')} | "
            f"{_f(losses[-1] if losses else None, '{:.4f}')} | {_f(r.get('max_loss_diff'), '{:.4f}')} | "
            f"{_f(r.get('val'), '{:.4f}')} | {_f(r.get('ms_per_step'), '{:.1f}')} | {_f(r.get('peak_gib'), '{:.2f}')} |"
        )
    lines += ["", "Commands:", ""] + [f"- `{r['command']}`" for r in f.get("runs", [])]
    if f.get("sample"):
        sample = f["sample"]
        lines += ["", f"Sampling the FSDP run's sharded checkpoint: `{sample.get('command', '')}`: **{sample['status']}**"]
        if sample.get("tail"):
            lines += ["", "    " + _last_line(sample["tail"])]
    errors = [f"- {r['name']} ({r['status']}): `{_last_line(r['error'])}`" for r in f.get("runs", []) if r.get("error")]
    if errors:
        lines += ["", *errors]
    failed = [(k, v) for k, v in parts.items() if str(v.get("status", "")).startswith(("failed", "timeout"))]
    lines += ["", "## Failures", ""] + ([f"- {k}: {v['status']}" for k, v in failed] or ["none"])
    lines += ["", "## Not run", ""] + ([f"- {n['what']}: {n['why']}" for n in d.get("not_run", [])] or ["none"])
    return "\n".join(lines) + "\n"


# --- the children: one part each ------------------------------------------------------------------


def peak_gib(device) -> float:
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def child_throughput(a) -> None:
    """Time `--steps` real training steps after `--warmup` ones (the first compiles)."""
    import torch

    from gpt.apps.common import compose
    from gpt.training import Trainer, build_run

    overrides = [
        f"experiment={a.recipe}",
        "data=shakespeare_char",
        "model.vocab_size=50257",
        f"optim={a.optim}",
        f"compile={a.compile}",
        f"device={a.device}",
        f"train.grad_accum_steps={a.accum}",
        "train.max_iters=1000",
        "train.sample_tokens=0",
        f"paths.output_dir={a.runs_dir or tempfile.mkdtemp(prefix='tinygpt-device-')}/run",
    ]
    if a.smoke:
        overrides += [*TINY, "dtype=float32"]
    if a.loss_chunk_elements:
        from gpt.model import GPT

        GPT.LOSS_CHUNK_ELEMENTS = a.loss_chunk_elements
    trainer = Trainer(build_run(compose("config", overrides, "python benchmarks/device.py")))
    run, dev = trainer.run, trainer.run.rt.device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    trainer.step()
    sync()
    first = time.perf_counter() - t0
    for _ in range(a.warmup - 1):
        trainer.step()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss, _ = trainer.step()
    loss.item()
    sync()
    dt = (time.perf_counter() - t0) / a.steps
    tok_s = run.tokens_per_step / dt
    peak = trainer.peak_flops
    ts = run.cfg.train
    result = {
        "overrides": overrides,
        "params": run.model.num_params(),
        "flops_per_token": run.model.flops_per_token(),
        "batch_size": ts.batch_size,
        "block_size": run.model_config.block_size,
        "accum": ts.grad_accum_steps,
        "tokens_per_step": run.tokens_per_step,
        "warmup_steps": a.warmup,
        "timed_steps": a.steps,
        "first_step_s": round(first, 2),
        "ms_per_step": dt * 1000,
        "tokens_per_s": tok_s,
        "peak_flops": peak,
        "mfu": run.model.flops_per_token() * tok_s / peak if peak else None,
        "peak_gib": peak_gib(dev),
        "loss": float(loss),
        "runtime": run.rt.describe(),
    }
    if a.result:
        Path(a.result).write_text(json.dumps(result))
    print(json.dumps(result))


def child_generate(a) -> None:
    """Decode `new` tokens after a `prompt`-token prompt, batch 1 and 8, cache on and off."""
    import torch

    from gpt.apps.common import compose
    from gpt.config import SamplingSettings
    from gpt.generation import Decoder
    from gpt.model import registry
    from gpt.runtime import devices

    overrides = ["experiment=gpt2_124m", *(TINY[:4] if a.smoke else [])]
    rt = devices.setup(a.device, "float32" if a.smoke else "auto", False)
    torch.manual_seed(0)
    config = registry.with_vocab(compose("config", overrides).model, 50257)
    model = registry.build(config).to(rt.device).eval()
    prompt, new = (8, 8) if a.smoke else (128, 128)
    sync = (lambda: torch.cuda.synchronize(rt.device)) if rt.device.type == "cuda" else (lambda: None)
    runs = []
    with torch.inference_mode(), rt.autocast():
        for batch in (1, 8):
            ids = torch.randint(0, 50257, (batch, prompt)).tolist()
            for cache in (True, False):
                settings = SamplingSettings(max_new_tokens=new, kv_cache=cache)  # sample.py's sampling defaults
                warm = Decoder(model, ids, settings, seeds=list(range(batch)))
                warm.steps(4)  # kernels, allocator
                del warm
                sync()
                if rt.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(rt.device)
                decoder = Decoder(model, ids, settings, seeds=list(range(batch)))
                t0 = time.perf_counter()
                decoder.steps(1)  # as generate() decodes: the tokens read back a few steps at a time
                sync()
                first = time.perf_counter() - t0
                for _ in range((new - 1) // 8):
                    decoder.steps(8)
                decoder.steps((new - 1) % 8)
                sync()
                total = time.perf_counter() - t0
                runs.append(
                    {
                        "batch": batch,
                        "kv_cache": cache,
                        "tokens_per_s": batch * new / total,
                        "first_token_ms": first * 1000,
                        "seconds": total,
                        "peak_gib": peak_gib(rt.device),
                    }
                )
                print(json.dumps(runs[-1]), flush=True)
    result = {
        "shape": f"{registry.summary(config)}, {model.num_params():,} parameters (vocab {config.vocab_size}, "
        f"{config.padded_vocab_size} rows), random weights; {rt.describe()}; a {prompt}-token prompt, {new} new "
        f"tokens a row, temperature 0.8, top-k 200",
        "prompt_tokens": prompt,
        "new_tokens": new,
        "runs": runs,
    }
    if a.result:
        Path(a.result).write_text(json.dumps(result))


def child_train(a) -> None:
    """`python train.py <overrides>` in this process, and its peak memory at exit."""
    import atexit

    def write_peak() -> None:
        import torch

        dev = torch.device("cuda") if torch.cuda.is_available() and torch.cuda.is_initialized() else torch.device("cpu")
        tmp = Path(a.peak).with_suffix(".tmp")
        tmp.write_text(json.dumps({"peak_gib": peak_gib(dev), "device": str(dev)}))
        os.replace(tmp, a.peak)  # whole or not at all: the run may be killed mid-write

    atexit.register(write_peak)

    def keep_writing() -> None:  # a run the watcher stops may end before atexit runs: the last write stands
        import time

        while True:
            time.sleep(1.0)
            try:
                write_peak()
            except Exception:  # noqa: BLE001 - a figure of the report, never the run's failure
                pass

    import threading

    threading.Thread(target=keep_writing, daemon=True).start()
    sys.argv = ["train.py", *a.overrides]
    from gpt.apps.train import main

    main()


def child(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python benchmarks/device.py child")
    sub = ap.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--recipe", required=True)
    t.add_argument("--optim", required=True)
    t.add_argument("--compile", required=True)
    t.add_argument("--device", default="cuda")
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--steps", type=int, default=30)
    t.add_argument("--accum", type=int, default=4)
    t.add_argument("--result", default=None, help="also write the figures here (JSON)")
    t.add_argument("--runs-dir", default=None, help="where the run's directory goes (default: a new temporary one)")
    t.add_argument("--smoke", action="store_true")
    t.add_argument("--loss-chunk-elements", type=int, default=None, help="GPT.LOSS_CHUNK_ELEMENTS for this run")
    g = sub.add_parser("generate")
    g.add_argument("--device", default="cuda")
    g.add_argument("--result", default=None, help="also write the figures here (JSON)")
    g.add_argument("--smoke", action="store_true")
    r = sub.add_parser("train")
    r.add_argument("--peak", required=True)
    r.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    {"throughput": child_throughput, "generate": child_generate, "train": child_train}[a.mode](a)


def main() -> None:
    if sys.argv[1:2] == ["child"]:
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for device_report.md / .json and device_log.txt")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, a couple of steps: the plumbing")
    ap.add_argument("--budget", type=float, default=None, help="seconds for all parts (default 280; smoke 120)")
    ap.add_argument("--warmup", type=int, default=None, help="training steps before timing (default 5; smoke 1)")
    ap.add_argument("--steps", type=int, default=None, help="timed training steps (default 30; smoke 2)")
    ap.add_argument("--accum", type=int, default=None, help="micro-batches a timed step (default 4; smoke 1)")
    ap.add_argument("--parts", default=None, help=f"run only these, comma-separated (default all: {','.join(PARTS)})")
    ap.add_argument("--baby-target", type=float, default=None, help=f"val loss for (c) (default {BABY_TARGET}; smoke 10)")
    args = ap.parse_args()
    full = {"budget": 280.0, "warmup": 5, "steps": 30, "accum": 4, "baby_target": BABY_TARGET}
    smoke = {"budget": 120.0, "warmup": 1, "steps": 2, "accum": 1, "baby_target": 10.0}
    for k, v in (smoke if args.smoke else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    parent(args)


if __name__ == "__main__":
    main()
