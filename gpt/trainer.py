"""The training loop: the library side of `train.py`.

`train(cfg)` takes the resolved config as a plain dict, validates all of it before touching
data or models, trains (resuming if the run directory already holds a checkpoint), and returns
the best validation loss (what a sweeper optimises).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from gpt import checkpoint, distributed, runtime
from gpt.config import TrainSettings, finetune_settings, optim_settings, train_settings
from gpt.data import Dataset, load_data
from gpt.data.loader import RandomWindows
from gpt.errors import TinyGPTError
from gpt.generation import SamplingConfig, generate
from gpt.finetune import initial_model, prepare_finetune
from gpt.lora import merged_state_dict
from gpt.tokenizer import tokenizer_identity
from gpt import architectures
from gpt.optim import CosineSchedule, build_optimizer
from gpt.preemption import Preempted, StopRequest
from gpt.tracking import MetricsFile, NullTracker, RunSummary, TensorBoardTracker, ensure_console_logging, logger

StepHook = Callable[[int, float], None]  # (step just finished, its loss): tests and tools watch steps


def model_config(model_cfg: dict, data: Dataset):
    """The model section of the config (GPTConfig or RNNConfig), with the vocabulary taken
    from the data by default."""
    model_cfg = dict(model_cfg)
    vocab = data.tokenizer.vocab_size
    if model_cfg.get("vocab_size") is None:
        model_cfg["vocab_size"] = vocab
    elif model_cfg["vocab_size"] < vocab:
        raise TinyGPTError(
            f"model.vocab_size={model_cfg['vocab_size']} is smaller than the tokenizer's {vocab} tokens; "
            f"set model.vocab_size=null to take it from the data"
        )
    return architectures.config_from_dict(model_cfg)


def check_data_fits(data: Dataset, block_size: int) -> None:
    for split, shards in (("train", data.train), ("val", data.val)):
        longest = max((len(s) for s in shards), default=0)
        if longest < block_size + 1:
            raise TinyGPTError(
                f"model.block_size={block_size} is longer than the {split} split ({Dataset.tokens(shards)} tokens"
                f"{', in shards of at most ' + str(longest) if len(shards) > 1 else ''}); "
                f"use a block_size below {longest} or more data"
            )


def train_step(model, batches, optimizer, scaler, rt, accum_steps: int, grad_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward/backward over `accum_steps` micro-batches, then clip. Returns (mean loss, grad
    norm) as tensors, without stepping the optimizer: the caller first checks they are finite.
    Reading them forces a host sync, so the caller decides when."""
    total = torch.zeros((), device=rt.device)
    for micro in range(accum_steps):
        x, y = batches.next()
        # Under DDP, gradients are all-reduced on the last micro-batch only.
        sync = micro == accum_steps - 1 or not isinstance(model, DDP)
        with contextlib.nullcontext() if sync else model.no_sync():
            with rt.autocast():  # the forward pass only; backward runs in the dtypes it recorded
                _, loss = model(x, y)
            # Each micro-batch contributes 1/accum_steps, so the summed gradient is the mean
            # over the whole batch, as if it had been one forward pass.
            scaler.scale(loss / accum_steps).backward()
        total += loss.detach()
    scaler.unscale_(optimizer)  # clip and measure true gradients, not loss-scaled ones
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    return total / accum_steps, norm


