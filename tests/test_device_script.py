"""benchmarks/device.sh, the GPU run's one script, works end to end in its CPU smoke mode
(`DEVICE=cpu SMOKE=1 bash benchmarks/device.sh`: tiny shapes, a couple of steps, compiling left
to the GPU), from a bare copy of the checkout (the device image has torch, not tinygpt): every
part runs in its own process, the report holds every section and is written after every part,
a budget skips what does not fit and says so, and a SIGTERM leaves the report of what ran.
What it measures on a GPU is the device run's to say.
Slow (~2 minutes on 2 CPU cores). Run: pytest -m slow tests/test_device_script.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, SHARED_TEXT

pytestmark = pytest.mark.shared  # the baby GPT's recipe checks the real corpus's sha256 (_env skips without it)

SECTIONS = (
    "## Environment",
    "## (a) CUDA tests",
    "## (b) Training throughput, the 124M shape",
    "## (c) Baby GPT to val",
    "## (d) Generation",
    "## (e) Peak memory",
    "## (f) FSDP2 on the GPU, world size 1",
    "## Failures",
    "## Not run",
)


def _bare_checkout(tmp_path):
    """The checkout's tracked and untracked files (git ls-files: what the device tool copies),
    without .git and without installing anything."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    copy = tmp_path / "checkout"
    for name in filter(None, (n.decode() for n in listed)):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    return copy


def _env(tmp_path, **extra) -> dict:
    if not SHARED_TEXT.is_file():
        pytest.skip(f"needs the real Tiny Shakespeare at {SHARED_TEXT} (the baby GPT's recipe checks its sha256)")
    data = tmp_path / "data" / "tinyshakespeare"
    data.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHARED_TEXT, data / "input.txt")
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "SMOKE": "1",
        "OUT": str(tmp_path / "out"),
        "PYTHON": sys.executable,
        "TINYGPT_DATA_DIR": str(tmp_path / "data"),
        "TMPDIR": str(tmp_path),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("PYTHONPATH", None)
    return {**env, **extra}


def _device_sh(tmp_path, checkout=REPO, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    """`bash benchmarks/device.sh` of `checkout`, run from `tmp_path` with `_env`'s settings and `env`."""
    script = str(checkout / "benchmarks" / "device.sh")
    return subprocess.run(
        ["bash", script], env=_env(tmp_path, **env), cwd=tmp_path, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_the_default_smoke_run_fits_its_budget_from_a_bare_checkout(tmp_path):
    """`DEVICE=cpu SMOKE=1 BUDGET_S=90 bash benchmarks/device.sh` in a copy of the checkout:
    done within 150 s, the copy's gpt imported (not an installed one), the default parts run and
    (c) and (f) listed as not run."""
    checkout = _bare_checkout(tmp_path)
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = _device_sh(tmp_path, checkout, BUDGET_S="90")
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert wall <= 150, wall
    md = (out / "device_report.md").read_text()
    for section in SECTIONS:
        assert section in md, f"{section!r} missing from the report:\n{md}"
    assert (out / "device_log.txt").stat().st_size > 0 and (out / "device_setup.txt").is_file()

    report = json.loads((out / "device_report.json").read_text())
    assert report["mode"] == "smoke" and report["device"] == "cpu" and report["budget_s"] == 90
    assert report["env"]["tinygpt"].endswith(f"from {checkout / 'gpt'}"), report["env"]["tinygpt"]
    parts = report["parts"]
    assert set(parts) == {"cuda_tests", "throughput", "generation", "peak_memory"}
    assert {n["what"] for n in report["not_run"]} == {"fsdp", "baby_gpt"}
    assert parts["cuda_tests"]["command"].startswith("python -m pytest -m cuda") and parts["cuda_tests"]["status"]

    runs = {r["name"]: r for r in parts["throughput"]["runs"]}
    for name, r in runs.items():
        if r["compile"] == "true":
            assert r["status"].startswith("skipped"), name  # compiling is the GPU run's
        else:
            assert r["status"] == "ok", f"{name}: {r.get('error')}"
            assert r["tokens_per_s"] > 0 and r["ms_per_step"] > 0 and r["peak_gib"] > 0
            assert r["tokens_per_step"] == r["batch_size"] * r["block_size"] * r["accum"]
            assert r["command"].startswith("python benchmarks/device.py child throughput")
    assert {(r["recipe"], r["optim"]) for r in runs.values() if r["status"] == "ok"} == {
        ("gpt2_124m", "adamw"),
        ("speedrun_124m", "muon"),
    }

    gen = parts["generation"]
    assert gen["status"] == "ok", gen.get("error")
    assert {(r["batch"], r["kv_cache"]) for r in gen["runs"]} == {(1, True), (1, False), (8, True), (8, False)}
    assert all(r["tokens_per_s"] > 0 for r in gen["runs"])
    assert all(
        row["peak_gib"]
        for row in parts["peak_memory"]["rows"]
        if "compile=true" not in row["part"] and row["part"].startswith(("(b)", "(d)"))
    )


@pytest.mark.slow
def test_a_budget_of_20_s_stops_early_and_lists_what_it_skipped(tmp_path):
    out = tmp_path / "out"
    proc = _device_sh(tmp_path, timeout=200, BUDGET_S="20")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "device_report.json").read_text())
    assert report["seconds"] <= 20 + 2 * 15, report["seconds"]  # what started runs within its share
    skipped = [n for n in report["not_run"] if n["why"].startswith("out of budget")]
    assert skipped and report["parts"]["generation"]["status"].startswith("skipped: out of budget"), report["not_run"]
    md = (out / "device_report.md").read_text()
    assert all(f"- {n['what']}: {n['why']}" in md for n in skipped)


