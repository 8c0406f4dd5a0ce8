"""Step 3 of a start, the build: what a training run is made of (`Run`, and `Progress`, where it
stands), built once and in order by `build_run(settings) -> Run`:

    runtime and processes -> where it resumes from -> data -> model (+ finetuning, LoRA)
    -> sharded (FSDP2) -> optimizer, loss scaler, batches -> restored state -> compiled / DDP-wrapped model

Every check that needs no data runs before the data is touched (gpt.training.claim), so a typo
fails in a second. Set-up changes none of its input: what it resolves (the horizon from a compute
budget, the schedule's length and floor, a resumed LoRA's rank, the run directory) goes into the
settings of the `Run` it returns.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gpt.checkpoints import checkpoint, runs
from gpt.checkpoints.checkpoint import Checkpoint
from gpt.config import RunConfig, changed_settings
from gpt.config.model import GPTConfig, RNNConfig, as_given, ignored_settings
from gpt.data import Dataset, load_data
from gpt.data.loader import Batches, Prefetched
from gpt.data.shards import SIZES
from gpt.errors import TinyGPTError
from gpt.model import compute, registry
from gpt.runtime import devices, distributed
from gpt.tokenizers import require_same
from gpt.tracking import ensure_console_logging, logger
from gpt.training import parallel
from gpt.training.claim import Claim, ResumePoint, preflight, resume_point
from gpt.training.finetune import APPLY_TO_A_BASE, initial_model, prepare_finetune, resumed_finetune
from gpt.training.optim import CosineSchedule, build_optimizer
from gpt.training.parallel import Parallel

EVAL_PASS_TOKENS = 4096  # the most tokens an eval's forward pass takes by concatenating batches (Run.eval_group)


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
    # training tokens so far, over every resume (a resume may run another number of processes,
    # so not step x this run's tokens per step); None: a checkpoint from before they were counted
    tokens_seen: int | None = 0


@dataclass(kw_only=True)
class Run:
    """Everything a run needs, built once by `build_run`."""

    cfg: RunConfig  # the settings as resolved for this run (horizon, schedule, finetuning, paths)
    dist: distributed.Dist
    rt: devices.Runtime
    out_dir: Path
    data: Dataset  # text or conversations, behind one interface
    model: nn.Module  # the plain model: what is saved, sampled from and measured
    model_config: GPTConfig | RNNConfig
    lora: dict | None  # {"rank", "alpha"} while LoRA adapters are trained
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    schedule: CosineSchedule
    batches: Batches  # this rank's training batches (Dataset.batches)
    step_model: nn.Module  # compiled and/or DDP-wrapped: the training forward
    eval_model: nn.Module  # compiled only: evaluation needs no gradient sync
    log: Callable[[str], None]  # rank 0 prints; the others are quiet
    parallel: Parallel = field(default_factory=Parallel)  # whole, DDP or FSDP2 (gpt.training.parallel)
    progress: Progress = field(default_factory=Progress)  # restored when resuming
    tasks: dict[str, list] = field(default_factory=dict)  # train.eval_tasks' items (gpt.evals.tasks.Example), rank 0
    resumed_from: Path | None = None  # the checkpoint this start continued from (set-up's choice)

    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / runs.CKPT_DIR

    def batches_for(self, split: str, batch_size: int, seed: int, alone: bool = False) -> Batches:
        """This rank's batches of a split, as training draws them; `alone`: all of each batch, as
        one process draws them (an eval's, which the ranks then share out: Trainer.evaluate)."""
        rank, world = (0, 1) if alone else (self.dist.rank, self.dist.world_size)
        return self.data.batches(split, self.model_config.block_size, batch_size, self.rt.device, seed, rank, world)

    def eval_group(self, count: int) -> int:
        """How many of an eval's batches go through one forward pass. Small batches of text (the
        quickstart's: 12 x 64 tokens) are short passes that each pay the model's per-pass overhead;
        concatenated up to EVAL_PASS_TOKENS tokens, they take less time (the quickstart's eval,
        its 50 batches a split in 10 passes of 5: 527 ms against 664, medians of 8 on this 2-core
        CPU; passes of 10 batches took 553) and give the same mean (batches of one shape, every
        token weighing the same). A divisor of `count`: every pass one shape, one graph
        where compiled. Conversations (of other widths, and trained ids) and batches of that size
        already: one at a time. `count`: the batches a rank evaluates of each split."""
        fits = EVAL_PASS_TOKENS // (self.cfg.train.batch_size * self.model_config.block_size)
        if self.data.kind != "text" or fits < 2 or count < 2:
            return 1
        return max(d for d in range(1, min(fits, count) + 1) if count % d == 0)

    @property
    def tokens_per_step(self) -> int:
        ts = self.cfg.train
        return ts.batch_size * self.model_config.block_size * ts.grad_accum_steps * self.dist.world_size


def quiet(*args, **kwargs) -> None:
    """A log for ranks other than 0."""


def build_run(cfg: RunConfig, claim: Claim | None = None, overrides: list[str] | None = None) -> Run:
    """`claim`: the run directory taken and examined already (gpt.training.claim.claim: by the
    command line before Hydra wrote anything, or by `train`); without one the checks run here.
    `overrides`: what the command line (or gpt.train) passed, of which the model settings it gave
    are told apart from the defaults; None for settings built in Python, which are all given."""
    from gpt.config.overrides import model_settings_given

    given = model_settings_given(overrides) if overrides is not None else None
    ensure_console_logging()
    dist = distributed.from_env()
    log = logger.info if dist.is_main else quiet
    if claim is None:  # nobody checked these settings yet
        preflight(cfg)
    how = parallel.choose(cfg.distributed, cfg.cpu_offload, dist)
    sharded = how.sharded
    local_rank = dist.local_rank if dist.enabled or sharded else None
    rt = devices.setup(cfg.device, cfg.dtype, cfg.compile, local_rank, cfg.threads, dist.local_world_size, training=True)
    distributed.init(dist, rt.device, host_tensors=cfg.cpu_offload, alone=sharded)
    # Under torchrun every process picked its own run directory: rank 0's is the one.
    out_dir = Path(distributed.broadcast(cfg.paths.output_dir or str(runs.new_run_dir(cfg.paths.runs_dir)), dist))
    cfg = replace(cfg, paths=replace(cfg.paths, output_dir=str(out_dir), data_dir=str(cfg.paths.data_root())))  # as used
    source = _resume_source(cfg, out_dir, dist, log, claim.point if claim is not None else None)
    log(rt.describe() + how.describe())
    notice = parallel.notice(cfg.distributed, cfg.cpu_offload, how)
    if notice:
        log(notice)
    # Per-rank seeds: no shared dropout masks (the data stream's own generator: RandomWindows).
    devices.seed_everything(cfg.seed + dist.rank)

    # Mapped, not read, under FSDP2: each process then takes its shards from pages the node's
    # processes share, instead of every process holding the whole state privately.
    resumed = checkpoint.load(source, mmap=sharded) if source else None
    if resumed is not None and not cfg.init_from and (resumed.config or {}).get("init_from"):
        # a finetune resumed by its folder alone stays one (its data takes its model's tokenizer)
        cfg = replace(cfg, init_from=resumed.config["init_from"])
    # Under FSDP2 a new model (fresh, or a finetune's base) is rank 0's, built as one process
    # builds it (the same random draws: a sharded run starts where one process starts), and the
    # other processes build shapes on the meta device and receive their shards of it; a resumed
    # sharded checkpoint's shards are read by every process into a model of shapes.
    from_rank_0 = sharded and resumed is None
    reads_shards = sharded and resumed is not None and resumed.shards is not None
    on_meta = reads_shards or (from_rank_0 and not dist.is_main)
    building = _meta_building if on_meta else contextlib.nullcontext
    # The weights a new finetune starts from, loaded once: conversations are tokenized with their
    # tokenizer (a resumed finetune's checkpoint has it). Under FSDP2 rank 0 alone loads them, and
    # mapped: its model holds the file's pages, read as each tensor is sent (load_from_rank_0).
    loads_base = cfg.init_from and resumed is None and not (from_rank_0 and not dist.is_main)
    base = _base(cfg, mapped=from_rank_0) if loads_base else None
    base_tokenizer = (
        (resumed.tokenizer if resumed is not None else getattr(base, "tokenizer_spec", None)) if cfg.init_from else None
    )
    if from_rank_0:  # rank 0 may be downloading it: the others wait patiently
        distributed.barrier(dist, patient=True)
        base_tokenizer = distributed.broadcast(base_tokenizer, dist)
    data = _load_data(cfg, dist, log, base_tokenizer, resumed)
    tasks = _eval_tasks(cfg, data, dist, sharded, log)
    state = resumed.training if resumed is not None else None
    if state is not None:  # computed as it was trained: its steps bitwise as if never stopped (threads: at its world size)
        kept = devices.adopt_dtype(rt, state.dtype, cfg.dtype, state.device_type, sharded)
        for notice in (kept, rt.threads.adopt(state.threads) if len(state.rng) == dist.world_size else None):
            if notice:
                log(notice)
    with building():
        if not (from_rank_0 and not dist.is_main):
            model, model_config = _model(cfg, data, resumed, log, base, given)
        if from_rank_0:  # rank 0's shapes (a finetune's base may have grown or been cropped), after it built them
            distributed.barrier(dist, patient=True)
            shape = distributed.broadcast(registry.config_to_dict(model_config) if dist.is_main else None, dist)
            if not dist.is_main:
                model = registry.build(registry.config_from_dict(shape))
                model_config = model.config
    if resumed is not None:  # it goes on as the checkpoint's model: recorded and compared ("changed:") as such
        cfg = replace(cfg, model=model_config)
    notices = data.check_fits(model_config.block_size)  # said once the batches exist
    cfg = replace(cfg, train=_horizon(cfg, model, model_config, dist, log))
    cfg = replace(cfg, optim=_schedule_settings(cfg, resumed, log))
    cfg = replace(cfg, finetune=resumed_finetune(cfg.finetune, resumed, log))
    with building():  # LoRA's adapters, on the meta device too
        lora = prepare_finetune(model, cfg.finetune, log, new_tokens=_adds_tokens(data.tokenizer))
    whole = None
    if from_rank_0:  # rank 0's weights (LoRA's new adapters too), kept on the CPU; its model becomes shapes
        whole = model.state_dict() if dist.is_main else {}
        from gpt.model import meta

        meta.to_meta(model)
    elif not on_meta:
        model = model.to(rt.device)
    if resumed is not None and resumed.shards is None:  # whole weights into the whole model, before any sharding
        _load_weights(resumed, source, model)
    if sharded:
        model = how.shard(model, rt)
    if from_rank_0:
        how.materialize(model, rt.device)
        parallel.load_from_rank_0(model, whole, rt.device)
        del whole
        log("rank 0 built the initial weights and sent each process its shards")
    elif reads_shards:
        how.materialize(model, rt.device)
        log(f"built on the meta device: each process holds only its shards, read from {source.name}")
    same_kind = state is not None and state.device_type == rt.device.type  # (Newton-Schulz's dtype as the dtype's)
    optimizer = build_optimizer(model, cfg.optim, rt.device, state.ns_dtype if same_kind else None)  # after sharding
    if reads_shards:
        _read_shards(resumed, source, model, optimizer)
    batches = data.batches(
        "train", model_config.block_size, cfg.train.batch_size, rt.device, cfg.seed, dist.rank, dist.world_size
    )
    if rt.device.type == "cuda":
        batches = Prefetched(batches, rt.device)
    for notice in notices:
        log(notice)
    scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.use_grad_scaler)
    progress = _restore(resumed, source, cfg, optimizer, scaler, batches, dist, log) if resumed is not None else Progress()
    rt.tune(model)  # the device's settings for its kernels (attention's precision on a CPU)
    step_model, eval_model = how.forwards(model, rt, dist)
    run = Run(
        cfg=cfg,
        dist=dist,
        rt=rt,
        out_dir=out_dir,
        data=data,
        model=model,
        model_config=model_config,
        lora=lora,
        optimizer=optimizer,
        scaler=scaler,
        schedule=CosineSchedule.from_settings(cfg.optim, cfg.train.max_iters),
        batches=batches,
        step_model=step_model,
        eval_model=eval_model,
        log=log,
        progress=progress,
        tasks=tasks,
        resumed_from=source,
        parallel=how,
    )
    rows = cfg.train.batch_size * cfg.train.grad_accum_steps * dist.world_size
    log(
        f"model {registry.summary(model_config)}: {model.num_params():,} parameters; micro-batch {cfg.train.batch_size} x "
        f"accum {cfg.train.grad_accum_steps} x {dist.world_size} process(es) = global batch of "
        + data.describe_step(rows, model_config.block_size)
    )
    log(f"optimizer {optimizer.describe()}")
    notice = rt.threads.load_notice()  # other work on our cores: said once, the count kept
    if notice:
        log(notice)
    return run


