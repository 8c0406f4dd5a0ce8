"""Device, precision and compilation: decided once, in one place, with the reason recorded."""

from __future__ import annotations

import contextlib
import os
import random
import re
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from gpt.errors import TinyGPTError
from gpt.runtime.threads import Threads

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# Below this many query positions, a CPU computes attention in fp32 even under bf16 autocast:
# torch's CPU flash attention is slower in bf16 there. Forward+backward at batch 12, 4 heads of 32,
# 64 positions: 3.9 ms against fp32's 1.2 (torch 2.13, 2 cores; 3 heads of 16, the quickstart's:
# 3.9 against 1.0); 128 positions of 64-wide heads: 19.8 against 11.0; 256: 28.7 against 26.5,
# even; 1024: bf16 18% faster (python benchmarks/cpu_attention.py). Autocast offers no per-op
# opt-out, hence a setting the model's attention reads (Runtime.tune).
CPU_FP32_ATTENTION_BELOW = 256

# On a GPU the training forward's logits go whole while they and their gradient (fp32: 8 bytes an
# element) take at most an eighth of the device's memory: GPT-2 124M's 16 x 1024 x 50304 logits
# (6.6 GB so counted) on an 80 GB GPU in one piece, on a 24 GB one in 3 chunks. Chunks cost
# launches and a recomputed head (~9% more FLOPs at 25 chunks); GPT.LOSS_CHUNK_ELEMENTS elsewhere.
GPU_LOGIT_BYTES_SHARE = 8 * 8


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # compute dtype of the forward/backward pass (weights stay fp32)
    compile: bool
    reasons: list[str] = field(default_factory=list)
    threads: Threads | None = None  # CPU threads: chosen once (gpt.runtime.threads), or following the load with threads=auto

    @property
    def use_grad_scaler(self) -> bool:
        # fp16 has too little range for small gradients; bf16 has fp32's range and needs no scaling.
        return self.dtype == torch.float16

    @property
    def fp32_attention_below(self) -> int:
        """Query lengths below which attention runs in fp32 under this runtime's autocast: on a
        CPU in bf16, CPU_FP32_ATTENTION_BELOW; elsewhere 0 (never)."""
        return CPU_FP32_ATTENTION_BELOW if self.device.type == "cpu" and self.dtype != torch.float32 else 0

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` on this device, with the device's settings for its kernels (`tune`): what every
        command does to a model before it runs it."""
        model = model.to(self.device)
        self.tune(model)
        return model

    def tune(self, model: torch.nn.Module) -> None:
        """This device's settings for the model's kernels, on the modules that take them: the
        attention precision (`fp32_attention_below`, CausalSelfAttention.fp32_below) and, on a GPU,
        the logits the loss takes whole (GPT.loss_chunk_elements, GPU_LOGIT_BYTES_SHARE)."""
        logits = None
        if self.device.type == "cuda":
            logits = torch.cuda.get_device_properties(self.device).total_memory // GPU_LOGIT_BYTES_SHARE
        for module in model.modules():
            if hasattr(module, "fp32_below"):
                module.fp32_below = self.fp32_attention_below
            if hasattr(module, "loss_chunk_elements"):
                module.loss_chunk_elements = logits

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def describe(self) -> str:
        return "; ".join(self.reasons)


def _mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def gpu_of(local_rank: int) -> int:
    """The index, among the GPUs this process sees, of its own: its local rank where it sees the
    node's GPUs (torchrun, one process per GPU), or 0 where it sees one, its own (SLURM's
    --gpus-per-task=1 gives each task one GPU through CUDA_VISIBLE_DEVICES, which it sees as
    cuda:0 whatever its local rank)."""
    count = torch.cuda.device_count()
    if local_rank < count:
        return local_rank
    if count == 1:
        return 0
    raise TinyGPTError(
        f"this process is local rank {local_rank} but sees {count} GPUs (CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); start at most one process per GPU of a node "
        f"(torchrun --nproc_per_node=<GPUs>), or give each task a GPU of its own (SLURM: --gpus-per-task=1)"
    )


def pick_device(requested: str = "auto", local_rank: int | None = None) -> tuple[torch.device, str]:
    """`local_rank` (under torchrun or SLURM) picks this process's own GPU (`gpu_of`)."""
    if requested == "auto":
        if torch.cuda.is_available():
            dev = torch.device("cuda", gpu_of(local_rank)) if local_rank is not None else torch.device("cuda")
            return dev, f"device {dev} ({torch.cuda.get_device_name(dev)}), auto-detected"
        if _mps_available():
            return torch.device("mps"), "device mps (Apple GPU), auto-detected"
        return torch.device("cpu"), "device cpu (no CUDA or MPS found)"
    kind, _, index = requested.partition(":")
    if index and not index.isdigit():
        raise TinyGPTError(f"device={requested!r} is malformed; use cuda:N with a GPU number, e.g. device=cuda:0")
    if kind == "cuda" and not torch.cuda.is_available():
        raise TinyGPTError("device=cuda was requested but this machine has no usable CUDA GPU; use device=auto or device=cpu")
    if kind == "mps" and not _mps_available():
        raise TinyGPTError("device=mps was requested but MPS is not available here; use device=auto or device=cpu")
    if kind not in ("cpu", "cuda", "mps"):
        raise TinyGPTError(f"device={requested!r} is unknown; use auto, cpu, cuda, cuda:N or mps")
    if kind == "cuda" and local_rank is not None and not index:
        gpu = gpu_of(local_rank)
        return torch.device("cuda", gpu), f"device cuda:{gpu} (forced by config, GPU of local rank {local_rank})"
    return torch.device(requested), f"device {requested} (forced by config)"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX-512 BF16 or AMX tiles), which
    oneDNN uses for bf16 matmuls."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def pick_dtype(device: torch.device, requested: str = "auto", training: bool = False) -> tuple[torch.dtype, str]:
    """`training`: the choice for a training run, which on a CPU with native bf16 differs (below)."""
    if requested != "auto":
        if requested not in _DTYPES:
            raise TinyGPTError(f"dtype={requested!r} is unknown; use auto, float32, bfloat16 or float16")
        return _DTYPES[requested], f"dtype {requested} (forced by config)"
    if device.type == "cuda":
        # Native bf16 arrived with Ampere (SM 80); older GPUs only emulate it, slowly.
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) >= (8, 0):
            return torch.bfloat16, f"dtype bfloat16 autocast (SM {major}{minor} supports bf16)"
        return torch.float16, f"dtype float16 autocast + GradScaler (SM {major}{minor} lacks native bf16)"
    if device.type == "cpu" and training and cpu_has_native_bf16():
        # oneDNN's bf16 matmuls on AVX-512 BF16 run the quickstart's 3.3x faster than fp32's
        # (22 -> 6.6 ms of its 43 ms step, which becomes 30; final val 1.5672 against 1.5774 with
        # fp32 matmuls, docs/performance.md). Inference stays fp32: its figures are compared with
        # transformers' fp32 ones, and decoding gains nothing (500 tokens of the quickstart
        # model: 3.1-3.6 s either way).
        return torch.bfloat16, "dtype bfloat16 autocast (training on a CPU with native bf16; dtype=float32 to turn off)"
    # CPUs without native bf16 emulate it slowly, and MPS autocast is still patchy: stay in fp32.
    return torch.float32, f"dtype float32 (default on {device.type})"


def native(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `device` computes in `dtype` at full speed: fp32 anywhere; bf16 on CUDA from Ampere
    (SM 80) and on CPUs with AVX-512 BF16 or AMX; fp16 on CUDA. (Elsewhere it is emulated, ~10x
    slower, or, on MPS, patchy under autocast.)"""
    if dtype == torch.float32:
        return True
    if device.type == "cuda":
        return dtype == torch.float16 or torch.cuda.get_device_capability(device) >= (8, 0)
    return dtype == torch.bfloat16 and device.type == "cpu" and cpu_has_native_bf16()


def adopt_dtype(rt: Runtime, recorded: str | None, requested: str, trained_on: str | None, sharded: bool = False) -> str | None:
    """A resumed run computes in the dtype its checkpoint was trained in (`recorded`, on a device
    of type `trained_on`) where dtype=auto picks another on this kind of device (another machine:
    a CPU with bf16 and one without pick apart), so that its steps compute as its earlier ones
    did; unless the user chose a dtype, the checkpoint comes from another kind of device (a CPU's
    fp32 is no reason to leave a GPU's bf16), this device would only emulate the recorded dtype,
    or it is fp16 and the run is sharded (FSDP2 here trains in bf16 or fp32). A notice whenever
    it keeps another dtype than the checkpoint's, on the same kind of device."""
    if recorded is None or recorded not in _DTYPES or _DTYPES[recorded] == rt.dtype or trained_on != rt.device.type:
        return None
    here = str(rt.dtype).removeprefix("torch.")
    if requested != "auto":
        return (
            f"notice: dtype {here} (set) where the checkpoint was trained in {recorded}: the resumed steps "
            f"compute differently from the earlier ones (dtype={recorded} keeps them alike)"
        )
    if not native(_DTYPES[recorded], rt.device):
        return f"notice: dtype {here}: the checkpoint was trained in {recorded}, which {rt.device.type} here would only emulate"
    if sharded and recorded == "float16":
        return f"notice: dtype {here}: the checkpoint was trained in float16, which distributed=fsdp does not train in"
    rt.dtype = _DTYPES[recorded]
    why = f"dtype {recorded}, the dtype the checkpoint was trained in"
    rt.reasons = [why if r.startswith("dtype ") else r for r in rt.reasons]
    return f"notice: {why} (dtype=auto here picks {here}), so that the resumed steps compute as the earlier ones did"


def pick_compile(device: torch.device, requested: str | bool = "auto") -> tuple[bool, str]:
    choice = str(requested).strip().lower()  # compile=true arrives as "True" in a string setting
    if choice not in ("auto", "true", "false"):
        raise TinyGPTError(f"compile={requested!r} is not understood; use compile=auto, compile=true or compile=false")
    if choice == "auto":
        on = device.type == "cuda"
        why = "on for CUDA" if on else f"off on {device.type}: compile time outweighs the gain for small runs"
        return on, f"compile {why}"
    return choice == "true", f"compile {'on' if choice == 'true' else 'off'} (set in config)"


def setup(
    device: str = "auto",
    dtype: str = "auto",
    compile: str | bool = "auto",
    local_rank: int | None = None,
    threads: int | str | None = None,
    local_processes: int = 1,
    training: bool = False,
) -> Runtime:
    dev, why_dev = pick_device(device, local_rank)
    dt, why_dt = pick_dtype(dev, dtype, training)
    comp, why_comp = pick_compile(dev, compile)
    chosen = Threads(dev, threads, local_processes)
    reasons = [why_dev, why_dt, why_comp, chosen.reason]
    if dev.type == "cuda":
        # TF32 matmuls: ~free speed on Ampere+ with no visible effect on training.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        reasons.append("TF32 matmuls on")
    if dev.type == "cpu" and training and local_processes == 1 and keep_freed_memory():
        reasons.append("freed memory kept for reuse")
    return Runtime(device=dev, dtype=dt, compile=comp, reasons=reasons, threads=chosen)


def keep_freed_memory() -> bool:
    """glibc's malloc told to keep what a training step frees for the next one: blocks up to 32 MB
    from its heap, not mapped and unmapped each time, and its heap's top never handed back below
    256 MB. A CPU step allocates and frees the same activations every step; as glibc comes, each
    came back as fresh pages from the kernel, and the quickstart's process took ~1.5M page faults
    in a run, 1.4 s of system time in 500 steps (0.4-0.6 s so: benchmarks in docs/performance.md);
    its peak memory stays the same. Left as it is where the user tuned the allocator (MALLOC_*
    or GLIBC_TUNABLES, another malloc preloaded) or where glibc is not the C library; one process
    a machine only (FSDP2's per-block gathers on a CPU are another pattern, not measured so).
    Returns whether it applied."""
    import ctypes

    if not sys.platform.startswith("linux") or any(k.startswith("MALLOC_") or k == "GLIBC_TUNABLES" for k in os.environ):
        return False
    if "malloc" in os.environ.get("LD_PRELOAD", ""):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 * 2**20)) and bool(mallopt(m_trim_threshold, 256 * 2**20))


def free_memory() -> None:
    """Give back what a finished (or failed) run held: unreachable objects, and the CUDA cache
    (so that the next job of a multirun starts with the whole GPU)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_state(device: torch.device | None = None) -> dict:
    """Every random number generator a training step draws from, as checkpointable data
    (tensors and plain Python values only: checkpoints are loaded with weights_only=True)."""
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {
            **np_state,
            "state": {"key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)), "pos": np_state["state"]["pos"]},
        },
        "torch": torch.get_rng_state(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)  # this process's GPU only
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state["numpy"])
    np_state["state"] = {"key": state["numpy"]["state"]["key"].numpy().astype(np.uint32), "pos": state["numpy"]["state"]["pos"]}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"], torch.cuda.current_device())


# Dense (not 2:4-sparse) bf16 tensor-core peaks in FLOP/s, for the MFU estimate; fp16 for GPUs
# without bf16 (V100, T4), which train in fp16 (pick_dtype). From NVIDIA's datasheets, whose
# tables show the sparse figure, twice the dense one ("* with sparsity"): H100 (SXM 1,979 /
# PCIe 1,513 / NVL 1,671), H200 (SXM 1,979 / NVL 1,671), GH200 (1,979), HGX B200 (4.5 PF),
# GB200 NVL72 (360 PF / 72 GPUs), A100 (624), A30 (330), A40 (299.4), A10 (250), L40S (733),
# L40 (362.1), L4 (242); from the architecture whitepapers for the GeForce cards (Ada: RTX 4090,
# 330.3 sparse, bf16 with fp32 accumulate; GA102: RTX 3090, 142 sparse); V100 (SXM2 125,
# PCIe 112, V100S 130) and T4 (65) fp16, dense. Not listed, so no MFU unless train.peak_flops
# is given: the A10G (AWS's variant of the A10, with no NVIDIA datasheet: third parties quote
# 62.5 to 70 TFLOP/s, against the A10's 125) and any GPU this table does not know.
#
# Matched against torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
# "NVIDIA A100-SXM4-80GB", "Tesla V100-PCIE-32GB") as whole words, ignoring case, first match
# wins: a variant comes before its family ("H100 PCIe" before "H100", which is the SXM/HBM3
# part), and "L4" does not match "L40S", nor "A10" "A10G" or "A100", nor "H200" "GH200".
PEAK_FLOPS = {
    "GB200": 2500e12,
    "B200": 2250e12,
    "GH200": 989e12,
    "H200 NVL": 835e12,
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,
    "A100": 312e12,
    "A30": 165e12,
    "A40": 149.7e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100S": 130e12,
    "V100-PCIE": 112e12,
    "V100": 125e12,
    "T4": 65e12,
}


def peak_flops(device: torch.device, override: float | None = None) -> float | None:
    """Peak FLOP/s of the accelerator: `override` (train.peak_flops) when given, else the
    PEAK_FLOPS entry matching the GPU's name; None when unknown (then no MFU is reported)."""
    if override:
        return float(override)
    if device.type != "cuda":
        return None
    return lookup_peak_flops(torch.cuda.get_device_name(device))


def lookup_peak_flops(name: str) -> float | None:
    """The PEAK_FLOPS entry for a GPU's name (see above), or None."""
    if re.search(r"\bMIG\b", name):  # a MIG slice ("... MIG 1g.10gb") has a share of the GPU's SMs, not its peak
        return None
    for key, value in PEAK_FLOPS.items():
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name, re.IGNORECASE):
            return value
    return None
