"""Everything a training run needs, built once and in order by `build_run(settings) -> Run`:

    runtime and processes -> where it resumes from -> data -> model (+ finetuning, LoRA)
    -> optimizer, loss scaler, batches -> restored state -> compiled / DDP-wrapped model

Every check that needs no data runs before the data is touched, so a typo fails in a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt.chat.template import ChatTokenizer
from gpt.checkpoints import checkpoint, loading
from gpt.checkpoints.checkpoint import Checkpoint
from gpt.config import RunConfig, changed_settings
from gpt.data import Dataset, load_data
from gpt.data.loader import RandomWindows
from gpt.data.prepare import SIZES
from gpt.errors import TinyGPTError
from gpt.evals.tasks import check_names as check_task_names
from gpt.model import compute, registry
from gpt.runtime import devices, distributed
from gpt.tokenizers import require_same
from gpt.tracking import ensure_console_logging, logger
from gpt.training.finetune import initial_model, prepare_finetune
from gpt.training.optim import CosineSchedule, Optimizer, build_optimizer


@dataclass
class Progress:
    """Where training stands: saved in every step checkpoint."""

    step: int = 0
    best_val: float = math.inf
    bad_total: int = 0  # non-finite steps skipped so far
    bad_in_a_row: int = 0
    last_eval: dict[str, float] = field(default_factory=dict)  # {"train", "val"} of the newest eval
    elapsed_s: float = 0.0  # wall-clock seconds the run took to reach the state saved or restored last
    best_elapsed_s: float | None = None  # elapsed seconds when best_val was reached


@dataclass
class Run:
    cfg: RunConfig
    dist: distributed.Dist
    rt: devices.Runtime
    out_dir: Path
    data: Dataset
    model: nn.Module  # the plain model: what is saved, sampled from and measured
    model_config: Any  # GPTConfig or RNNConfig
    lora: dict | None  # {"rank", "alpha"} while LoRA adapters are trained
    optimizer: Optimizer
    scaler: torch.amp.GradScaler
    schedule: CosineSchedule
    log: Callable[[str], None]  # rank 0 prints; the others are quiet
    # Set by build_run once the run exists:
    progress: Progress = field(default_factory=Progress)  # restored when resuming
    batches: RandomWindows | None = None  # this rank's training windows
    step_model: nn.Module | None = None  # compiled and/or DDP-wrapped: the training forward
    eval_model: nn.Module | None = None  # compiled only: evaluation needs no gradient sync
    tasks: dict[str, list] = field(default_factory=dict)  # train.eval_tasks' items (gpt.evals.tasks.Example), rank 0

    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / checkpoint.CKPT_DIR

    def batches_for(self, split: str, batch_size: int, seed: int):
        """This rank's batches of a split: random windows of the context over text, whole
        conversations (gpt.data.chat) over chat data."""
        if self.data.chat is not None:
            from gpt.data.chat import ConversationBatches

            return ConversationBatches(
                self.data.chat[split],
                self.model_config.block_size,
                batch_size,
                self.rt.device,
                seed=seed,
                rank=self.dist.rank,
                world_size=self.dist.world_size,
                length_buckets=self.cfg.data.length_buckets,
            )
        return self.windows(getattr(self.data, split), batch_size, seed)

    def windows(self, tokens, batch_size: int, seed: int) -> RandomWindows:
        """Random training windows of this run's context from `tokens`, this rank's share."""
        return RandomWindows(
            tokens,
            self.model_config.block_size,
            batch_size,
            self.rt.device,
            seed=seed,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
        )

    @property
    def tokens_per_step(self) -> int:
        ts = self.cfg.train
        return ts.batch_size * self.model_config.block_size * ts.grad_accum_steps * self.dist.world_size


def build_run(cfg: RunConfig, resume_point: loading.ResumePoint | None = None) -> Run:
    """`resume_point`: where the run continues from, when the caller has found it already (the
    command line, before Hydra writes anything); found here otherwise."""
    ensure_console_logging()
    dist = distributed.from_env()
    log = logger.info if dist.is_main else quiet
    # The model shape now (the vocabulary comes from the data later), so a typo fails before the
    # data is downloaded and prepared.
    registry.config_from_settings(cfg.model, vocab_size=1)
    check_task_names(cfg.train.eval_tasks)
    rt = devices.setup(
        cfg.device, cfg.dtype, cfg.compile, dist.local_rank if dist.enabled else None, cfg.threads, dist.local_world_size
    )
    distributed.init(dist, rt.device)
    # Under torchrun every process picked its own run directory: rank 0's is the one.
    out_dir = Path(distributed.broadcast(cfg.paths.output_dir or str(checkpoint.new_run_dir(cfg.paths.runs_dir)), dist))
    cfg.paths.output_dir = str(out_dir)
    cfg.paths.data_dir = str(cfg.paths.data_root())  # recorded as used
    source = _resume_source(cfg, out_dir, dist, log, resume_point)
    log(rt.describe() + (f"; DDP over {dist.world_size} processes" if dist.enabled else ""))
    # Per-rank seeds: ranks must not share dropout masks. (The data stream has its own
    # generator, seeded alike on every rank; see RandomWindows.)
    devices.seed_everything(cfg.seed + dist.rank)

    resumed = checkpoint.load(source) if source else None
    # The weights a new finetune starts from, loaded once: conversations are tokenized with their
    # tokenizer (a resumed finetune's checkpoint has it).
    base = loading.load(str(cfg.init_from), dropout=float(cfg.model.dropout)) if cfg.init_from and resumed is None else None
    base_tokenizer = (resumed.tokenizer if resumed is not None else base.tokenizer_spec) if cfg.init_from else None
    data = _load_data(cfg, dist, log, base_tokenizer)
    tasks = _eval_tasks(cfg, data, log) if dist.is_main else {}
    state = resumed.training if resumed is not None else None
    if state is not None and len(state.rng) == dist.world_size:  # its steps bitwise as if never stopped
        notice = rt.threads.adopt(state.threads)
        if notice:
            log(notice)
    model, model_config = _model(cfg, data, resumed, log, base)
    _resolve_horizon(cfg, model, model_config, dist, log)
    _resolve_schedule(cfg, resumed, log)
    lora = _finetune(model, cfg, resumed, log, new_tokens=isinstance(data.tokenizer, ChatTokenizer))
    model = model.to(rt.device)
    optimizer = build_optimizer(model, cfg.optim, rt.device)
    schedule = CosineSchedule.from_settings(cfg.optim, cfg.train.max_iters)
    scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.use_grad_scaler)
    run = Run(cfg, dist, rt, out_dir, data, model, model_config, lora, optimizer, scaler, schedule, log)
    run.batches = run.batches_for("train", cfg.train.batch_size, seed=cfg.seed)
    if data.chat is not None:
        _say_left_out(data, model_config.block_size, log)
    run.tasks = tasks
    if resumed is not None:
        run.progress = _restore(resumed, source, run)
    run.step_model, run.eval_model = _wrap(model, rt, dist)
    log(
        f"model {registry.summary(model_config)}: {model.num_params():,} parameters; micro-batch {cfg.train.batch_size} x "
        f"accum {cfg.train.grad_accum_steps} x {dist.world_size} process(es) = global batch of "
        + (
            f"{run.tokens_per_step // model_config.block_size:,} conversations/step (each padded to the longest of its length group)"
            if data.chat is not None
            else f"{run.tokens_per_step:,} tokens/step"
        )
    )
    log(f"optimizer {optimizer.describe()}")
    notice = rt.threads.load_notice()  # other work on our cores: said once, the count kept
    if notice:
        log(notice)
    return run


def quiet(*args, **kwargs) -> None:
    """A log for ranks other than 0."""


def _resume_source(cfg: RunConfig, out_dir: Path, dist: distributed.Dist, log, point: loading.ResumePoint | None) -> Path | None:
    """The checkpoint this run continues from: as the command line found it (`point`, examined
    once), else found now. Rank 0 decides (other nodes may not share its view of the filesystem)."""
    if dist.is_main:
        if point is None or point.run_dir is None or Path(point.run_dir).resolve() != out_dir.resolve():
            point = loading.resume_point(cfg.resume, out_dir)
        for path, reason in point.refused:  # newer checkpoints that cannot be resumed from
            aside = checkpoint.set_aside(path)
            log(f"notice: {reason}; set aside as {aside.name}, resuming from {point.source.name}")
        checkpoint.remove_leftovers(out_dir)
    source = distributed.broadcast(point.source if dist.is_main else None, dist)
    if cfg.finetune.require_init and not cfg.init_from and source is None:
        raise TinyGPTError(
            "this experiment needs a model to start from: pass init_from=<run dir | checkpoint | gpt2 | HF folder>"
        )
    return source


def _resolve_horizon(cfg: RunConfig, model: nn.Module, model_config, dist: distributed.Dist, log) -> None:
    """train.max_iters from a horizon given as compute (train.flops_budget / tokens_per_param),
    and the start-up line on what the run costs. Then no more eval batches than training steps:
    a smoke run of a big recipe (max_iters=20, eval_iters=200) would spend far longer evaluating
    than training."""
    ts = cfg.train
    tokens_per_step = ts.batch_size * model_config.block_size * ts.grad_accum_steps * dist.world_size
    figures = compute.counts(model)
    steps = compute.steps_for(ts, figures["flops_per_token"], figures["params_non_embedding"], tokens_per_step)
    if steps is not None:
        given = (
            f"train.flops_budget={ts.flops_budget:.3g}"
            if ts.flops_budget is not None
            else f"train.tokens_per_param={ts.tokens_per_param:g}"
        )
        log(f"{given}: train.max_iters {ts.max_iters:,} -> {steps:,}")
        ts.max_iters = steps
    log(compute.describe(figures, ts.max_iters, tokens_per_step))
    if ts.eval_iters > ts.max_iters:
        log(f"notice: eval_iters {ts.eval_iters} -> {ts.max_iters} (no more eval batches than training steps)")
        ts.eval_iters = ts.max_iters


def _resolve_schedule(cfg: RunConfig, resumed: Checkpoint | None, log) -> None:
    """The schedule's length and floor as numbers (checkpoints record what was used). A run from
    before `optim.min_lr_ratio` existed (its settings name a min_lr and no ratio) keeps its floor
    unless the command line gives one."""
    optim, saved = cfg.optim, (resumed.config.get("optim") or {}) if resumed is not None else {}
    optim.decay_iters = optim.decay_iters or cfg.train.max_iters
    if optim.min_lr is None and saved.get("min_lr") is not None and "min_lr_ratio" not in saved:
        optim.min_lr = saved["min_lr"]
        log(f"notice: keeping the checkpoint's optim.min_lr={optim.min_lr:g} (it predates optim.min_lr_ratio)")
    if optim.min_lr is None:
        optim.min_lr = optim.lr * optim.min_lr_ratio


def _load_data(cfg: RunConfig, dist: distributed.Dist, log, base_tokenizer: dict | None = None) -> Dataset:
    # One process per node prepares (nodes may not share a filesystem); the others wait, then read.
    if dist.local_rank == 0:
        data = load_data(cfg.data, cfg.paths.data_root(), log=log, base_tokenizer=base_tokenizer)
    distributed.barrier(dist)
    if dist.local_rank != 0:  # local rank 0 checked it
        data = load_data(cfg.data, cfg.paths.data_root(), log=quiet, verify=SIZES, base_tokenizer=base_tokenizer)
    log(
        f"data {data.name}: {Dataset.tokens(data.train):,} train / {Dataset.tokens(data.val):,} val tokens, "
        f"vocab {data.tokenizer.vocab_size}"
    )
    return data


def _eval_tasks(cfg: RunConfig, data: Dataset, log) -> dict[str, list]:
    """The items of train.eval_tasks, read and encoded once before training: a task that cannot
    be had (offline, no local copy) or read with this tokenizer fails now, not at the first eval."""
    from gpt.config import TaskSettings
    from gpt.evals.tasks import examples, requests

    out = {}
    for name in cfg.train.eval_tasks:
        out[name] = examples(TaskSettings(name, limit=cfg.train.eval_task_limit), cfg.paths.data_root())
        requests(data.tokenizer, name, out[name])
        log(f"task {name}: {len(out[name]):,} items scored at every eval")
    return out


def _model(cfg: RunConfig, data: Dataset, resumed: Checkpoint | None, log, base=None) -> tuple[nn.Module, Any]:
    """A new model, the weights to finetune (init_from, `base` when loaded already), or the shape
    of the run resumed."""
    if resumed is None and cfg.init_from:
        model = initial_model(cfg.init_from, data.tokenizer, cfg.finetune, float(cfg.model.dropout), log, loaded=base)
        config = model.config
    else:
        config = _model_config(cfg, data, resumed, log)
        model = registry.build(config)
    if data.chat is None:  # conversations are drawn whole: gpt.data.chat says which fit
        check_data_fits(data, config.block_size)
    return model, config


def _say_left_out(data: Dataset, block_size: int, log) -> None:
    """How many conversations are too long for the context: they are left out, not cut (a cut
    reply would teach the model to stop mid-answer, or never to end)."""
    parts = []
    for split, conversations in data.chat.items():
        too_long = int((conversations.lengths() > block_size + 1).sum())
        if too_long:
            parts.append(f"{too_long:,} of {len(conversations):,} {split}")
    if parts:
        log(
            f"notice: conversations longer than the context ({block_size + 1} tokens) are left out: {', '.join(parts)}; "
            f"a model with a longer context keeps them"
        )


def _model_config(cfg: RunConfig, data: Dataset, resumed: Checkpoint | None, log):
    vocab = data.tokenizer.vocab_size
    if cfg.model.vocab_size is not None and cfg.model.vocab_size < vocab:
        raise TinyGPTError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's {vocab} tokens; "
            f"set model.vocab_size=null to take it from the data"
        )
    config = registry.config_from_settings(cfg.model, vocab_size=vocab)
    if resumed is None:
        return config
    require_same(
        resumed.tokenizer,
        data.tokenizer.to_dict(),
        "the checkpoint's tokenizer differs from this data's",
        f"resume with the data the run was trained on (data={resumed.config.get('data', {}).get('name', '?')})",
    )
    saved = registry.config_from_dict(resumed.model_config)
    old, new = registry.config_to_dict(saved), registry.config_to_dict(config)
    diff = [
        f"model.{k}={new.get(k)!r} (checkpoint: {old.get(k)!r})" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)
    ]
    if diff:
        log(f"notice: resuming with the checkpoint's model settings; ignoring {', '.join(diff)}")
    return saved


def check_data_fits(data: Dataset, block_size: int) -> None:
    for split, shards in (("train", data.train), ("val", data.val)):
        longest = max((len(s) for s in shards), default=0)
        if longest < block_size + 1:
            raise TinyGPTError(
                f"model.block_size={block_size} is longer than the {split} split ({Dataset.tokens(shards)} tokens"
                f"{', in shards of at most ' + str(longest) if len(shards) > 1 else ''}); "
                f"use a block_size below {longest} or more data"
            )


def _finetune(model: nn.Module, cfg: RunConfig, resumed: Checkpoint | None, log, new_tokens: bool = False) -> dict | None:
    """Freezing and LoRA as configured; a resumed LoRA run keeps training its adapters."""
    ft = cfg.finetune
    trained = (resumed.lora or {}).get("rank", 0) if resumed is not None else 0
    if trained and not ft.lora_rank:
        ft.lora_rank, ft.lora_alpha = resumed.lora["rank"], resumed.lora["alpha"]
        log(f"notice: resuming a LoRA finetune (rank {ft.lora_rank}) with its adapters")
    elif resumed is not None and trained != ft.lora_rank:
        raise TinyGPTError(
            f"the checkpoint was trained with finetune.lora_rank={trained}; "
            f"resume with that value, or start a new run from it with init_from"
        )
    return prepare_finetune(model, ft, log, new_tokens)


def _restore(ckpt: Checkpoint, path: Path, run: Run) -> Progress:
    state = ckpt.training
    if state is None:
        raise TinyGPTError(f"{path} holds weights only (no optimizer state) and cannot be resumed; pass a ckpt-*.pt file")
    try:
        run.model.load_state_dict(ckpt.model)
        run.optimizer.load_state_dict(state.optimizer)
    except (RuntimeError, ValueError, KeyError) as e:  # checked up front (loading.resumable); a file changed since
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TinyGPTError(f"{path}: its weights or optimizer state do not fit this run ({first})") from None
    if run.scaler.is_enabled() and state.scaler:  # an fp32/bf16 run's scaler state is empty
        run.scaler.load_state_dict(state.scaler)
    run.batches.load_state_dict(state.loader)
    if len(state.rng) != run.dist.world_size:
        run.log(
            f"notice: the checkpoint was written by {len(state.rng)} process(es), this run has {run.dist.world_size}; "
            f"random streams restart (results stay valid, not bitwise identical)"
        )
    devices.set_rng_state(state.rng[run.dist.rank % len(state.rng)])
    changed = changed_settings(ckpt.config, asdict(run.cfg))
    run.log(
        f"resuming from {path} at step {ckpt.step} (best val loss {ckpt.best_val_loss:.4f})"
        + (f"; changed: {changed}" if changed else "")
    )
    return Progress(
        ckpt.step,
        ckpt.best_val_loss,
        state.bad_steps,
        state.bad_in_a_row,
        dict(ckpt.last_eval),
        state.elapsed_s,
        state.best_elapsed_s,
    )


def _wrap(model: nn.Module, rt: devices.Runtime, dist: distributed.Dist) -> tuple[nn.Module, nn.Module]:
    """(the training forward, the evaluation forward): compiled when asked, DDP under torchrun."""
    compiled = torch.compile(model) if rt.compile else model
    if not dist.enabled:
        return compiled, compiled
    device_ids = [rt.device.index] if rt.device.type == "cuda" else None
    return DDP(compiled, device_ids=device_ids), compiled
