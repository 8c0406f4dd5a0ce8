"""How a run's model is spread over its processes, decided once (`choose`, into a `Parallel`) and
applied by that value (`Parallel.shard`, `.materialize`, `.forwards`): whole (one process), DDP
(a copy per process, gradients all-reduced) or FSDP2 (`distributed=fsdp`: every process holds 1/N of each parameter, its gradient and its
optimizer state, and gathers a block's full weights only while that block runs).
torch's `fully_shard` does the sharding (per-parameter DTensors, one all-gather per block forward
and backward, one reduce-scatter of the gradients); this module applies it to a GPT and moves
tensors in and out of the sharded world: a new model's weights are rank 0's, sent shard by shard
(`load_from_rank_0`); step checkpoints are written shard by shard (gpt.checkpoints.shards) and
read back into the shards (`load_targets`); best.pt holds the weights gathered whole
(`whole_state_dict`); a whole checkpoint (one written without FSDP) is sliced into this process's
shards (`shard_like`). The rest of training asks only `Parallel.lockstep` and calls the helpers
here, which are the identity on a model that is not sharded.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from gpt.errors import TinyGPTError
from gpt.runtime import devices


@dataclass(frozen=True)
class Parallel:
    """The wrapping of one run: `how` is "whole", "ddp" or "fsdp"; `offload`: FSDP2's shards in
    host memory (cpu_offload)."""

    how: str = "whole"
    offload: bool = False
    processes: int = 1

    @property
    def sharded(self) -> bool:
        return self.how == "fsdp"

    @property
    def lockstep(self) -> bool:
        """Whether the model computes only with every process taking part (a sharded model's
        forward gathers its weights): then every process runs what rank 0 shows (samples, task
        scores) and decoding takes rank 0's tokens."""
        return self.sharded

    def describe(self) -> str:
        """The start-up line's part on the processes ('' for one whole model)."""
        if self.how == "whole":
            return ""
        n = f"{self.processes} process{'es' if self.processes > 1 else ''}"
        how = f"FSDP2{' with CPU offload' if self.offload else ''}" if self.sharded else "DDP"
        return f"; {how} over {n}"

    def shard(self, model: nn.Module, rt: devices.Runtime) -> nn.Module:
        """`model` sharded in place where this run shards (see `shard`); as it is otherwise."""
        return shard(model, rt, self.offload) if self.sharded else model

    def materialize(self, model: nn.Module, device: torch.device) -> None:
        materialize(model, device, self.offload)

    def forwards(self, model: nn.Module, rt: devices.Runtime, dist) -> tuple[nn.Module, nn.Module]:
        """(the training forward, the evaluation forward): compiled when asked, DDP-wrapped under
        DDP; a sharded model is its own (`shard` compiled its blocks)."""
        if self.sharded:
            return model, model
        compiled = torch.compile(model) if rt.compile else model
        if self.how != "ddp":
            return compiled, compiled
        from torch.nn.parallel import DistributedDataParallel as DDP

        device_ids = [rt.device.index] if rt.device.type == "cuda" else None
        # No buffer broadcast: the model's buffers are fixed tables (RoPE, sinusoids) equal on
        # every rank, and broadcasting them before every forward costs a collective per step (2.13
        # renamed the switch and broadcasts them once at the start). Gradients in DDP's buckets.
        no_sync = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else "broadcast_buffers"
        wrapped = DDP(compiled, device_ids=device_ids, gradient_as_bucket_view=True, **{no_sync: False})
        return wrapped, compiled


def choose(distributed: str, cpu_offload: bool, dist) -> Parallel:
    """The wrapping of a run of `distributed` (the setting: ddp or fsdp) over `dist`'s processes:
    FSDP2 under torchrun shards over its processes, one included (its offload then fits a larger
    model on one GPU); DDP when there are several; else one whole model."""
    if distributed == "fsdp" and (dist.enabled or dist.launched):
        return Parallel("fsdp", cpu_offload, dist.world_size)
    return Parallel("ddp" if dist.enabled else "whole", False, dist.world_size)


def notice(distributed: str, cpu_offload: bool, chosen: Parallel) -> str | None:
    """What to say when the setting asks for shards and there is one process to hold them."""
    if distributed != "fsdp" or chosen.sharded:
        return None
    off = ", on its device (cpu_offload applies to shards)" if cpu_offload else ""
    return (
        "notice: distributed=fsdp shards the model over the processes torchrun starts; this is one process, so it trains "
        f"whole{off} (torchrun --nproc_per_node=1 shards it over one)"
    )


