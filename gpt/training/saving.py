"""A run's checkpoints: what one holds (filled here and nowhere else, in the format
gpt.checkpoints.checkpoint defines), and when a state is fit to be saved at all."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import torch

from gpt.checkpoints import checkpoint, runs
from gpt.checkpoints.checkpoint import Checkpoint, TrainingState
from gpt.checkpoints.writer import Writer
from gpt.errors import TinyGPTError
from gpt.model import registry
from gpt.runtime import devices, distributed
from gpt.training.build import Run
from gpt.training.parallel import local, whole_state_dict


def fill(run: Run, last_eval: dict[str, float], rng: list[dict] | None, state: dict | None = None) -> Checkpoint:
    """What a checkpoint holds: with the training state (and LoRA adapters apart, to resume)
    given `rng` (every rank's random state), else the weights alone (adapters merged, for
    sampling and export). `state`: {"model", and "optimizer" with `rng`} to hold instead of the
    live ones, where the run is sharded (gathered whole, or the placeholders of its shards)."""
    p, model, full = run.progress, checkpoint.unwrap(run.model), rng is not None
    weights, optimizer = (state["model"], state.get("optimizer")) if state is not None else (model.state_dict(), None)
    state = (
        TrainingState(
            optimizer=optimizer if optimizer is not None else run.optimizer.state_dict(),
            scaler=run.scaler.state_dict(),
            loader=run.batches.state_dict(),
            rng=rng,
            bad_steps=p.bad_total,
            bad_in_a_row=p.bad_in_a_row,
            # a CPU run's count (a resume takes it: gpt.runtime.threads); a GPU run's host threads decide nothing
            threads=run.rt.threads.count if run.rt.threads is not None and run.rt.device.type == "cpu" else None,
            dtype=str(run.rt.dtype).removeprefix("torch."),  # a resume computes alike (gpt.runtime.devices.adopt_dtype)
            device_type=run.rt.device.type,
            ns_dtype=run.optimizer.ns_dtype,
            elapsed_s=p.elapsed_s,
            best_elapsed_s=p.best_elapsed_s,
            tokens_seen=p.tokens_seen,
        )
        if full
        else None
    )
    return Checkpoint(
        model=weights if (full or not run.lora) else _merged(model, weights),
        model_config=registry.config_to_dict(run.model_config),
        tokenizer=run.data.tokenizer.to_dict(),
        step=p.step,
        best_val_loss=p.best_val,
        last_eval=dict(last_eval),
        config=asdict(run.cfg),
        lora=run.lora if full else None,
        training=state if full else None,
    )


def sharded_state(run: Run, path: Path) -> dict:
    """Under FSDP2, a step checkpoint's weights and optimizer state written by every rank, each its
    own shards, into `path`'s shards folder (gpt.checkpoints.shards; every rank must call): no
    process ever holds the whole state. Returns what the checkpoint file holds in their place: the
    placeholders, and where the shards are under "shards"."""
    from gpt.checkpoints import shards

    skeleton, tensors = shards.split({"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict()})
    return skeleton | {"shards": shards.write(path, tensors, run.dist.is_main)}


def whole_weights(run: Run) -> dict | None:
    """Under FSDP2, the model's weights gathered whole (every rank must call; rank 0 keeps them),
    for best.pt: the weights alone (a quarter of the training state), in the format every reader
    knows, LoRA adapters merged as an unsharded run's are. None when not sharded."""
    if not run.parallel.sharded:
        return None
    return {"model": whole_state_dict(run.model, keep=run.dist.is_main)}


def healthy(run: Run, last_eval: dict[str, float]) -> bool:
    """Whether the state is fit to save: no streak of non-finite steps open, a finite eval, and
    finite weights (a huge learning rate can overflow them before any loss shows it). Every
    rank gets the same answer."""
    finite = run.progress.bad_in_a_row == 0 and all(math.isfinite(v) for v in last_eval.values())
    if finite:
        with torch.no_grad():
            finite = bool(torch.stack([local(p).isfinite().all() for p in run.model.parameters()]).all())
    return not distributed.any_true(not finite, run.dist, run.rt.device)


def save(run: Run, last_eval: dict[str, float], best: bool, keep_last: int, writer: Writer | None = None) -> Path | None:
    """A full-state checkpoint of the current step, and best.pt if `best` (rank 0 writes; every
    rank must call). Not while training is going wrong (see `healthy`): that state is no place
    to resume from, and retention would prune the good checkpoints for it. With a `writer`, the
    files are written in its thread from a copy of the state (gpt.checkpoints.writer): the
    previous save's write is waited for first, and its failure raised here. Returns the newest
    good checkpoint (with a writer: the one being written)."""
    failed = writer.wait() if writer is not None else None
    if failed is None and not healthy(run, last_eval):
        run.log(f"notice: step {run.progress.step} not saved (non-finite loss or weights); checkpoints kept as they are")
        return runs.latest(run.out_dir)
    path = run.ckpt_dir / runs.step_file(run.progress.step)
    rng = distributed.gather(devices.rng_state(run.rt.device), run.dist)  # every rank's own
    whole = whole_weights(run) if best else None
    sharded = None
    try:
        sharded = sharded_state(run, path) if run.parallel.sharded else None
    except TinyGPTError as e:  # every rank failed alike (DCP gathers the failures): the file is not written
        failed = failed or e
    if run.dist.is_main and failed is None:
        full = fill(run, last_eval, rng=rng, state=sharded)
        full.shards = sharded["shards"] if sharded is not None else None
        jobs = [(path, full)] + ([(run.ckpt_dir / runs.BEST, fill(run, last_eval, rng=None, state=whole))] if best else [])
        try:
            if writer is not None:
                writer.submit(jobs, then=lambda: runs.prune(run.out_dir, keep_last))
            else:
                for where, ckpt in jobs:
                    checkpoint.save(where, ckpt)
                runs.prune(run.out_dir, keep_last)
        except TinyGPTError as e:  # e.g. a full disk: the other ranks must not wait for rank 0 forever
            failed = e
    _agree(run, failed)
    return path


def flush(run: Run, writer: Writer | None) -> None:
    """Wait for the writer's checkpoint in flight (every rank must call): when this returns, it
    is on disk, or every rank raises the error that stopped it."""
    _agree(run, writer.wait() if writer is not None else None)


def _agree(run: Run, failed: TinyGPTError | None) -> None:
    if distributed.any_true(failed is not None, run.dist, run.rt.device):  # every rank learns of it, and stops
        # (a background write's failure is learned a save later: other ranks know only when)
        raise failed or TinyGPTError(f"rank 0 could not save a checkpoint (noticed at step {run.progress.step}); see its error")


def _merged(model, weights: dict) -> dict:
    """best.pt's weights with LoRA's adapters merged (gpt.model.lora, read only by a LoRA run)."""
    from gpt.model.lora import merged_state_dict

    return merged_state_dict(model, weights)
