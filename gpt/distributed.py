"""torchrun / DDP plumbing: who am I, talk to the others, and a no-op when running alone.

Launched by torchrun, the environment carries RANK, LOCAL_RANK and WORLD_SIZE; then a process
group is created (NCCL on GPUs, gloo on CPU). Run plainly, everything here degrades to the
single-process case, so the trainer never branches on "am I distributed?".
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gpt.errors import TinyGPTError


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env() -> Dist:
    """The process's place in a torchrun job (rank 0 of 1 when not launched by torchrun)."""
    return Dist(
        rank=int(os.environ.get("RANK", 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
    )


def init(d: Dist, device: torch.device) -> None:
    if not d.enabled or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    elif device.type == "cpu":
        dist.init_process_group("gloo")
    else:
        raise TinyGPTError(f"distributed training on {device.type} is not supported; use CUDA GPUs or device=cpu")


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def mean(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """The mean of t over all ranks (t itself when alone)."""
    if not d.enabled:
        return t
    t = t.detach().clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t / d.world_size


def any_true(flag: bool, d: Dist, device: torch.device) -> bool:
    """True on every rank if it is true on any (so that all ranks take the same branch)."""
    if not d.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def broadcast(obj, d: Dist):
    """Rank 0's value of a picklable object, on every rank."""
    if not d.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()