def _meta_building():
    from gpt.model import meta

    return meta.building()


def _base(cfg: RunConfig, mapped: bool):
    """The model a new finetune starts from (init_from: a run, a checkpoint, GPT-2, an HF folder)."""
    from gpt.checkpoints import loading

    return loading.load(str(cfg.init_from), dropout=float(cfg.model.dropout), mapped=mapped)


def _adds_tokens(tokenizer) -> bool:
    """Whether the data's tokenizer is tinygpt's chat template, whose special tokens are new rows
    of the embedding (a finetune trains them). Its module is loaded wherever such a tokenizer
    exists, so a run on plain text need not import it to know."""
    template = sys.modules.get("gpt.chat.template")
    return template is not None and isinstance(tokenizer, template.ChatTokenizer)


def _resume_source(cfg: RunConfig, out_dir: Path, dist: distributed.Dist, log, point: ResumePoint | None) -> Path | None:
    """The checkpoint this run continues from: as the command line found it (`point`, examined
    once), else found now. Rank 0 decides (other nodes may not share its view of the filesystem)."""
    if dist.is_main:
        if point is None or point.run_dir is None or Path(point.run_dir).resolve() != out_dir.resolve():
            point = resume_point(cfg.resume, out_dir)
        for path, reason in point.refused:  # newer checkpoints that cannot be resumed from
            aside = runs.set_aside(path)
            log(f"notice: {reason}; set aside as {aside.name}, resuming from {point.source.name}")
        runs.remove_leftovers(out_dir)
    source = distributed.broadcast(point.source if dist.is_main else None, dist)
    if cfg.finetune.require_init and not cfg.init_from and source is None:
        raise TinyGPTError(
            "this experiment needs a model to start from: pass init_from=<run dir | checkpoint | gpt2 | HF folder>"
        )
    return source