def check(settings, dtype) -> None:
    """What distributed=fsdp does not cover (yet), refused before anything runs: recurrent models
    (nothing to shard by block), fp16 loss scaling."""
    from gpt.config.model import RNNConfig

    if settings.distributed != "fsdp":
        return
    if isinstance(settings.model, RNNConfig):
        raise TinyGPTError(
            f"distributed=fsdp shards a GPT block by block; model.arch={settings.model.arch} is recurrent: use distributed=ddp"
        )
    if dtype == torch.float16:
        raise TinyGPTError("distributed=fsdp trains in bfloat16 or float32, not float16; pass dtype=bfloat16 or dtype=float32")


def is_sharded(t) -> bool:
    """Whether `t` is a sharded tensor (a DTensor). torch.distributed.tensor is not imported for
    the check (0.5 s of every start that shards nothing): no DTensor exists before it is loaded."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def whole(t: torch.Tensor) -> torch.Tensor:
    """`t` whole: a sharded result (a gradient norm over every process's shards) reduced, a
    sharded update gathered."""
    return t.full_tensor() if is_sharded(t) else t


def shard(model: nn.Module, rt: devices.Runtime, offload: bool = False) -> nn.Module:
    """`model` (a GPT on this process's device, or shapes only on the meta device: `materialize`
    then gives it memory; in every process) sharded in place over the
    default process group: each transformer block one unit (its weights gathered for its own
    forward and backward only), the root the rest (the tied embedding and LM head, the final
    norm). Compiled block by block when `rt.compile` (a compiled block is one graph; the
    collectives between blocks stay outside it). On CUDA with bf16, the gathered weights are bf16
    and the gradients are reduced in fp32; the shards, and the optimizer, stay fp32. `offload`:
    the shards and their gradients in host memory (pinned, on CUDA), copied to the device for each
    all-gather: the optimizer steps them there."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    if not hasattr(model, "transformer"):  # a recurrent model resumed or started from (init_from)
        raise TinyGPTError("distributed=fsdp shards a GPT block by block; this run's model is recurrent: use distributed=ddp")
    policy = mixed_precision(rt)
    kwargs = {"offload_policy": CPUOffloadPolicy(pin_memory=rt.device.type == "cuda")} if offload else {}
    for block in model.transformer.h:
        if rt.compile:
            block.compile()
        fully_shard(block, mp_policy=policy, **kwargs)
    fully_shard(model, mp_policy=policy, **kwargs)
    return model


def mixed_precision(rt: devices.Runtime, param_dtype: torch.dtype | None = None):
    """FSDP2's precision: on CUDA with bf16 the weights are gathered in bf16 and the gradients
    reduced in fp32; elsewhere fp32 throughout (`param_dtype` says otherwise, for tests). The
    blocks' inputs are never cast: torch's default casts every floating input of a sharded module
    to the weights' dtype, and RoPE's cos/sin tables would enter attention in bf16, rotating far
    positions less exactly than one process does (torchtitan does the same). The residual stream
    is bf16 anyway, from the bf16 weights; norms take their statistics in fp32 (RMSNorm by itself,
    LayerNorm under autocast)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if param_dtype is None and rt.device.type == "cuda" and rt.dtype == torch.bfloat16:
        param_dtype = torch.bfloat16
    if param_dtype is None:
        return MixedPrecisionPolicy(cast_forward_inputs=False)
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)


def load_from_rank_0(model: nn.Module, whole: dict, device: torch.device) -> None:
    """The sharded, materialized `model` filled with rank 0's whole weights (`whole`; {} on every
    other rank, which never held them), one tensor at a time: rank 0 scatters each tensor's
    shards (torch's distribute_tensor from rank 0) and every process copies its own into place.
    Ranks are seeded apart (for dropout), so rank 0's initial weights are the model's, as DDP
    makes them when it wraps.

    What torch's set_model_state_dict(broadcast_from_rank0=True) lacked: it broadcasts each
    tensor as it is given, and a finetune's base arrives mapped from its file (gpt.checkpoints.
    loading, mapped=True), GPT-2's Conv1D weights as transposed views of it, which the other
    processes then received in the order of the file's storage, not the view's (a GPT-2 folder's
    sharded finetune was 0.0075 off one process's loss). Here each is made a contiguous tensor of
    the shard's dtype (fp32; the file's may be bf16), one at a time: rank 0 holds one whole tensor
    at most beside the mapping (a tied table is sent once), and every other process receives its
    rows only (`_scatter_rows`: torch's distribute_tensor would have each allocate a whole tensor
    to receive into, device memory on a GPU). `device`: the run's, where the collectives run
    (under cpu_offload the shards themselves sit in host memory)."""
    from torch.distributed.tensor import distribute_tensor

    rank0 = torch.distributed.get_rank() == 0
    from gpt.model import meta

    tied = meta.tied_names(model)  # the LM head tied to the embedding
    for name, shard in model.state_dict().items():
        if name in tied:  # filled under its first name
            continue
        value = None
        if rank0:  # one copy: to the device, the shard's dtype and contiguous at once (.to alone
            # leaves a view of the right dtype as it is, hence .contiguous())
            value = whole[name].to(device=device, dtype=shard.dtype, memory_format=torch.contiguous_format).contiguous()
        if is_sharded(shard) and _rows_of_one_group(shard):
            _scatter_rows(value, shard.to_local(), shard.shape, device)
        elif is_sharded(shard):  # another layout: torch's scatter (each process allocates the whole shape)
            if value is None:
                value = torch.empty(shard.shape, dtype=shard.dtype, device=device)
            shard.to_local().copy_(distribute_tensor(value, shard.device_mesh, shard.placements, src_data_rank=0).to_local())
        else:  # (a fully sharded GPT has none; sent whole if it had)
            if value is None:
                value = torch.empty(shard.shape, dtype=shard.dtype, device=device)
            torch.distributed.broadcast(value, src=0)
            shard.copy_(value)
        del value


def _rows_of_one_group(t) -> bool:
    """Whether `t` is cut as fully_shard cuts a parameter over the default group: dim 0 in
    torch.chunk's pieces, piece r on rank r (a 1-D mesh of every process)."""
    from torch.distributed.tensor import Shard

    mesh = t.device_mesh
    return mesh.ndim == 1 and mesh.size() == torch.distributed.get_world_size() and list(t.placements) == [Shard(0)]


