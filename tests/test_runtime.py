"""gpt/runtime/devices.py: device, dtype and compile decided once with their reasons (the CUDA choices
tested with a pretend GPU, so CPU-only CI still covers them), and the random state a checkpoint
carries. Run: pytest tests/test_runtime.py"""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import torch

from gpt.errors import TinyGPTError
from gpt.runtime import devices


@pytest.fixture
def pretend_gpu(monkeypatch):
    """torch believes in a node of 8 CUDA devices of the capability the test sets."""
    capability = {"sm": (9, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability["sm"])
    return capability


def test_each_process_takes_its_own_gpu_the_one_of_its_local_rank_or_the_one_it_sees(pretend_gpu, monkeypatch):
    """torchrun: every process sees the node's GPUs and takes its local rank's. SLURM with
    --gpus-per-task=1: every task sees one GPU, its own, as cuda:0. More processes on a node than
    GPUs they see: refused, saying how to launch."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert devices.pick_device("auto", local_rank=3)[0] == torch.device("cuda", 3)
    assert devices.pick_device("cuda", local_rank=3)[0] == torch.device("cuda", 3)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert devices.pick_device("auto", local_rank=3)[0] == torch.device("cuda", 0)
    assert devices.pick_device("cuda", local_rank=3)[0] == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(TinyGPTError, match=r"local rank 3 but sees 2 GPUs .*--nproc_per_node=<GPUs>.*--gpus-per-task=1") as e:
        devices.pick_device("auto", local_rank=3)
    assert "\n" not in str(e.value)


def test_auto_on_a_cpu_machine_is_cpu_fp32_no_compile(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    rt = devices.setup("auto", "auto", "auto", threads=1)
    assert rt.device == torch.device("cpu") and rt.dtype == torch.float32 and not rt.compile and not rt.use_grad_scaler
    assert "no CUDA or MPS found" in rt.describe() and "dtype float32" in rt.describe() and "compile off on cpu" in rt.describe()
    with rt.autocast():  # fp32: no autocast at all
        assert not torch.is_autocast_enabled()
    assert devices.pick_device("auto")[0] == torch.device("cpu")


@pytest.mark.parametrize("avx512_bf16, amx", [(True, False), (False, True), (False, False)])
def test_training_on_a_cpu_with_native_bf16_autocasts_to_bf16_and_inference_stays_fp32(monkeypatch, avx512_bf16, amx):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    cpu = torch.device("cpu")
    native = avx512_bf16 or amx
    dtype, why = devices.pick_dtype(cpu, "auto", training=True)
    assert dtype == (torch.bfloat16 if native else torch.float32)
    assert ("native bf16" in why and "dtype=float32 to turn off" in why) if native else why == "dtype float32 (default on cpu)"
    assert devices.pick_dtype(cpu, "auto") == (torch.float32, "dtype float32 (default on cpu)")  # sample, eval, serve
    assert devices.pick_dtype(cpu, "float32", training=True)[0] == torch.float32  # the way out
    assert devices.pick_dtype(torch.device("mps"), "auto", training=True)[0] == torch.float32
    rt = devices.setup("cpu", "auto", "auto", threads=1, training=True)
    assert rt.dtype == dtype and not rt.use_grad_scaler  # bf16 needs no loss scaling
    with rt.autocast():
        assert torch.is_autocast_enabled("cpu") == native


def test_auto_on_a_gpu_picks_bf16_from_sm80_and_fp16_with_a_scaler_below(pretend_gpu):
    device, why = devices.pick_device("auto")
    assert device == torch.device("cuda") and "NVIDIA H200" in why and "auto-detected" in why
    assert devices.pick_dtype(device) == (torch.bfloat16, "dtype bfloat16 autocast (SM 90 supports bf16)")
    assert devices.pick_compile(device) == (True, "compile on for CUDA")
    pretend_gpu["sm"] = (7, 5)  # a T4: no native bf16
    dtype, why = devices.pick_dtype(device)
    assert dtype == torch.float16 and "GradScaler" in why
    assert devices.Runtime(device, dtype, False).use_grad_scaler
    assert devices.pick_device("auto", local_rank=3)[0] == torch.device("cuda", 3)  # torchrun: its own GPU
    assert devices.pick_device("cuda", local_rank=2)[0] == torch.device("cuda", 2)
    assert devices.pick_device("cuda:1", local_rank=2)[0] == torch.device("cuda", 1)  # an index given wins
    assert devices.peak_flops(device) == devices.PEAK_FLOPS["H200"] and devices.peak_flops(device, 5e12) == 5e12


@pytest.mark.parametrize("bf16_here", [True, False])
def test_a_resume_computes_in_its_checkpoints_dtype_where_this_device_does_natively(monkeypatch, pretend_gpu, bf16_here):
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: bf16_here)
    cpu = devices.setup("cpu", "auto", "auto", threads=1, training=True)
    picked = cpu.dtype
    assert devices.adopt_dtype(cpu, None, "auto", None) is None and cpu.dtype == picked  # an older checkpoint: unknown
    assert devices.adopt_dtype(cpu, str(picked).removeprefix("torch."), "auto", "cpu") is None  # alike: nothing to say
    other = "float32" if bf16_here else "bfloat16"
    assert devices.adopt_dtype(cpu, other, "auto", "cuda") is None and cpu.dtype == picked  # a GPU's choice is no CPU's
    notice = devices.adopt_dtype(cpu, other, "auto", "cpu")
    if bf16_here:  # trained in fp32 on a CPU without bf16: fp32 here too, the log says so
        assert cpu.dtype == torch.float32 and "dtype float32, the dtype the checkpoint was trained in" in notice
        assert "dtype=auto here picks bfloat16" in notice and "dtype float32, the dtype the checkpoint" in cpu.describe()
    else:  # trained in bf16 elsewhere: this CPU would emulate it, ~10x slower; it stays in fp32 and says so
        assert cpu.dtype == torch.float32 and "which cpu here would only emulate" in notice
    chosen = devices.setup("cpu", "float32", "auto", threads=1, training=True)
    notice = devices.adopt_dtype(chosen, "bfloat16", "float32", "cpu")  # the user's choice wins, named
    assert chosen.dtype == torch.float32 and "dtype=bfloat16 keeps them alike" in notice
    gpu = devices.Runtime(torch.device("cuda"), torch.bfloat16, False, ["dtype bfloat16 autocast (SM 90 supports bf16)"])
    assert devices.adopt_dtype(gpu, "float32", "auto", "cpu") is None and gpu.dtype == torch.bfloat16  # a CPU's fp32
    notice = devices.adopt_dtype(gpu, "float16", "auto", "cuda", sharded=True)  # a T4's DDP run resumed sharded
    assert "which distributed=fsdp does not train in" in notice and gpu.dtype == torch.bfloat16
    assert devices.adopt_dtype(gpu, "float16", "auto", "cuda") is not None and gpu.dtype == torch.float16 and gpu.use_grad_scaler
    pretend_gpu["sm"] = (7, 5)  # a T4 resuming an H100's bf16 run: emulated bf16 refused, fp16 kept
    t4 = devices.Runtime(torch.device("cuda"), torch.float16, False, [])
    assert "would only emulate" in devices.adopt_dtype(t4, "bfloat16", "auto", "cuda") and t4.dtype == torch.float16


def test_forced_choices_and_mistakes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    cpu = torch.device("cpu")
    assert devices.pick_dtype(cpu, "bfloat16") == (torch.bfloat16, "dtype bfloat16 (forced by config)")
    assert devices.pick_compile(cpu, True)[0] and not devices.pick_compile(cpu, "False")[0]
    assert devices.peak_flops(cpu) is None  # no MFU on a CPU
    for call, needle in [
        (lambda: devices.pick_device("cuda"), "no usable CUDA GPU; use device=auto or device=cpu"),
        (lambda: devices.pick_device("mps"), "MPS is not available here"),
        (lambda: devices.pick_device("cuda:x"), "malformed; use cuda:N"),
        (lambda: devices.pick_device("tpu"), "device='tpu' is unknown"),
        (lambda: devices.pick_dtype(cpu, "fp8"), "dtype='fp8' is unknown"),
        (lambda: devices.pick_compile(cpu, "maybe"), "compile='maybe' is not understood"),
    ]:
        with pytest.raises(TinyGPTError, match=needle):
            call()


def test_the_rng_state_restores_every_generator_and_survives_a_weights_only_load(tmp_path):
    devices.seed_everything(3)
    random.random(), np.random.rand(), torch.rand(1)
    torch.save(devices.rng_state(torch.device("cpu")), tmp_path / "rng.pt")
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    devices.seed_everything(99)  # anything else in between
    devices.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (random.random(), float(np.random.rand()), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989),  # the SXM part
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA H200", 989),
        ("NVIDIA H200 NVL", 835),
        ("NVIDIA GH200 480GB", 989),
        ("NVIDIA B200", 2250),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA A100 80GB PCIe", 312),
        ("NVIDIA A10", 125),
        ("NVIDIA L40S", 362),
        ("NVIDIA L40", 181),
        ("NVIDIA L4", 121),
        ("NVIDIA GeForce RTX 4090", 165),
        ("Tesla V100-PCIE-32GB", 112),
        ("Tesla V100-SXM2-16GB", 125),
        ("Tesla T4", 65),
    ],
)
def test_peak_flops_reads_the_most_specific_gpu_name(pretend_gpu, monkeypatch, name, tflops):
    """Dense bf16 peaks (fp16 where the GPU has no bf16), the most specific name first: an H100
    PCIe or NVL is not an SXM, an L40 not an L4, a V100 PCIe not an SXM2."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert devices.peak_flops(torch.device("cuda")) == tflops * 1e12


@pytest.mark.parametrize(
    "name",
    ["NVIDIA A10G", "NVIDIA RTX PRO 6000 Blackwell", "AMD Instinct MI300X", "NVIDIA H20", "NVIDIA H100 80GB HBM3 MIG 1g.10gb"],
)
def test_an_unknown_gpu_reports_no_mfu_unless_its_peak_is_given(pretend_gpu, monkeypatch, name):
    """A name the table does not hold (nor a longer name that merely contains a known one, nor a
    MIG slice of a known GPU) gives None, so training logs no MFU rather than a wrong one;
    train.peak_flops supplies it."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert devices.peak_flops(torch.device("cuda")) is None
    assert devices.peak_flops(torch.device("cuda"), override=70e12) == 70e12


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_cpu_training_keeps_freed_memory_for_its_next_step_fewer_page_faults(tmp_path, data_root):
    """Training on a CPU in one process tells glibc to keep what a step frees for the next
    (devices.keep_freed_memory), and says so: 200 more steps of the quickstart's model then take
    almost no more page faults (as glibc comes, its activations were unmapped and mapped again,
    150-1,000 faults a step on this machine). A user's own allocator settings (GLIBC_TUNABLES
    here) are left as they are, and the line says nothing."""
    import resource

    from helpers import run_script

    root, data = data_root
    args = [*data, "train.eval_iters=2", "train.sample_tokens=0", "train.eval_sample_tokens=0", "threads=1"]

    def faults(steps: int, **env) -> tuple[int, str]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            run = [*args, f"train.max_iters={steps}", f"train.eval_interval={steps}", f"hydra.run.dir={tmp_path / str(steps)}"]
            proc = run_script("train.py", run, tmp_path, root)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before, proc.stdout

    _, said = faults(1, GLIBC_TUNABLES="glibc.malloc.check=0")  # (it also prepares the data, in no count below)
    assert "freed memory kept for reuse" not in said
    short, said = faults(50)
    assert "freed memory kept for reuse" in said
    long, _ = faults(250)
    assert long - short < 10 * 200, (short, long)