def _horizon(cfg: RunConfig, model: nn.Module, model_config, dist: distributed.Dist, log):
    """The training settings with train.max_iters from a horizon given as compute
    (train.flops_budget / tokens_per_param), and the start-up line on what the run costs. Then no
    more eval batches than training steps: a smoke run of a big recipe (max_iters=20,
    eval_iters=200) would spend far longer evaluating than training."""
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
        ts = replace(ts, max_iters=steps)
    log(compute.describe(figures, ts.max_iters, tokens_per_step, recurrent=getattr(model, "recurrent", False)))
    if ts.eval_iters > ts.max_iters:
        log(f"notice: eval_iters {ts.eval_iters} -> {ts.max_iters} (no more eval batches than training steps)")
        ts = replace(ts, eval_iters=ts.max_iters)
    return ts


def _schedule_settings(cfg: RunConfig, resumed: Checkpoint | None, log):
    """The optimizer settings with the schedule's length and floor as numbers (checkpoints record
    what was used). A run from before `optim.min_lr_ratio` existed (its settings name a min_lr and
    no ratio) keeps its floor unless the command line gives one."""
    optim, saved = cfg.optim, (resumed.config.get("optim") or {}) if resumed is not None else {}
    min_lr = optim.min_lr
    if min_lr is None and saved.get("min_lr") is not None and "min_lr_ratio" not in saved:
        min_lr = saved["min_lr"]
        log(f"notice: keeping the checkpoint's optim.min_lr={min_lr:g} (it predates optim.min_lr_ratio)")
    if min_lr is None:
        min_lr = optim.lr * optim.min_lr_ratio
    settings = replace(optim, decay_iters=optim.decay_iters or cfg.train.max_iters, min_lr=min_lr)
    was = saved.get("decay_iters")
    if resumed is not None and isinstance(was, int) and was != settings.decay_iters:
        # Extending a run (train.max_iters=4000 on a finished 2000-step one) stretches the cosine
        # over the new horizon, so the learning rate climbs back from its floor: say by how much.
        step = resumed.step
        before = CosineSchedule.from_settings(replace(settings, decay_iters=was), cfg.train.max_iters)(step)
        after = CosineSchedule.from_settings(settings, cfg.train.max_iters)(step)
        log(
            f"notice: the schedule now decays over {settings.decay_iters:,} steps (was {was:,}): the learning rate at "
            f"step {step:,} goes from {before:.3g} to {after:.3g}; optim.decay_iters={was} keeps the old curve"
            + (" (flat at its floor from there)" if step >= was else "")
        )
    return settings


