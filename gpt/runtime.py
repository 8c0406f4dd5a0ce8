"""Device, precision and compilation: decided once, in one place, with the reason recorded."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field

import numpy as np
import torch

from gpt.errors import TinyGPTError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # compute dtype of the forward/backward pass (weights stay fp32)
    compile: bool
    reasons: list[str] = field(default_factory=list)

    @property
    def use_grad_scaler(self) -> bool:
        # fp16 has too little range for small gradients; bf16 has fp32's range and needs no scaling.
        return self.dtype == torch.float16

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def describe(self) -> str:
        return "; ".join(self.reasons)


def _mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def pick_device(requested: str = "auto") -> tuple[torch.device, str]:
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda"), f"device cuda ({torch.cuda.get_device_name()}), auto-detected"
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
    return torch.device(requested), f"device {requested} (forced by config)"


def pick_dtype(device: torch.device, requested: str = "auto") -> tuple[torch.dtype, str]:
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
    # CPUs without native bf16 emulate it slowly, and MPS autocast is still patchy: stay in fp32.
    return torch.float32, f"dtype float32 (default on {device.type})"


def pick_compile(device: torch.device, requested: str | bool = "auto") -> tuple[bool, str]:
    if requested not in ("auto", True, False):
        raise TinyGPTError(f"compile={requested!r} is not understood; use compile=auto, compile=true or compile=false")
    if requested == "auto":
        on = device.type == "cuda"
        why = "on for CUDA" if on else f"off on {device.type}: compile time outweighs the gain for small runs"
        return on, f"compile {why}"
    return bool(requested), f"compile {'on' if requested else 'off'} (set in config)"


def setup(device: str = "auto", dtype: str = "auto", compile: str | bool = "auto") -> Runtime:
    dev, why_dev = pick_device(device)
    dt, why_dt = pick_dtype(dev, dtype)
    comp, why_comp = pick_compile(dev, compile)
    reasons = [why_dev, why_dt, why_comp]
    if dev.type == "cuda":
        # TF32 matmuls: ~free speed on Ampere+ with no visible effect on training.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        reasons.append("TF32 matmuls on")
    return Runtime(device=dev, dtype=dt, compile=comp, reasons=reasons)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