@pytest.mark.slow
def test_sigterm_mid_run_leaves_the_report_of_what_ran(tmp_path):
    """A SIGTERM to device.sh while the generation part runs: the child is stopped, the report
    holds the parts before it and says what it stopped, and the script exits 143."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        ["bash", str(REPO / "benchmarks" / "device.sh")],
        env=_env(tmp_path),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 150
        log = out / "device_log.txt"
        while "===== generation:" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() is not None else ""
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    report = json.loads((out / "device_report.json").read_text())
    assert rc == 143, proc.stdout.read()[-3000:]
    assert "during generation" in report["interrupted"], report.get("interrupted")
    assert report["parts"]["cuda_tests"]["status"] and report["parts"]["throughput"]["runs"]
    assert "generation" in {n["what"] for n in report["not_run"] if n["why"] == "stopped by SIGTERM"}
    assert "**Interrupted**" in (out / "device_report.md").read_text()
    # nothing of the part is left running
    assert not subprocess.run(["pgrep", "-f", "device.py child generate"], capture_output=True).stdout


@pytest.mark.slow
def test_the_parts_asked_for_run_fsdp_and_the_baby_gpt(tmp_path):
    """PARTS=fsdp,baby_gpt: the two parts the default run leaves out."""
    out = tmp_path / "out"
    proc = _device_sh(tmp_path, PARTS="fsdp,baby_gpt")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "device_report.json").read_text())
    parts = report["parts"]
    assert set(parts) == {"fsdp", "baby_gpt", "peak_memory"}
    assert {n["what"] for n in report["not_run"]} == {"cuda_tests", "throughput", "generation"}
    baby = parts["baby_gpt"]
    assert baby["status"] == "ok" and baby["reached"], baby.get("error")
    assert baby["command"].startswith("python train.py experiment=shakespeare_char device=cpu")
    assert baby["reached_step"] == baby["evals"][0]["step"] == 0  # the smoke target (10) is met at once

    fsdp = parts["fsdp"]
    assert fsdp["status"] == "ok", json.dumps(fsdp, indent=1)[-3000:]
    assert [r["name"] for r in fsdp["runs"]] == ["one process", "fsdp", "fsdp cpu_offload", "fsdp muon"]
    assert all(r["status"] == "ok" and len(r["losses"]) == 3 and r["val"] is not None for r in fsdp["runs"])
    # fp32 on a CPU at world size 1: FSDP2's step is the one-process step
    assert all(r["max_loss_diff"] < 1e-3 for r in fsdp["runs"][1:3]), [r["max_loss_diff"] for r in fsdp["runs"]]
    assert fsdp["sample"]["status"] == "ok", fsdp["sample"]


def test_a_part_s_graph_breaks_and_recompiles_are_counted_from_dynamo_s_own_log(tmp_path):
    """run_child passes TORCH_LOGS to the part and counts what dynamo logs: a function compiled
    with a print in it breaks its graph, and a call with another rank recompiles."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import device

    code = "import torch\n@torch.compile\ndef f(x):\n    y = x * 2\n    print('break')\n    return y + 1\nf(torch.ones(3)); f(torch.ones(4, 2))\n"
    report = device.Report.__new__(device.Report)  # the log only: no environment probe, no report files
    report.log, report.running = open(tmp_path / "log.txt", "w", encoding="utf-8"), None
    logs = {"TORCH_LOGS": "graph_breaks,recompiles", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    run = device.run_child(report, "compiled", [sys.executable, "-c", code], cap=120, env_extra=logs)
    plain = device.run_child(report, "compiled", [sys.executable, "-c", code], cap=120)
    assert run["rc"] == 0 and run["graph_breaks"] >= 1 and run["recompiles"] >= 1, run["tail"]
    assert plain["rc"] == 0 and plain["graph_breaks"] == plain["recompiles"] == 0