def _load_data(cfg: RunConfig, dist: distributed.Dist, log, base_tokenizer: dict | None = None, resumed=None) -> Dataset:
    # A resumed run's tokenizer is compared before any preparation is written: a corpus changed since
    # (another alphabet, other merges) is refused with the data prepared under data.name as it was.
    def same(tokenizer: dict) -> None:
        fix = "a run resumes on the data it was trained on: its data settings and its corpus as they were then"
        require_same(resumed.tokenizer, tokenizer, "the checkpoint's tokenizer differs from this data's", fix)

    kw = {"base_tokenizer": base_tokenizer, "check_tokenizer": same if resumed is not None else None}
    # One process per node prepares (nodes may not share a filesystem); the others wait, then read.
    if dist.local_rank == 0:
        data = load_data(cfg.data, cfg.paths.data_root(), log=log, **kw)
    distributed.barrier(dist, patient=True)  # preparing a large corpus takes longer than a collective may wait
    if dist.local_rank != 0:  # local rank 0 checked it
        data = load_data(cfg.data, cfg.paths.data_root(), log=quiet, verify=SIZES, **kw)
    log(
        f"data {data.name}: {Dataset.tokens(data.train):,} train / {Dataset.tokens(data.val):,} val tokens, "
        f"vocab {data.tokenizer.vocab_size}"
    )
    return data