class Trainer:
    def __init__(self, cfg: dict, on_step: StepHook | None = None, overrides: list[str] | None = None):
        ensure_console_logging()
        self.t_start = time.time()
        self.cfg = cfg
        self.on_step = on_step
        self.overrides = overrides or []
        self.dist = distributed.from_env()
        self.log = logger.info if self.dist.is_main else (lambda *a, **k: None)

        # --- validate everything cheap first ---------------------------------------------------
        self.ts: TrainSettings = train_settings(cfg)
        if self.ts.eval_iters > self.ts.max_iters:
            # A smoke run of a big recipe (max_iters=20 with eval_iters=200) would spend far
            # longer evaluating than training: never evaluate on more batches than it trains on.
            self.log(f"notice: eval_iters {self.ts.eval_iters} -> {self.ts.max_iters} (no more eval batches than training steps)")
            self.ts.eval_iters = self.ts.max_iters
        self.optim_settings = optim_settings(cfg)
        self.schedule = CosineSchedule.from_settings(self.optim_settings)
        # Check the model shape now (the vocabulary comes from the data later) so a typo fails
        # in a second instead of after the data is downloaded and prepared.
        architectures.config_from_dict({**cfg["model"], "vocab_size": cfg["model"].get("vocab_size") or 1})
        self.rt = runtime.setup(cfg["device"], cfg["dtype"], cfg["compile"], self.dist.local_rank if self.dist.enabled else None)
        distributed.init(self.dist, self.rt.device)
        # Under torchrun every process resolved its own run directory: rank 0's is the one.
        self.out_dir = Path(distributed.broadcast(cfg["paths"]["output_dir"], self.dist))
        self.ckpt_dir = self.out_dir / checkpoint.CKPT_DIR
        # Rank 0 decides where to resume from (other nodes may not share its filesystem view).
        resume_from = distributed.broadcast(
            checkpoint.resume_source(cfg.get("resume", "auto"), self.out_dir) if self.dist.is_main else None, self.dist
        )
        if self.dist.is_main:
            checkpoint.remove_leftovers(self.out_dir)
        self.log(self.rt.describe() + (f"; DDP over {self.dist.world_size} processes" if self.dist.enabled else ""))
        # Per-rank seeds: ranks must not share dropout masks. (The data stream has its own
        # generator, seeded alike on every rank; see RandomWindows.)
        runtime.seed_everything(cfg["seed"] + self.dist.rank)

        # --- data and model --------------------------------------------------------------------
        # One process per node prepares (nodes may not share a filesystem); the others wait.
        if self.dist.local_rank == 0:
            self.data = load_data(cfg["data"], cfg["paths"]["data_dir"], log=self.log if self.dist.is_main else (lambda *a: None))
        distributed.barrier(self.dist)
        if self.dist.local_rank != 0:
            self.data = load_data(cfg["data"], cfg["paths"]["data_dir"], log=lambda *a: None)
        resumed = checkpoint.load(resume_from) if resume_from else None
        self.ft = finetune_settings(cfg)
        self.log(f"data {self.data.name}: {Dataset.tokens(self.data.train):,} train / {Dataset.tokens(self.data.val):,} val tokens, "
                 f"vocab {self.data.tokenizer.vocab_size}")
        if self.ft.require_init and not cfg.get("init_from") and resumed is None:
            raise TinyGPTError("this experiment needs a model to start from: pass init_from=<run dir | checkpoint | gpt2 | HF folder>")
        if resumed is None and cfg.get("init_from"):
            model = initial_model(cfg["init_from"], self.data.tokenizer, self.ft, float(cfg["model"].get("dropout") or 0.0), self.log)
            self.mcfg = model.config
        else:
            self.mcfg = self._model_config(resumed)
            model = architectures.build(self.mcfg)
        check_data_fits(self.data, self.mcfg.block_size)
        if resumed is not None and resumed.get("lora") and not self.ft.lora_rank:
            # The run being resumed trained adapters: keep doing so, with its settings.
            self.ft.lora_rank, self.ft.lora_alpha = resumed["lora"]["rank"], resumed["lora"]["alpha"]
            self.log(f"notice: resuming a LoRA finetune (rank {self.ft.lora_rank}) with its adapters")
        elif resumed is not None and (resumed.get("lora") or {}).get("rank", 0) != self.ft.lora_rank:
            raise TinyGPTError(f"the checkpoint was trained with finetune.lora_rank={(resumed.get('lora') or {}).get('rank', 0)}; "
                               f"resume with that value, or start a new run from it with init_from")
        self.lora = prepare_finetune(model, self.ft, self.log)  # LoRA settings for checkpoints, or None
        self.model = model.to(self.rt.device)
        self.optimizer = build_optimizer(self.model, self.optim_settings, self.rt.device)
        self.scaler = torch.amp.GradScaler(self.rt.device.type, enabled=self.rt.use_grad_scaler)
        self.batches = RandomWindows(
            self.data.train, self.mcfg.block_size, self.ts.batch_size, self.rt.device,
            seed=cfg["seed"], rank=self.dist.rank, world_size=self.dist.world_size,
        )
        self.step = 0
        self.best_val = math.inf
        self.bad_in_a_row = 0
        self.bad_total = 0
        if resumed:
            self._restore(resumed, resume_from)

        step_model = torch.compile(self.model) if self.rt.compile else self.model
        self.eval_model = step_model  # not the DDP wrapper: evaluation needs no gradient sync
        if self.dist.enabled:
            step_model = DDP(step_model, device_ids=[self.rt.device.index] if self.rt.device.type == "cuda" else None)
        self.step_model = step_model
        self.tokens_per_step = self.ts.batch_size * self.mcfg.block_size * self.ts.grad_accum_steps * self.dist.world_size
        self.flops_per_token = self.model.flops_per_token()
        self.peak = runtime.peak_flops(self.rt.device, self.ts.peak_flops)
        self.log(
            f"model {architectures.summary(self.mcfg)}: "
            f"{self.model.num_params():,} parameters; micro-batch {self.ts.batch_size} x accum {self.ts.grad_accum_steps}"
            f" x {self.dist.world_size} process(es) = global batch of {self.tokens_per_step:,} tokens/step"
        )
        self.log(f"optimizer {self.optimizer.describe()}")

    # --- setup helpers ------------------------------------------------------------------------

    def _model_config(self, resumed: dict | None):
        mcfg = model_config(self.cfg["model"], self.data)
        if resumed is None:
            return mcfg
        saved = architectures.config_from_dict(resumed["model_config"])
        old, new = architectures.config_to_dict(saved), architectures.config_to_dict(mcfg)
        diff = [f"model.{k}={new.get(k)!r} (checkpoint: {old.get(k)!r})" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        if diff:
            self.log(f"notice: resuming with the checkpoint's model settings; ignoring {', '.join(diff)}")
        if tokenizer_identity(resumed["tokenizer"]) != tokenizer_identity(self.data.tokenizer.to_dict()):
            raise TinyGPTError(
                "the checkpoint's tokenizer differs from this data's; resume with the data the run was trained on "
                f"(data={resumed.get('config', {}).get('data', {}).get('name', '?')})"
            )
        return saved

    def _restore(self, ckpt: dict, path: Path) -> None:
        if "optimizer" not in ckpt:
            raise TinyGPTError(f"{path} holds weights only (no optimizer state) and cannot be resumed; pass a ckpt-*.pt file")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.scaler.is_enabled() and ckpt["scaler"]:  # an fp32/bf16 run's scaler state is empty
            self.scaler.load_state_dict(ckpt["scaler"])
        self.batches.load_state_dict(ckpt["loader"])
        rng = ckpt["rng"]
        if isinstance(rng, list):  # one entry per rank
            if len(rng) != self.dist.world_size:
                self.log(f"notice: the checkpoint was written by {len(rng)} process(es), this run has {self.dist.world_size}; "
                         f"random streams restart (results stay valid, not bitwise identical)")
            rng = rng[self.dist.rank % len(rng)]
        runtime.set_rng_state(rng)
        self.step = ckpt["step"]
        self.best_val = ckpt["best_val_loss"]
        self.bad_total = ckpt.get("bad_steps", 0)
        self.bad_in_a_row = ckpt.get("bad_in_a_row", 0)
        changed = _changed_settings(ckpt.get("config", {}), self.cfg)
        self.log(f"resuming from {path} at step {self.step} (best val loss {self.best_val:.4f})" + (f"; changed: {changed}" if changed else ""))

    # --- checkpoints --------------------------------------------------------------------------

    def _payload(self, full: bool, rng_states: list | None = None) -> dict:
        model = checkpoint.unwrap(self.model)
        # best.pt is for sampling and exporting: adapters folded in. Step checkpoints keep them
        # apart, to resume the finetune.
        weights = merged_state_dict(model) if (self.lora and not full) else model.state_dict()
        p = {
            "model": weights,
            "model_config": architectures.config_to_dict(self.mcfg),
            "tokenizer": self.data.tokenizer.to_dict(),
            "step": self.step,
            "best_val_loss": self.best_val,
            "config": self.cfg,
        }
        if full:
            p.update(
                optimizer=self.optimizer.state_dict(),
                scaler=self.scaler.state_dict(),
                loader=self.batches.state_dict(),
                rng=rng_states,
                bad_steps=self.bad_total,
                bad_in_a_row=self.bad_in_a_row,
                lora=self.lora,
            )
        return p

    def save(self, best: bool = False) -> Path | None:
        """Full-state checkpoint of the current step (rank 0 writes; every rank calls)."""
        path = self.ckpt_dir / checkpoint.step_file(self.step)
        rng_states = distributed.gather(runtime.rng_state(self.rt.device), self.dist)  # every rank's own
        if self.dist.is_main:
            if best:
                checkpoint.save(self.ckpt_dir / checkpoint.BEST, self._payload(full=False))
            checkpoint.save(path, self._payload(full=True, rng_states=rng_states))
            checkpoint.prune(self.out_dir, self.ts.keep_last)
        distributed.barrier(self.dist)
        return path

    # --- evaluation ---------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss over `eval_iters` batches per split, averaged over ranks. The batches are the
        same at every eval (fixed seed), so successive evals compare the model, not the draw."""
        self.step_model.eval()
        out = {}
        for i, (split, tokens) in enumerate((("train", self.data.train), ("val", self.data.val))):
            batches = RandomWindows(
                tokens, self.mcfg.block_size, self.ts.batch_size, self.rt.device,
                seed=self.cfg["seed"] + 1 + i, rank=self.dist.rank, world_size=self.dist.world_size,
            )
            total = torch.zeros((), device=self.rt.device)
            for _ in range(self.ts.eval_iters):
                x, y = batches.next()
                with self.rt.autocast():
                    _, loss = self.eval_model(x, y)
                total += loss.float()
            out[split] = distributed.mean(total / self.ts.eval_iters, self.dist).item()
        self.step_model.train()
        return out

    # --- the loop -----------------------------------------------------------------------------

    def fit(self) -> float:
        ts, log = self.ts, self.log
        main = self.dist.is_main
        self.tracker = TensorBoardTracker(self.out_dir / "tb") if main else NullTracker()
        self.metrics = MetricsFile(self.out_dir / "metrics.jsonl" if main else None)
        self.summary = RunSummary(
            self.out_dir / "summary.json" if main else None,
            params=self.model.num_params(), overrides=list(self.overrides), model=architectures.summary(self.mcfg),
        )
        if self.step == 0:
            self.tracker.config(self.cfg)
        self.tracker.hparams(self.cfg, ["hparams/best_val_loss", "hparams/final_val_loss"])
        self.last_eval: dict[str, float] = {}
        self.evals_done = 0
        self.histogram_due = False
        self.tokens_per_s = 0.0
        stopped = False
        first_step = self.step
        if first_step >= ts.max_iters:
            log(f"this run already reached step {first_step} (train.max_iters={ts.max_iters}); raise train.max_iters to train longer")
        self.summary.update(step=self.step)
        bar = tqdm(total=ts.max_iters, initial=first_step, unit="step", dynamic_ncols=True, leave=False,
                   disable=not (main and sys.stderr.isatty()))  # no bar in log files and CI output
        t_interval, steps_in_interval = time.time(), 0
        try:
            with StopRequest(log=logger.warning if main else (lambda *a: None)) as stop, logging_redirect_tqdm(loggers=[logging.getLogger()]):
                while True:
                    step = self.step
                    if (step % ts.eval_interval == 0 or step == ts.max_iters) and not (step == first_step and step > 0):
                        self._eval_and_save(step)
                        t_interval, steps_in_interval = time.time(), 0  # keep eval time out of step timing
                    if step >= ts.max_iters:
                        break
                    if distributed.any_true(stop.requested, self.dist, self.rt.device):
                        path = self.save()
                        stopped = True
                        log(f"stopped at step {step} ({stop.reason or 'signal on another rank'}); checkpoint {path}")
                        launcher = "torchrun <its options> train.py" if self.dist.enabled else "python train.py"
                        log(f"resume with: {launcher} <the same overrides> hydra.run.dir={self.out_dir}")
                        break

                    lr = self.schedule.set_lr(self.optimizer, step)
                    loss, norm = train_step(self.step_model, self.batches, self.optimizer, self.scaler, self.rt, ts.grad_accum_steps, ts.grad_clip)
                    if self.histogram_due:  # gradients exist only until the update below
                        self.tracker.histograms(step, self.model)
                        self.histogram_due = False
                    self._apply_or_skip(loss, norm, step)
                    self.step = step + 1
                    steps_in_interval += 1
                    bar.update(1)

                    if self.on_step is not None:
                        self.on_step(self.step, distributed.mean(loss, self.dist).item())
                    if self.step % ts.log_interval == 0:
                        dt = (time.time() - t_interval) / steps_in_interval
                        self._log_step(loss, norm, lr, dt, bar)
                        t_interval, steps_in_interval = time.time(), 0

            if not stopped and ts.sample_tokens and main:
                text = self._sample(ts.sample_tokens)
                self.tracker.text("sample", text, self.step)
                log(f"---------- sample at step {self.step} ----------\n{text}\n" + "-" * 42)
        except BaseException as e:
            interrupted = isinstance(e, KeyboardInterrupt)
            self.summary.update(status="interrupted" if interrupted else "failed", error=None if interrupted else str(e),
                                wall_s=time.time() - self.t_start)
            raise
        finally:
            bar.close()
            self.tracker.close()
            self.metrics.close()

        final = self.last_eval.get("val", float("nan"))
        self.summary.update(status="interrupted" if stopped else "finished", step=self.step, wall_s=time.time() - self.t_start)
        if stopped:
            raise Preempted(f"stopped at step {self.step}")
        log(f"done in {time.time() - self.t_start:.1f} s: best val loss {self.best_val:.4f} (final {final:.4f})"
            + (f"; {self.bad_total} non-finite step(s) skipped" if self.bad_total else ""))
        log(f"checkpoints: {self.ckpt_dir}   tensorboard: tensorboard --logdir {self.out_dir / 'tb'}")
        log(f"sample with: python sample.py run_dir={self.out_dir}")
        return self.best_val

    def _eval_and_save(self, step: int) -> None:
        ts = self.ts
        self.last_eval = self.evaluate()
        improved = self.last_eval["val"] < self.best_val
        self.best_val = min(self.best_val, self.last_eval["val"])
        self.evals_done += 1
        self.tracker.scalars(step, {"loss/train_eval": self.last_eval["train"], "loss/val": self.last_eval["val"]})
        self.metrics.write(kind="eval", step=step, train=self.last_eval["train"], val=self.last_eval["val"])
        self.log(f"eval step {step}: train {self.last_eval['train']:.4f}, val {self.last_eval['val']:.4f}" + (" (best)" if improved else ""))
        self.tracker.scalars(step, {"hparams/best_val_loss": self.best_val, "hparams/final_val_loss": self.last_eval["val"]})
        if self.dist.is_main:
            if ts.eval_sample_tokens:
                self.tracker.text("samples", self._sample(ts.eval_sample_tokens), step)
            if ts.attention_every and self.evals_done % ts.attention_every == 0 and hasattr(self.model, "attention_maps"):
                x, _ = RandomWindows(self.data.val, self.mcfg.block_size, 1, self.rt.device, seed=self.cfg["seed"]).next()
                self.tracker.attention_images(step, self.model.attention_maps(x))
        self.histogram_due = bool(ts.histogram_every) and self.evals_done % ts.histogram_every == 0
        self.summary.update(
            step=step, best_val_loss=self.best_val, final_val_loss=self.last_eval["val"],
            tokens_seen=step * self.tokens_per_step, tokens_per_s=self.tokens_per_s, wall_s=time.time() - self.t_start,
        )
        if step > 0:
            self.save(best=improved)

    def _log_step(self, loss: torch.Tensor, norm: torch.Tensor, lr: float, dt: float, bar) -> None:
        loss_value = distributed.mean(loss, self.dist).item()  # host sync, once per interval
        self.tokens_per_s = self.tokens_per_step / dt
        values = {"loss/train": loss_value, "lr": lr, "grad_norm": norm.item(),
                  "perf/tokens_per_s": self.tokens_per_s, "perf/ms_per_step": dt * 1000}
        mfu = ""
        if self.peak:
            values["perf/mfu"] = self.flops_per_token * self.tokens_per_s / (self.peak * self.dist.world_size)
            mfu = f", MFU {values['perf/mfu'] * 100:.1f}%"
        self.log(f"step {self.step}/{self.ts.max_iters}: loss {loss_value:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/step, "
                 f"{self.tokens_per_s:,.0f} tok/s{mfu}")
        bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{self.tokens_per_s:,.0f}", refresh=False)
        self.tracker.scalars(self.step, values)
        self.metrics.write(kind="train", step=self.step, loss=loss_value, lr=lr, ms_per_step=dt * 1000)

    def _sample(self, n_tokens: int) -> str:
        with self.rt.autocast():
            sampling = SamplingConfig(max_new_tokens=n_tokens, temperature=0.8, top_k=200, seed=self.cfg["seed"])
            return generate(self.model, self.data.tokenizer, [""], sampling)[0][0]

    def _apply_or_skip(self, loss: torch.Tensor, norm: torch.Tensor, step: int) -> None:
        """Step the optimizer, unless the loss or gradients are not finite: then skip the update
        (the data moves on), and stop after `max_bad_steps` such steps in a row."""
        # With fp16 loss scaling, overflowing gradients are routine (the scaler skips those steps).
        watched = loss if self.scaler.is_enabled() else torch.stack([loss.float(), norm.float()])
        bad = not bool(torch.isfinite(watched).all())  # the one host sync of the step
        bad = distributed.any_true(bad, self.dist, self.rt.device)
        if bad:
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()
            self.bad_in_a_row += 1
            self.bad_total += 1
            logger.warning(f"step {step + 1}: non-finite loss or gradient, update skipped ({self.bad_in_a_row} in a row)")
            if self.bad_in_a_row >= self.ts.max_bad_steps:
                last = checkpoint.latest(self.out_dir)
                raise TinyGPTError(
                    f"training diverged: {self.bad_in_a_row} non-finite steps in a row at step {step + 1}; "
                    f"the last good checkpoint is {last or 'none (no eval reached yet)'}; lower optim.lr or train.grad_clip"
                )
            return
        self.bad_in_a_row = 0
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)


def _changed_settings(old: dict, new: dict, prefix: str = "") -> str:
    """'a.b: 1 -> 2, ...' for the leaves that differ (paths and run bookkeeping excluded)."""
    out = []
    for key in sorted(set(old) | set(new)):
        if prefix == "" and key in ("paths", "resume"):
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            sub = _changed_settings(a, b, f"{prefix}{key}.")
            if sub:
                out.append(sub)
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return ", ".join(out)


def train(cfg: dict, on_step: StepHook | None = None, overrides: list[str] | None = None) -> float:
    """Train per cfg; returns the best validation loss. Raises `Preempted` after a SIGTERM /
    Ctrl-C stop has saved its checkpoint. Always releases the process group."""
    try:
        return Trainer(cfg, on_step, overrides).fit()
    finally:
        distributed.shutdown()
        # Multirun jobs share this process: hand the last job's memory back before the next.
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
