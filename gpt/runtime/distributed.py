"""torchrun / DDP plumbing: who am I, talk to the others, and a no-op when running alone.

Launched by torchrun, the environment carries RANK, LOCAL_RANK and WORLD_SIZE; then a process
group is created (NCCL on GPUs, gloo on CPU). Run plainly, everything here degrades to the
single-process case, so the trainer never branches on "am I distributed?".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from gpt.errors import TinyGPTError
from gpt.runtime import devices


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1  # processes on this node
    # started by a launcher (torchrun, SLURM) that gave it a place to meet (MASTER_ADDR), so a
    # process group can form even of one process
    launched: bool = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env() -> Dist:
    """The process's place in the job: torchrun's RANK / LOCAL_RANK / WORLD_SIZE, else SLURM's
    per-task variables (one task per GPU, e.g. via the submitit launcher), else rank 0 of 1."""
    env = os.environ
    if "RANK" in env or "SLURM_NTASKS" not in env:
        size = int(env.get("WORLD_SIZE", 1))
        rank, local_rank, per_node = (
            int(env.get("RANK", 0)),
            int(env.get("LOCAL_RANK", 0)),
            int(env.get("LOCAL_WORLD_SIZE", size)),
        )
        return Dist(rank, local_rank, size, per_node, launched="RANK" in env and "MASTER_ADDR" in env)
    per_node = _slurm_tasks_on_this_node(env)
    placed = int(env.get("SLURM_PROCID", 0)), int(env.get("SLURM_LOCALID", 0)), int(env["SLURM_NTASKS"]), per_node
    return Dist(*placed, launched="MASTER_ADDR" in env)


def _slurm_tasks_on_this_node(env) -> int:
    """SLURM_TASKS_PER_NODE lists every node's task count in node order, runs compressed
    ("2(x3),1": three nodes of 2, then one of 1); SLURM_NODEID picks ours. SLURM_NTASKS_PER_NODE
    is only set when --ntasks-per-node was given, so it is the fallback."""
    counts: list[int] = []
    for part in env.get("SLURM_TASKS_PER_NODE", "").split(","):
        number, _, repeat = part.partition("(x")
        if number.strip().isdigit():
            counts += [int(number)] * (int(repeat.rstrip(")")) if repeat else 1)
    node = int(env.get("SLURM_NODEID", 0))
    if node < len(counts):
        return counts[node]
    return int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0])


def _collective_timeout() -> timedelta:
    """How long a collective may wait for a rank before the job fails: 30 minutes (NCCL's default
    is 10), room for rank 0 alone writing a large checkpoint or scoring eval tasks;
    TINYGPT_DIST_TIMEOUT_S sets another."""
    return timedelta(seconds=float(os.environ.get("TINYGPT_DIST_TIMEOUT_S", 30 * 60)))


# Preparing a corpus (tokenizing FineWeb-Edu's 10B tokens) takes hours on one process per node,
# longer than any sane collective timeout; the other ranks wait for it in a gloo group of its own
# (host-side, outside NCCL's watchdog) with this much patience.
PREPARATION_TIMEOUT = timedelta(days=2)
_patient_group = None
_ours = False  # whether the process group is ours to destroy (a program may have made its own)
_store = None  # the job's rendezvous store, joined once a process (`meet`)
_groups = 0  # process groups made over it so far (each under a prefix of its own)


def meet(d: Dist) -> None:
    """Join the job's rendezvous store (once a process; hosted by rank 0, or by torchrun's agent)
    and listen there for another process's failure (gpt.runtime.alarm). Called as a run starts,
    before rank 0 alone claims its directory: a process that fails before the process group forms
    tells the others too. Nothing to do alone, or where the program made its own group."""
    global _store
    if not d.enabled or _store is not None or dist.is_initialized():
        return
    _require_a_meeting_place(d)
    from gpt.runtime import alarm

    timeout = _collective_timeout()
    store, _, _ = next(dist.rendezvous("env://", rank=d.rank, world_size=d.world_size, timeout=timeout))
    store.set_timeout(timeout)
    # keys of this attempt's own: torchrun --max-restarts starts the processes again, and an earlier
    # attempt's failure must not stop them
    _store = dist.PrefixStore(f"tinygpt/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    hosting = d.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"  # else torchrun's agent hosts it
    alarm.listen(_store, d.rank, d.world_size, hosting)


def _require_a_meeting_place(d: Dist) -> None:
    if "MASTER_ADDR" not in os.environ:
        raise TinyGPTError(
            f"{d.world_size} processes but no MASTER_ADDR / MASTER_PORT to meet at; launch with torchrun, or export them "
            f"(under SLURM: MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1), MASTER_PORT=29500)"
        )


def init(d: Dist, device: torch.device, host_tensors: bool = False, alone: bool = False) -> None:
    """`host_tensors`: collectives on CPU tensors too, beside a GPU's (FSDP2's CPU offload keeps the
    shards, their gradients and the optimizer in host memory): gloo for those, NCCL for the GPU's.
    `alone`: a group of one process too, when the launcher started one (FSDP2 shards over a group,
    and on one GPU its CPU offload is what lets a larger model train)."""
    global _patient_group, _ours, _groups
    if not (d.enabled or (alone and d.launched)):
        return
    if dist.is_initialized():  # the program's own group: ours is only the patient one beside it
        if _patient_group is None and dist.get_world_size() > 1:
            _patient_group = dist.new_group(backend="gloo", timeout=PREPARATION_TIMEOUT)
        return
    _require_a_meeting_place(d)
    meet(d)
    # Each group made over the store gets keys of its own: a sweep's jobs make one each, in the same processes.
    where = {}
    if _store is not None:
        _groups += 1
        where = {"store": dist.PrefixStore(f"tinygpt/group{_groups}", _store)}
    # RANK and WORLD_SIZE go to the rendezvous from `d` as well: ones already in the environment
    # may be stale (left by an earlier group in this process)
    os.environ.setdefault("RANK", str(d.rank))
    os.environ.setdefault("WORLD_SIZE", str(d.world_size))
    os.environ.setdefault("LOCAL_RANK", str(d.local_rank))
    if device.type == "cuda":
        if device.index is None:  # alone: the GPU torch uses now
            device = torch.device("cuda", torch.cuda.current_device())
        if d.enabled and device.index != devices.gpu_of(d.local_rank):
            raise TinyGPTError(
                f"device={device} under {d.world_size} processes would put every process on one GPU; use device=auto or device=cuda"
            )
        torch.cuda.set_device(device)
        backend = "cuda:nccl,cpu:gloo" if host_tensors else "nccl"
        dist.init_process_group(
            backend, device_id=device, timeout=_collective_timeout(), rank=d.rank, world_size=d.world_size, **where
        )
    elif device.type == "cpu":
        dist.init_process_group("gloo", timeout=_collective_timeout(), rank=d.rank, world_size=d.world_size, **where)
    else:
        raise TinyGPTError(f"distributed training on {device.type} is not supported; use CUDA GPUs or device=cpu")
    _ours = True
    _patient_group = dist.new_group(backend="gloo", timeout=PREPARATION_TIMEOUT)


def shutdown() -> None:
    """Destroy the process group tinygpt made (a program's own group stays; only the patient
    group beside it goes). The rendezvous store and its listener stay for the process's next run."""
    global _patient_group, _ours
    if _ours and dist.is_initialized():
        dist.destroy_process_group()
    elif _patient_group is not None and dist.is_initialized():
        dist.destroy_process_group(_patient_group)
    _patient_group, _ours = None, False


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
    return bool(max_tensor(torch.tensor([1.0 if flag else 0.0], device=device), d).item())


def max_tensor(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """The elementwise max of t over all ranks, left on the device (no host read: on a GPU the
    all-reduce is queued like any kernel)."""
    if not d.enabled:
        return t
    t = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def broadcast(obj, d: Dist):
    """Rank 0's value of a picklable object, on every rank."""
    if not d.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj, d: Dist) -> list:
    """Every rank's value of a picklable object, as a list indexed by rank (on every rank)."""
    if not d.enabled:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(d: Dist, patient: bool = False) -> None:
    """Wait for every rank. `patient`: a wait as long as a corpus takes to prepare (see
    PREPARATION_TIMEOUT), where the others wait for local rank 0's work."""
    if d.enabled:
        dist.barrier(group=_patient_group if patient else None)