def _eval_tasks(cfg: RunConfig, data: Dataset, dist, sharded: bool, log) -> dict[str, list]:
    """train.eval_tasks' items, read by rank 0 (gpt.evals.tasks.training_items); under FSDP2 every
    rank scores them (the sharded model runs only with all taking part), so all receive them."""
    if not cfg.train.eval_tasks:
        return {}
    from gpt.evals.tasks import training_items

    tasks = training_items(cfg.train, cfg.paths.data_root(), data.tokenizer, log) if dist.is_main else {}
    if sharded and cfg.train.eval_tasks:  # rank 0 may be downloading them: the others wait patiently
        distributed.barrier(dist, patient=True)
        tasks = distributed.broadcast(tasks, dist)
    return tasks


def _model(cfg: RunConfig, data: Dataset, resumed: Checkpoint | None, log, base=None, given=None) -> tuple[nn.Module, Any]:
    """A new model, the weights to finetune (init_from, `base` when loaded already), or the shape
    of the run resumed. `given`: the model settings the command line gave (_given)."""
    if resumed is None and cfg.init_from:
        model = initial_model(cfg.init_from, data.tokenizer, cfg.finetune, float(cfg.model.dropout), log, loaded=base)
        if isinstance(model.config, GPTConfig):  # how the backward pass spends memory is the finetune's to choose
            model.config.activation_checkpointing = getattr(cfg.model, "activation_checkpointing", False)
        kept = as_given(model.config) | {k: v for k, v in as_given(cfg.model).items() if k in APPLY_TO_A_BASE}
        ignored = ignored_settings(cfg.model, kept, given, kept_as="the finetune's")
        if ignored:  # (APPLY_TO_A_BASE apply: they change no weight; its context is finetune's to set)
            log(f"notice: a finetune keeps init_from's shape (its context: finetune.block_size); ignoring {', '.join(ignored)}")
        return model, model.config
    config = _model_config(cfg, data, resumed, log, given)
    return registry.build(config), config