def _scatter_rows(value: torch.Tensor | None, local: torch.Tensor, shape: torch.Size, device: torch.device) -> None:
    """Rank 0's whole `value` cut into torch.chunk's row pieces, piece r into rank r's `local`;
    every other process allocates its piece only. torch's scatter takes pieces of one size: each is
    ceil(rows / N) rows, the last ones padded (views of rank 0's tensor but the padded one)."""
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    rows = -(-shape[0] // world)  # ceil: torch.chunk's piece size, which FSDP2's shards follow
    mine = max(0, min(rows, shape[0] - rank * rows))
    if local.shape[0] != mine:  # FSDP2 cut it another way than this assumes: say so, never load it wrong
        raise TinyGPTError(f"a shard of {tuple(shape)} holds {local.shape[0]} rows on rank {rank}, not {mine}; report this")
    piece = torch.empty((rows, *shape[1:]), dtype=local.dtype, device=device)
    pieces = None
    if value is not None:
        pieces = []
        for r in range(world):
            part = value[r * rows : (r + 1) * rows]
            if part.shape[0] < rows:  # the last pieces: padded to the common size
                part = torch.cat([part, part.new_zeros((rows - part.shape[0], *shape[1:]))])
            pieces.append(part)
    torch.distributed.scatter(piece, pieces, src=0)
    local.copy_(piece[:mine])


def materialize(model: nn.Module, device: torch.device, offload: bool = False) -> None:
    """A model built on the meta device (shapes only) and sharded: memory for this process's
    shards on `device`, or in host memory where they are offloaded (uninitialised: a checkpoint's
    shards are read into it next), and its fixed position tables computed on `device`, which no
    checkpoint holds."""
    model.to_empty(device="cpu" if offload else device)
    for name, table in model.fixed_tables().items():
        setattr(model, name, table.to(device))  # a buffer replaced: its length follows the config's context


def named_parameters(model: nn.Module):
    """`model.named_parameters()`, sharded where the model is: after a forward with no backward
    (an eval) FSDP2 leaves the root unit's weights gathered (it expects the backward to need
    them), and the module then holds plain tensors in FSDP's own memory, which a reader must not
    touch (numpy() pins that memory, and the next reshard fails to free it)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    for module in model.modules() if fsdp is not None else ():
        if isinstance(module, fsdp.FSDPModule):
            module.reshard()
    return model.named_parameters()


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of `t` (t itself when it is not sharded)."""
    return t.to_local() if is_sharded(t) else t


def gathered(value, keep: bool = True):
    """`value` (a tensor, or dicts and lists of them: a state dict, an optimizer's) with every
    sharded tensor gathered whole, on the CPU. A collective: every process calls it, with state of
    the same layout; where `keep` is false (every rank but the writer) each whole tensor is
    dropped as soon as it is gathered, so that only one process ever holds the whole state.
    (torch's get_state_dict(full_state_dict=True, cpu_offload=True) does this for the model, but
    keys an optimizer's state by parameter name; tinygpt checkpoints key it by position, so one
    walk serves both.)"""
    if is_sharded(value):
        whole = value.full_tensor()
        return whole.cpu() if keep else None
    if isinstance(value, dict):
        return {k: gathered(v, keep) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(gathered(v, keep) for v in value)
    return value


def whole_state_dict(model: nn.Module, keep: bool = True) -> dict | None:
    """The sharded `model`'s state dict gathered whole (see `gathered`), with a tied weight (the
    embedding and the LM head) one tensor under both names, as an unsharded model's is saved."""
    state = gathered(model.state_dict(), keep)
    if not keep:
        return None
    from gpt.model import meta

    for name, first in meta.tied_names(model).items():
        state[name] = state[first]
    return state


def load_targets(model: nn.Module, optimizer, saved_optimizer: dict) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """Where each tensor of a sharded checkpoint is read to, by its key (gpt.checkpoints.shards):
    a weight into the model's own shard of it, in place; an optimizer state tensor of its
    parameter's shape (AdamW's moments, Muon's momentum) into a new tensor cut like that
    parameter; anything else (step counts) whole. `optimizer.saved_params` maps the saved state
    to the parameters (and refuses state that does not fit)."""
    weights, params = model.state_dict(), optimizer.saved_params(saved_optimizer)

    def target(key: str, placeholder: torch.Tensor) -> torch.Tensor:
        kind, _, rest = key.strip("/").partition("/")
        if kind == "model":
            return weights[rest]
        where = rest.split("/")  # state/<index>/<name>
        param = params.get(int(where[1])) if where[0] == "state" and where[1].isdigit() else None
        if is_sharded(param) and placeholder.shape == param.shape:
            return torch.empty_like(param, dtype=placeholder.dtype)
        return torch.empty(placeholder.shape, dtype=placeholder.dtype)

    return target


def shard_like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A copy of `value` (an optimizer state tensor from a checkpoint), cut to this process's
    shard of `param` the way `param` is cut where it is sharded and `value` is whole. Only the
    shard is copied: `value` may be mapped from the checkpoint file, and a shard left as a view
    would keep the whole tensor alive."""
    if is_sharded(param) and not is_sharded(value) and value.shape == param.shape:
        from torch.distributed.tensor import DTensor

        # Every process holds the whole tensor already: each slices its own part where the tensor
        # lies and moves only that to the shard's device. (distribute_tensor would first move the
        # whole tensor to the mesh's device: the GPU, even where cpu_offload keeps the shards in host memory.)
        part = _own_part(value, param)
        own = torch.empty(part.shape, dtype=part.dtype, device=param.to_local().device).copy_(part)
        return DTensor.from_local(own, param.device_mesh, param.placements, shape=param.shape, stride=param.stride())
    if is_sharded(value) and value.placements == getattr(param, "placements", None):
        return value  # read from a sharded checkpoint into a fresh tensor cut like `param` (load_targets): its own already
    return value.clone()


def _own_part(whole: torch.Tensor, param) -> torch.Tensor:
    """The view of `whole` (the shape of `param`) that is this process's shard of `param`."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    sizes, offsets = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    for dim, (size, offset) in enumerate(zip(sizes, offsets)):
        whole = whole.narrow(dim, offset, size)
    return whole
