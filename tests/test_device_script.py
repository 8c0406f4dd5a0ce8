"""benchmarks/device.sh, the first GPU run's one script, works end to end in its CPU smoke mode
(`DEVICE=cpu SMOKE=1 bash benchmarks/device.sh`: tiny shapes, a couple of steps, compiling left
to the GPU): every part runs in its own process and the report holds every section, with
figures where the part can run on a CPU. What it measures on a GPU is the device run's to say.
Slow (~40 s on 2 CPU cores). Run: pytest -m slow tests/test_device_script.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO, SHARED_TEXT

SECTIONS = (
    "## Environment",
    "## (a) CUDA tests",
    "## (b) Training throughput, the 124M shape",
    "## (c) Baby GPT to val",
    "## (d) Generation",
    "## (e) Peak memory",
    "## (f) FSDP2 on the GPU, world size 1",
    "## Failures",
)


@pytest.mark.slow
def test_smoke_mode_writes_every_section(tmp_path):
    if not SHARED_TEXT.is_file():
        pytest.skip(f"needs the real Tiny Shakespeare at {SHARED_TEXT} (the baby GPT's recipe checks its sha256)")
    data = tmp_path / "data" / "tinyshakespeare"
    data.mkdir(parents=True)
    shutil.copy(SHARED_TEXT, data / "input.txt")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "SMOKE": "1",
        "OUT": str(out),
        "PYTHON": sys.executable,
        "TINYGPT_DATA_DIR": str(tmp_path / "data"),
        "TMPDIR": str(tmp_path),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "device.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    md = (out / "device_report.md").read_text()
    for section in SECTIONS:
        assert section in md, f"{section!r} missing from the report:\n{md}"
    assert (out / "device_log.txt").stat().st_size > 0 and (out / "device_setup.txt").is_file()

    report = json.loads((out / "device_report.json").read_text())
    assert report["mode"] == "smoke" and report["device"] == "cpu"
    parts = report["parts"]
    assert set(parts) == {"cuda_tests", "throughput", "fsdp", "baby_gpt", "generation", "peak_memory"}
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
    assert {(r["recipe"], r["optim"]) for r in runs.values() if r["status"] == "ok"} >= {
        ("gpt2_124m", "adamw"),
        ("gpt2_124m", "muon"),
        ("speedrun_124m", "muon"),
    }

    baby = parts["baby_gpt"]
    assert baby["status"] == "ok" and baby["reached"], baby.get("error")
    assert baby["command"].startswith("python train.py experiment=shakespeare_char device=cpu")
    assert baby["reached_step"] == baby["evals"][0]["step"] == 0  # the smoke target (10) is met at once

    gen = parts["generation"]
    assert gen["status"] == "ok", gen.get("error")
    assert {(r["batch"], r["kv_cache"]) for r in gen["runs"]} == {(1, True), (1, False), (8, True), (8, False)}
    assert all(r["tokens_per_s"] > 0 for r in gen["runs"])

    fsdp = parts["fsdp"]
    assert fsdp["status"] == "ok", json.dumps(fsdp, indent=1)[-3000:]
    assert [r["name"] for r in fsdp["runs"]] == ["one process", "fsdp", "fsdp cpu_offload", "fsdp muon"]
    assert all(r["status"] == "ok" and len(r["losses"]) == 3 and r["val"] is not None for r in fsdp["runs"])
    # fp32 on a CPU at world size 1: FSDP2's step is the one-process step
    assert all(r["max_loss_diff"] < 1e-3 for r in fsdp["runs"][1:3]), [r["max_loss_diff"] for r in fsdp["runs"]]
    assert fsdp["sample"]["status"] == "ok", fsdp["sample"]

    assert all(row["peak_gib"] for row in parts["peak_memory"]["rows"] if "compile=true" not in row["part"])
