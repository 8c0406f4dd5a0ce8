"""FSDP2 (`distributed=fsdp`): every process holds 1/N of each parameter, its gradient and its
optimizer state, and gathers a block's full weights only while that block runs.

torch's `fully_shard` does the sharding (per-parameter DTensors, one all-gather per block forward
and backward, one reduce-scatter of the gradients); this module applies it to a GPT and moves
tensors in and out of the sharded world: step checkpoints are written shard by shard
(gpt.checkpoints.shards) and read back into the shards (`load_targets`); best.pt holds the
weights gathered whole (`whole_state_dict`); a whole checkpoint (one written without FSDP) is
sliced into this process's shards (`shard_like`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from gpt.errors import TinyGPTError
from gpt.model import meta
from gpt.runtime import devices


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
    if not hasattr(model, "transformer"):  # a recurrent model resumed or started from (init_from)
        raise TinyGPTError("distributed=fsdp shards a GPT block by block; this run's model is recurrent: use distributed=ddp")
    policy = MixedPrecisionPolicy()
    if rt.device.type == "cuda" and rt.dtype == torch.bfloat16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs = {"offload_policy": CPUOffloadPolicy(pin_memory=rt.device.type == "cuda")} if offload else {}
    for block in model.transformer.h:
        if rt.compile:
            block.compile()
        fully_shard(block, mp_policy=policy, **kwargs)
    fully_shard(model, mp_policy=policy, **kwargs)
    return model


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
    rank0 = torch.distributed.get_rank() == 0
    tied = meta.tied_names(model)  # the LM head tied to the embedding
    for name, shard in model.state_dict().items():
        if name in tied:  # filled under its first name
            continue
        value = None
        if rank0:  # one copy: to the device, the shard's dtype and contiguous at once (.to alone
            # leaves a view of the right dtype as it is, hence .contiguous())
            value = whole[name].to(device=device, dtype=shard.dtype, memory_format=torch.contiguous_format).contiguous()
        if isinstance(shard, DTensor) and _rows_of_one_group(shard):
            _scatter_rows(value, shard.to_local(), shard.shape, device)
        elif isinstance(shard, DTensor):  # another layout: torch's scatter (each process allocates the whole shape)
            if value is None:
                value = torch.empty(shard.shape, dtype=shard.dtype, device=device)
            shard.to_local().copy_(distribute_tensor(value, shard.device_mesh, shard.placements, src_data_rank=0).to_local())
        else:  # (a fully sharded GPT has none; sent whole if it had)
            if value is None:
                value = torch.empty(shard.shape, dtype=shard.dtype, device=device)
            torch.distributed.broadcast(value, src=0)
            shard.copy_(value)
        del value


def _rows_of_one_group(t: DTensor) -> bool:
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


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def named_shards(model: nn.Module):
    """`model.named_parameters()`, sharded where the model is: after a forward with no backward
    (an eval) FSDP2 leaves the root unit's weights gathered (it expects the backward to need
    them), and the module then holds plain tensors in FSDP's own memory, which a reader must not
    touch (numpy() pins that memory, and the next reshard fails to free it)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return model.named_parameters()


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of `t` (t itself when it is not sharded)."""
    return t.to_local() if isinstance(t, DTensor) else t


def gathered(value, keep: bool = True):
    """`value` (a tensor, or dicts and lists of them: a state dict, an optimizer's) with every
    sharded tensor gathered whole, on the CPU. A collective: every process calls it, with state of
    the same layout; where `keep` is false (every rank but the writer) each whole tensor is
    dropped as soon as it is gathered, so that only one process ever holds the whole state.
    (torch's get_state_dict(full_state_dict=True, cpu_offload=True) does this for the model, but
    keys an optimizer's state by parameter name; tinygpt checkpoints key it by position, so one
    walk serves both.)"""
    if isinstance(value, DTensor):
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
        if isinstance(param, DTensor) and placeholder.shape == param.shape:
            return torch.empty_like(param, dtype=placeholder.dtype)
        return torch.empty(placeholder.shape, dtype=placeholder.dtype)

    return target


def shard_like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A copy of `value` (an optimizer state tensor from a checkpoint), cut to this process's
    shard of `param` the way `param` is cut where it is sharded and `value` is whole. Only the
    shard is copied: `value` may be mapped from the checkpoint file, and a shard left as a view
    would keep the whole tensor alive."""
    if isinstance(param, DTensor) and not isinstance(value, DTensor) and value.shape == param.shape:
        # Every process holds the whole tensor already: each slices its own part where the tensor
        # lies and moves only that to the shard's device. (distribute_tensor would first move the
        # whole tensor to the mesh's device: the GPU, even where cpu_offload keeps the shards in host memory.)
        part = _own_part(value, param)
        own = torch.empty(part.shape, dtype=part.dtype, device=param.to_local().device).copy_(part)
        return DTensor.from_local(own, param.device_mesh, param.placements, shape=param.shape, stride=param.stride())
    if isinstance(value, DTensor) and value.placements == getattr(param, "placements", None):
        return value  # read from a sharded checkpoint into a fresh tensor cut like `param` (load_targets): its own already
    return value.clone()


def _own_part(whole: torch.Tensor, param: DTensor) -> torch.Tensor:
    """The view of `whole` (the shape of `param`) that is this process's shard of `param`."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    sizes, offsets = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    for dim, (size, offset) in enumerate(zip(sizes, offsets)):
        whole = whole.narrow(dim, offset, size)
    return whole


def fill_initial(model: nn.Module, fills: list[tuple], rng_state: torch.Tensor) -> None:
    """A new model built on the meta device, sharded and materialized, given the initial weights
    one process would have drawn, with no process holding more than one whole tensor: every
    process replays the build's torch.nn.init fills (`fills`: gpt.model.meta.named_fills) in their
    order on whole tensors in host memory, from rank 0's random generator state before its build
    (`rng_state`), and keeps its own part of each. The same random numbers as a build with memory
    (a sharded run starts where one process starts; tests/test_fsdp.py compares their losses),
    without rank 0 building the whole model first. Every process but rank 0 then takes its own
    generator state back (ranks are seeded apart, for dropout); rank 0's goes on from the build's.

    What torch lacked: DTensor's random fills draw from an offset-based generator of their own,
    so a sharded model initialised in place gets other values than the same model built whole."""
    own_state = torch.get_rng_state()
    torch.set_rng_state(rng_state)
    params = dict(model.named_parameters())
    filled = set()
    with torch.no_grad():
        for name, fill, shape, dtype, place, args, kwargs in fills:
            if name is None:  # drawn for the generator's sake only (see named_fills)
                fill(torch.empty(shape, dtype=dtype), *args, **kwargs)
                continue
            target = params[name]
            whole = torch.empty(target.shape, dtype=target.dtype)
            own = _own_part(whole, target) if isinstance(target, DTensor) else whole
            if place is not None:  # a fill of a part: the rest of this process's rows stay as they are
                own.copy_(local(target))
            fill(whole if place is None else whole.as_strided(*place), *args, **kwargs)
            local(target).copy_(own)
            if place is None:
                filled.add(name)
    if torch.distributed.get_rank() != 0:
        torch.set_rng_state(own_state)
    unfilled = sorted(set(params) - filled)
    if unfilled:  # a parameter given its values some other way than torch.nn.init: never train on garbage
        raise TinyGPTError(f"{', '.join(unfilled)}: no initial value recorded for a sharded start; report this")
