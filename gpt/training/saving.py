"""A run's checkpoints: what one holds (filled here and nowhere else, in the format
gpt.checkpoints.checkpoint defines), and when a state is fit to be saved at all."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import torch

from gpt.checkpoints import checkpoint, runs
from gpt.checkpoints.checkpoint import Checkpoint, TrainingState
from gpt.errors import TinyGPTError
from gpt.model import registry
from gpt.model.lora import merged_state_dict
from gpt.runtime import devices, distributed
from gpt.training.sharding import gathered, is_sharded, local, whole_state_dict
from gpt.training.state import Run


def fill(run: Run, last_eval: dict[str, float], rng: list[dict] | None, whole: tuple[dict, dict] | None = None) -> Checkpoint:
    """What a checkpoint holds: with the training state (and LoRA adapters apart, to resume)
    given `rng` (every rank's random state), else the weights alone (adapters merged, for
    sampling and export). `whole`: the model's and the optimizer's state dicts gathered whole
    (`whole_state`), where the run is sharded."""
    p, model, full = run.progress, checkpoint.unwrap(run.model), rng is not None
    weights, optimizer = whole if whole is not None else (model.state_dict(), None)
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
            elapsed_s=p.elapsed_s,
            best_elapsed_s=p.best_elapsed_s,
        )
        if full
        else None
    )
    return Checkpoint(
        model=weights if (full or not run.lora) else merged_state_dict(model, weights),
        model_config=registry.config_to_dict(run.model_config),
        tokenizer=run.data.tokenizer.to_dict(),
        step=p.step,
        best_val_loss=p.best_val,
        last_eval=dict(last_eval),
        config=asdict(run.cfg),
        lora=run.lora if full else None,
        training=state if full else None,
    )


def whole_state(run: Run) -> tuple[dict, dict] | None:
    """Under FSDP2, the model's and the optimizer's state dicts with every shard gathered (every
    rank must call; rank 0 keeps and writes them): the checkpoint is then the one an unsharded run
    of the same model writes, read by every command and resumable at any number of processes.
    (Rank 0 holds the whole state in CPU memory while it writes; a sharded save through
    torch.distributed.checkpoint would not, and is not built yet.) None when not sharded."""
    if not is_sharded(run.model):
        return None
    keep = run.dist.is_main
    return whole_state_dict(run.model, keep), gathered(run.optimizer.state_dict(), keep)


def healthy(run: Run, last_eval: dict[str, float]) -> bool:
    """Whether the state is fit to save: no streak of non-finite steps open, a finite eval, and
    finite weights (a huge learning rate can overflow them before any loss shows it). Every
    rank gets the same answer."""
    finite = run.progress.bad_in_a_row == 0 and all(math.isfinite(v) for v in last_eval.values())
    if finite:
        with torch.no_grad():
            finite = bool(torch.stack([local(p).isfinite().all() for p in run.model.parameters()]).all())
    return not distributed.any_true(not finite, run.dist, run.rt.device)


def save(run: Run, last_eval: dict[str, float], best: bool, keep_last: int) -> Path | None:
    """A full-state checkpoint of the current step, and best.pt if `best` (rank 0 writes; every
    rank must call). Not while training is going wrong (see `healthy`): that state is no place
    to resume from, and retention would prune the good checkpoints for it. Returns the newest
    good checkpoint."""
    if not healthy(run, last_eval):
        run.log(f"notice: step {run.progress.step} not saved (non-finite loss or weights); checkpoints kept as they are")
        return runs.latest(run.out_dir)
    path = run.ckpt_dir / runs.step_file(run.progress.step)
    rng = distributed.gather(devices.rng_state(run.rt.device), run.dist)  # every rank's own
    whole = whole_state(run)
    failed: TinyGPTError | None = None
    if run.dist.is_main:
        try:
            if best:
                checkpoint.save(run.ckpt_dir / runs.BEST, fill(run, last_eval, rng=None, whole=whole))
            checkpoint.save(path, fill(run, last_eval, rng=rng, whole=whole))
            runs.prune(run.out_dir, keep_last)
        except TinyGPTError as e:  # e.g. a full disk: the other ranks must not wait for rank 0 forever
            failed = e
    if distributed.any_true(failed is not None, run.dist, run.rt.device):  # every rank learns of it, and stops
        raise failed or TinyGPTError(f"rank 0 could not save step {run.progress.step}; see its error")
    return path