def _model_config(cfg: RunConfig, data: Dataset, resumed: Checkpoint | None, log, given=None):
    config = registry.with_vocab(cfg.model, data.tokenizer.vocab_size)
    if resumed is None:
        return config  # (a resumed run's data has its tokenizer: _load_data refused any other)
    saved = registry.config_from_dict(resumed.model_config)
    if isinstance(saved, GPTConfig):  # how the backward pass spends memory is this run's to choose
        saved = replace(saved, activation_checkpointing=getattr(config, "activation_checkpointing", False))  # (model=lstm given)
    kept = {k: v for k, v in as_given(saved).items() if k in resumed.model_config}  # (not a setting it predates)
    ignored = ignored_settings(config, kept, given, resumed.config.get("model"))
    if ignored:
        log(f"notice: resuming with the checkpoint's model settings; ignoring {', '.join(ignored)}")
    return saved


def _load_weights(ckpt: Checkpoint, path: Path, model: nn.Module) -> None:
    if ckpt.training is None:
        raise TinyGPTError(f"{path} holds weights only (no optimizer state) and cannot be resumed; pass a ckpt-*.pt file")
    try:
        model.load_state_dict(ckpt.model)
    except (RuntimeError, ValueError, KeyError) as e:  # checked up front (gpt.training.claim.resumable); a file changed since
        raise _unfit(path, e) from None


def _read_shards(ckpt: Checkpoint, path: Path, model: nn.Module, optimizer) -> None:
    """A sharded checkpoint (format 4: checkpoint.load left placeholders) into the sharded model
    and, as the optimizer state `_restore` loads, into tensors sharded like their parameters: each
    process reads only its shards, at whatever number of processes wrote them (DCP reshards).
    A checkpoint read whole instead (one process, or DDP) has its tensors already."""
    from gpt.checkpoints import shards

    try:
        targets = parallel.load_targets(model, optimizer, ckpt.training.optimizer)
        state = shards.read_sharded(shards.check(path, ckpt.shards), ckpt.sharded_state(), targets)
    except (RuntimeError, ValueError, KeyError) as e:  # checked up front (gpt.training.claim.resumable); a file changed since
        raise _unfit(path, e) from None
    ckpt.set_sharded_state(state)


def _unfit(path: Path, e: Exception) -> TinyGPTError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return TinyGPTError(f"{path}: its weights or optimizer state do not fit this run ({first})")


def _restore(ckpt: Checkpoint, path: Path, cfg: RunConfig, optimizer, scaler, batches, dist, log) -> Progress:
    """Everything of a resumed run but its weights (loaded before sharding: `_load_weights`)."""
    state = ckpt.training
    try:
        optimizer.load_state_dict(state.optimizer)
    except (RuntimeError, ValueError, KeyError) as e:  # checked up front (gpt.training.claim.resumable); a file changed since
        raise _unfit(path, e) from None
    if scaler.is_enabled() and state.scaler:  # an fp32/bf16 run's scaler state is empty
        scaler.load_state_dict(state.scaler)
    batches.load_state_dict(state.loader)
    if len(state.rng) != dist.world_size:
        log(
            f"notice: the checkpoint was written by {len(state.rng)} process(es), this run has {dist.world_size}; "
            f"random streams restart (results stay valid, not bitwise identical)"
        )
    devices.set_rng_state(state.rng[dist.rank % len(state.rng)])
    recorded, now = dict(ckpt.config), asdict(cfg) | {"model": as_given(cfg.model)}
    if isinstance(recorded.get("model"), dict):  # resolved as this tinygpt resolves it, shown as given
        try:
            recorded["model"] = as_given(registry.config_from_dict(recorded["model"]))
        except (TinyGPTError, TypeError):  # a record of another version: compared as it is
            pass
        # a value the first start left to the data (vocab_size: null) is no change
        now["model"] = {k: None if recorded["model"].get(k, 0) is None else v for k, v in now["model"].items()}
    changed = changed_settings(recorded, now)
    log(
        f"resuming from {path} at step {ckpt.step} (best val loss {ckpt.best_val_loss:.4f})"
        + (f"; changed: {changed}" if changed else "")
    )
    kept = ("bad_in_a_row", "elapsed_s", "best_elapsed_s", "tokens_seen")
    progress = Progress(ckpt.step, ckpt.best_val_loss, state.bad_steps, last_eval=dict(ckpt.last_eval))
    return replace(progress, **{name: getattr(state, name) for name in kept})
