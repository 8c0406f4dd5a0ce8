"""The training loop over a built `Run`: `step()` (one optimizer step), `evaluate()`, `save()`,
and `fit()`, which runs them on the configured cadence with logging, checkpoints, a clean stop
on SIGTERM / Ctrl-C, and the run's records (TensorBoard, metrics.jsonl, summary.json).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from gpt.checkpoints import runs
from gpt.checkpoints.writer import Writer
from gpt.errors import TinyGPTError, one_line, out_of_memory
from gpt.model import compute, registry
from gpt.runtime import alarm, devices, distributed
from gpt.runtime.preemption import Preempted, StopRequest
from gpt.tracking import console_redirected, logger
from gpt.tracking.records import RunRecords
from gpt.training import saving
from gpt.training import step as steps
from gpt.training.build import Run, quiet
from gpt.training.parallel import gathered, named_parameters

STOP_CHECK_EVERY = 10  # steps between reads of the ranks' stop flags under torchrun (see _loop)
StepHook = Callable[[int, float], None]  # (step just finished, its loss)
EvalHook = Callable[[int, dict], None]  # (step, {"train": loss, "val": loss}); may raise to stop


class Trainer:
    def __init__(self, run: Run, overrides: list[str] | tuple[str, ...] = (), started: float | None = None):
        """`overrides`: the command line's, recorded in summary.json; `started`: when the run
        began (its set-up included in the reported wall time)."""
        self.run, self.ts = run, run.cfg.train
        self.overrides = list(overrides)
        self.t_start = started or time.time()
        self.elapsed_before = run.progress.elapsed_s  # a resumed run's time so far
        if run.progress.tokens_seen is None:  # a checkpoint from before they were counted: as it reported them
            run.progress.tokens_seen = run.progress.step * run.tokens_per_step
        self.saved_step = run.progress.step if run.progress.step > 0 else None  # a resumed run's is on disk
        self.peak_flops = devices.peak_flops(run.rt.device, self.ts.peak_flops)  # None: no MFU
        self.lr, self.tokens_per_s = 0.0, 0.0
        self.last_eval: dict[str, float] = dict(run.progress.last_eval)  # a resumed run's, until its next eval
        self.evals_done = 0
        self.records = RunRecords()  # fit() opens the real ones on rank 0
        self.guard = steps.Guard()  # the non-finite verdicts not read yet
        # Rank 0 writes whole checkpoints in this thread (gpt.checkpoints.writer); sharded runs
        # write their shards through DCP, blocking.
        self.writer = Writer(run.rt.device) if self.ts.async_save and not run.parallel.sharded else None
        self.tokens_in_interval = 0  # real tokens this rank trained on since the last log line
        # A sharded model (FSDP2) runs only with every rank taking part, so every rank computes the
        # samples and task scores training shows (the same: same weights, seed and items) and rank 0
        # shows them.
        self.lockstep = run.parallel.lockstep
        # Sharded and compiled, the plain model's blocks are compiled in place (parallel.shard), so
        # what only `fit` shows (samples, task scores, attention maps) runs them eager: decoding's
        # single-token steps with a cache would compile a graph for each layer and cache state
        # until dynamo's recompile limit (8), then decode eager anyway.
        self.plain = (
            (lambda: torch.compiler.set_stance("force_eager")) if run.rt.compile and self.lockstep else contextlib.nullcontext
        )

    # --- the public steps ------------------------------------------------------------------------

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step (with accumulation, clipping and the non-finite guard); returns the
        mean loss and the gradient norm as tensors (reading them syncs with the device)."""
        r, ts = self.run, self.ts
        self.lr = r.schedule.set_lr(r.optimizer, r.progress.step)
        result = steps.train_step(r.step_model, r.batches, r.optimizer, r.scaler, r.rt, ts.grad_accum_steps, ts.grad_clip, r.dist)
        if self._histograms_at(r.progress.step + 1):  # gradients exist only until the update below
            self._histograms(r.progress.step + 1, "grads")
        steps.apply_or_skip(r, result, self.guard)
        if self.writer is not None and not self.writer.ready and r.dist.is_main:  # the state to save exists now
            self.writer.prepare([saving.fill(r, self.last_eval, rng=[])])
        r.progress.step += 1
        r.progress.tokens_seen += r.tokens_per_step
        self.tokens_in_interval += result.tokens
        return result.loss, result.norm

    def settle(self) -> None:
        """Read the non-finite guard's verdicts of the steps so far (a host sync): counts, warnings,
        and the stop of a diverged run. Before anything that saves or reports the state."""
        self.guard.settle(self.run, self.ts.max_bad_steps, evaluated=self.evals_done > 0)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss over `eval_iters` batches per split: the batches one process draws (a fixed
        seed: the same at every eval, so successive evals compare the model, not the draw),
        shared out over the ranks (rank r takes every world-th from the r-th) and their losses
        summed over them, so that N processes evaluate what one does in 1/N of the time. Every
        rank runs as many passes (a sharded forward needs all of them): where the batches do not
        share out evenly, a rank without a last one runs the first again, weighing nothing. Small
        batches go through a pass `group` at a time (Run.eval_group)."""
        r, n = self.run, self.ts.eval_iters
        rank, world = r.dist.rank, r.dist.world_size
        full = n // world  # the batches every rank has
        group = r.eval_group(full)
        r.step_model.eval()
        out = {}
        for i, split in enumerate(("train", "val")):
            batches = r.batches_for(split, self.ts.batch_size, seed=r.cfg.seed + 1 + i, alone=True)
            total, part, first, last = torch.zeros((), device=r.rt.device), [], None, None
            for j in range(n):  # every rank draws all n (one process's stream), keeping its own
                batch = batches.next()
                first = batch if j == 0 else first
                if j % world != rank:
                    continue
                if j // world == full:  # a last one, beyond what every rank has
                    last = batch
                    continue
                part.append(batch)
                if len(part) == group:
                    total += self._eval_loss(part) * group
                    part = []
            if full * world < n:  # one pass more on every rank: its last batch, or the first for nothing
                total += self._eval_loss([first if last is None else last]) * (last is not None)
            out[split] = distributed.mean(total / n, r.dist).item() * world
        r.step_model.train()
        return out

    def _eval_loss(self, batches: list) -> torch.Tensor:
        """The mean loss of batches of one shape, in one forward pass."""
        with self.run.rt.autocast():
            _, loss = self.run.eval_model(torch.cat([b.x for b in batches]), torch.cat([b.y for b in batches]))
        return loss.float()

    def evaluate_tasks(self) -> dict[str, dict]:
        """train.eval_tasks' figures for the model as it is now ({task: {metric: value}}; rank 0,
        or every rank of a sharded run)."""
        from gpt.evals.tasks import evaluate_task  # (a run without eval tasks never reads them)

        r = self.run
        with r.rt.autocast(), self.plain():
            return {
                name: evaluate_task(r.model, r.data.tokenizer, name, items, r.rt.device, self.ts.batch_size, self.lockstep)
                for name, items in r.tasks.items()
            }

    def save(self, best: bool = False, wait: bool = True) -> Path | None:
        """A full-state checkpoint of the current step, and best.pt if `best` (see saving.save).
        Returns once it is on disk; wait=False (the loop's saves, under train.async_save): while
        the writer's thread writes it."""
        self.run.progress.elapsed_s = self.elapsed()
        path = saving.save(self.run, self.last_eval, best, self.ts.keep_last, self.writer)
        if wait:
            saving.flush(self.run, self.writer)
        if path is not None and path.name == runs.step_file(self.run.progress.step):
            self.saved_step = self.run.progress.step
        return path

    def elapsed(self) -> float:
        """Wall-clock seconds the run has taken so far, set-up included, over all its resumes (the
        time between a stop and its resume is not the run's; the steps redone after a kill are)."""
        return self.elapsed_before + time.time() - self.t_start

    def sample(self, n_tokens: int) -> str:
        """A sample from the model as it is now (what training shows at evals and at the end): a
        continuation of nothing, or on conversations, the reply to the first val conversation's
        first user turn, shown after that turn."""
        from gpt.config import SamplingSettings
        from gpt.generation import generate  # (a run that shows no samples never reads it)

        r = self.run
        prompt, shown = r.data.sample_prompt()
        # On a CPU decoding stays fp32, as sample.py's does under dtype=auto (gpt.runtime.devices.
        # pick_dtype), whatever the steps train in: bf16 autocast there only adds casts to
        # single-token steps (100 tokens of the quickstart model: 0.45-0.58 s under it, 0.32-0.43 s
        # without).
        precision = contextlib.nullcontext() if r.rt.device.type == "cpu" else r.rt.autocast()
        with precision, self.plain():
            settings = SamplingSettings(max_new_tokens=n_tokens, seed=r.cfg.seed)
            return (
                shown
                + generate(r.model, r.data.tokenizer, [prompt or ""], settings, device=r.rt.device, lockstep=self.lockstep)[0][0]
            )

    # --- fit --------------------------------------------------------------------------------------

    def fit(self, on_step: StepHook | None = None, on_eval: EvalHook | None = None, stop: StopRequest | None = None) -> dict:
        """Train to `train.max_iters`; returns the run's summary (what summary.json holds).
        Raises `Preempted` after a SIGTERM / Ctrl-C stop has saved its checkpoint. `stop`: the
        caller's signal handling, when it began before this (`train` covers set-up too)."""
        r = self.run
        stop = stop or StopRequest(log=logger.warning if r.dist.is_main else quiet)
        with stop:
            return self._fit(stop, on_step, on_eval)

    def _fit(self, stop: StopRequest, on_step: StepHook | None, on_eval: EvalHook | None) -> dict:
        r = self.run
        self._open_records()
        shown = r.dist.is_main and sys.stderr.isatty()  # no bar in log files and CI output
        bar = tqdm(
            total=self.ts.max_iters, initial=r.progress.step, unit="step", dynamic_ncols=True, leave=False, disable=not shown
        )
        said = alarm.last_words(lambda reason: self.records.summary.update(status="failed", error=reason))  # see train()
        failing: BaseException | None = None
        said.__enter__()
        try:
            stop.deferred = True  # from here a signal is answered between steps, with a checkpoint
            with console_redirected(shown):
                stopped = self._loop(stop, bar, on_step, on_eval)
            if self.lockstep:
                # Sharded, every rank samples: they agree on whether a signal came, and one coming
                # during the sample only sets the flag (a rank leaving mid-sample would strand the
                # others in its all-gathers); the sample takes seconds, then the run ends.
                requested = distributed.any_true(stop.requested, r.dist, r.rt.device)
            else:
                stop.deferred = False  # the steps are done: a signal now skips what is left
                requested = stop.requested
            if not stopped and requested:  # it came during the last eval and save
                r.log(f"{stop.reason} received: the final sample skipped (training had finished and was saved)")
            elif not stopped and self.ts.sample_tokens and (r.dist.is_main or self.lockstep):
                try:
                    text = self.sample(self.ts.sample_tokens)
                    if r.dist.is_main:
                        self.records.tb.text("sample", text, r.progress.step)
                        r.log(f"---------- sample at step {r.progress.step} ----------\n{text}\n" + "-" * 42)
                except Preempted:
                    r.log(f"{stop.reason} received: the final sample skipped (training had finished and was saved)")
                except TinyGPTError as e:  # a diverged model has nothing to show; the run itself is done
                    r.log(f"notice: no final sample: {e}")
            saving.flush(r, self.writer)  # the last checkpoint is on disk before the run says it is done
            stop.deferred = False
            status = "interrupted" if stopped else "finished"
            self.records.summary.update(
                status=status, step=r.progress.step, wall_s=time.time() - self.t_start, elapsed_s=self.elapsed()
            )
        except BaseException as e:
            stop.deferred = False
            if self.writer is not None:  # a write in flight completes (or fails alone) before the error goes up
                self.writer.wait()
            failed = not isinstance(e, (KeyboardInterrupt, Preempted))
            oom = out_of_memory(e)
            # a collective cut short by a peer that exited is that peer's failure, not this process's
            reason = alarm.cut_short(e) if alarm.peer_gone(e) else one_line(oom or e)
            failing = e
            # (on a full disk the records may not be written either: the error that stopped the run goes up)
            with contextlib.suppress(OSError):
                self.records.summary.update(
                    status="failed" if failed else "interrupted",
                    error=reason if failed else None,
                    wall_s=time.time() - self.t_start,
                    elapsed_s=self.elapsed(),
                )
            if oom is not None:
                raise oom from None
            raise
        finally:
            said.__exit__(None, None, None)
            bar.close()
            try:
                self.records.close()
            except TinyGPTError as e:
                if failing is None:
                    raise
                r.log(f"warning: {e}")
        if stopped:
            raise Preempted(f"stopped at step {r.progress.step}")
        self._log_done()
        return dict(self.records.summary.data)

    def _open_records(self) -> None:
        r = self.run
        if r.dist.is_main:
            # From the checkpoint, not the old summary.json: a kill -9 can leave that one behind
            # or ahead of where the run resumes.
            summary = dict(
                step=r.progress.step,
                best_val_loss=r.progress.best_val if math.isfinite(r.progress.best_val) else None,
                final_val_loss=self.last_eval.get("val"),
                tokens_seen=r.progress.tokens_seen,
                run_dir=str(r.out_dir),
                **compute.counts(r.model),  # params, params_non_embedding, flops_per_token
                flops=r.progress.tokens_seen * r.model.flops_per_token(),  # training FLOPs so far
                flops_budget=self.ts.flops_budget,
                overrides=self.overrides,
                model=registry.summary(r.model_config),
                chat=r.data.kind == "chat",  # trained on conversations (gpt.data.chat): `tinygpt chat` talks to it
            )
            tags = []
            if r.tasks:
                from gpt.evals.tasks import metric_names

                tags = [f"tasks/{name}/{metric}" for name in r.tasks for metric in metric_names(name)]
            summary.update(best_elapsed_s=r.progress.best_elapsed_s)
            self.records = RunRecords(r.out_dir, asdict(r.cfg), r.progress.step, task_tags=tags, clock=self.elapsed, **summary)
        if r.progress.step >= self.ts.max_iters:
            r.log(
                f"this run already reached step {r.progress.step} (train.max_iters={self.ts.max_iters}); "
                f"raise train.max_iters to train longer"
            )

    def _loop(self, stop: StopRequest, bar, on_step: StepHook | None, on_eval: EvalHook | None) -> bool:
        """Steps and evals until max_iters (False) or a stop request (True, after saving)."""
        r, ts = self.run, self.ts
        first = r.progress.step
        t_interval, steps_in_interval = time.time(), 0
        while True:
            step = r.progress.step
            evaluated = False
            if (step % ts.eval_interval == 0 or step == ts.max_iters) and not (step == first and step > 0):
                evaluated = True
                self.settle()
                if steps_in_interval and not self.tokens_per_s:  # a run too short to log a step has a speed too
                    self.tokens_per_s = self._tokens_per_s(time.time() - t_interval)
                self._eval_and_save(step)
                if on_eval is not None:
                    on_eval(step, dict(self.last_eval))
                t_interval, steps_in_interval, self.tokens_in_interval = time.time(), 0, 0  # eval time is no step time
            if step >= ts.max_iters:
                self.settle()
                return False
            # Alone, the stop flag is a host bool; under torchrun reading the ranks' flags is an
            # all-reduce and a host sync, so it happens every STOP_CHECK_EVERY steps, and after
            # each eval (a sync already, and a stop there needs no second save).
            # A background checkpoint write that failed (a full disk) stops the run at the same
            # check, every rank raising its error (saving.flush), rather than at the next save.
            check = not r.dist.enabled or evaluated or (step - first) % STOP_CHECK_EVERY == 0
            failed_write = self.writer is not None and self.writer.failed
            if check and distributed.any_true(stop.requested or failed_write, r.dist, r.rt.device):
                saving.flush(r, self.writer)
                self.settle()
                self._stop(stop)
                return True
            loss, norm = self.step()
            steps_in_interval += 1
            bar.update(1)
            if on_step is not None:
                on_step(r.progress.step, distributed.mean(loss, r.dist).item())
            if r.progress.step % ts.log_interval == 0:
                self.settle()
                self._log_step(loss, norm, time.time() - t_interval, steps_in_interval, bar)
                t_interval, steps_in_interval, self.tokens_in_interval = time.time(), 0, 0
            elif r.progress.step == first + 1:
                # The first step of a process compiles (compile=true), warms up kernels and
                # allocators: left out of the first logged speed and MFU.
                t_interval, steps_in_interval, self.tokens_in_interval = time.time(), 0, 0

    def _tokens_per_s(self, seconds: float) -> float:
        """Real tokens a second, over all ranks, since the interval began (conversations count
        their tokens, not their padding)."""
        r = self.run
        tokens = self.tokens_in_interval
        if r.dist.enabled:  # ranks draw different conversations: their counts differ
            tokens = distributed.mean(torch.tensor(float(tokens), device=r.rt.device), r.dist).item() * r.dist.world_size
        return tokens / max(seconds, 1e-9)

    def _histograms(self, step: int, kind: str) -> None:
        """TensorBoard histograms of every parameter's weights or gradients (`kind`), each gathered
        whole where the run is sharded (a collective every rank walks; rank 0 records)."""
        for name, p in named_parameters(self.run.model):
            values = p if kind == "weights" else p.grad
            whole = gathered(values.detach(), keep=self.run.dist.is_main) if values is not None else None
            if whole is not None:
                self.records.tb.histogram(f"{kind}/{name}", whole, step)

    def _histograms_at(self, step: int) -> bool:
        """Whether the eval at `step` (if one comes there) writes histograms: then the gradients
        of the step that ends there are written under it, beside that eval's weights, so the last
        eval of a run has both too."""
        ts = self.ts
        is_eval = step % ts.eval_interval == 0 or step == ts.max_iters
        return bool(ts.histogram_every) and is_eval and (self.evals_done + 1) % ts.histogram_every == 0

    def _stop(self, stop: StopRequest) -> None:
        r = self.run
        # Saved already when the stop comes right after an eval's save, or before the first step
        # of a resumed run: once is enough (a preemption's grace period is short).
        saving.flush(r, self.writer)  # an eval's checkpoint in flight is on disk before it is named
        path = runs.latest(r.out_dir) if self.saved_step == r.progress.step else self.save()
        r.log(f"stopped at step {r.progress.step} ({stop.reason or 'signal on another rank'}); checkpoint {path or 'none'}")

    def _eval_and_save(self, step: int) -> None:
        r, ts, p = self.run, self.ts, self.run.progress
        self.last_eval = losses = self.evaluate()
        # A state that will not be saved (a non-finite step just skipped, see save) is no best:
        # the run's best must be what best.pt holds. (Step 0 has no checkpoint either way.)
        improved = losses["val"] < p.best_val and (step == 0 or saving.healthy(r, self.last_eval))
        now = self.elapsed()
        if improved:
            p.best_val, p.best_elapsed_s = losses["val"], now
        self.evals_done += 1
        self.records.eval(step, losses["train"], losses["val"], p.best_val, elapsed_s=now)
        r.log(f"eval step {step}: train {losses['train']:.4f}, val {losses['val']:.4f}" + (" (best)" if improved else ""))
        finite = all(math.isfinite(v) for v in losses.values())  # a diverged model has nothing to show
        if finite and ts.eval_sample_tokens and (r.dist.is_main or self.lockstep):  # see `lockstep`
            text = self.sample(ts.eval_sample_tokens)
            if r.dist.is_main:
                self.records.tb.text("samples", text, step)
        if finite and (r.dist.is_main or self.lockstep):  # see `lockstep`: the same items and batch, the same figures
            if r.tasks:
                results = self.evaluate_tasks()
                if r.dist.is_main:
                    self._log_tasks(step, results)
            if ts.attention_every and self.evals_done % ts.attention_every == 0 and hasattr(r.model, "attention_maps"):
                x = r.data.batches("val", r.model_config.block_size, 1, r.rt.device, seed=r.cfg.seed).next().x
                with self.plain():
                    maps = r.model.attention_maps(x)
                if r.dist.is_main:
                    self.records.tb.attention_images(step, maps)
        if ts.histogram_every and self.evals_done % ts.histogram_every == 0:
            self._histograms(step, "weights")
        seen = r.progress.tokens_seen
        self.records.summary.update(
            step=step,
            best_val_loss=p.best_val,
            final_val_loss=losses["val"],
            tokens_seen=seen,
            flops=seen * r.model.flops_per_token(),
            tokens_per_s=self.tokens_per_s,
            wall_s=time.time() - self.t_start,
            elapsed_s=self.elapsed(),
            best_elapsed_s=p.best_elapsed_s,
        )
        if step > 0:
            self.save(best=improved, wait=False)

    def _log_tasks(self, step: int, results: dict[str, dict]) -> None:
        figures = {name: {k: v for k, v in res.items() if k not in ("task", "items")} for name, res in results.items()}
        shown = "; ".join(f"{name} " + ", ".join(f"{k} {v:.4f}" for k, v in f.items()) for name, f in figures.items())
        self.run.log(f"tasks step {step}: {shown}")
        self.records.tasks(step, figures)

    def _log_step(self, loss: torch.Tensor, norm: torch.Tensor, seconds: float, n_steps: int, bar) -> None:
        r = self.run
        loss_value = distributed.mean(loss, r.dist).item()  # host sync, once per interval
        dt = seconds / n_steps
        self.tokens_per_s = self._tokens_per_s(seconds)
        extra, mfu = {"grad_norm": norm.item(), "perf/tokens_per_s": self.tokens_per_s}, ""
        if self.peak_flops:
            extra["perf/mfu"] = r.model.flops_per_token() * self.tokens_per_s / (self.peak_flops * r.dist.world_size)
            mfu = f", MFU {extra['perf/mfu'] * 100:.1f}%"
        r.log(
            f"step {r.progress.step}/{self.ts.max_iters}: loss {loss_value:.4f}, lr {self.lr:.2e}, {dt * 1000:.1f} ms/step, "
            f"{self.tokens_per_s:,.0f} tok/s{mfu}"
        )
        bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{self.tokens_per_s:,.0f}", refresh=False)
        self.records.train(r.progress.step, loss_value, self.lr, dt * 1000, **extra)
        notice = r.rt.threads.observe() if r.rt.threads is not None else None
        if notice:
            r.log(notice)
        self.records.summary.beat(step=r.progress.step, tokens_per_s=self.tokens_per_s)  # progress, and "still here"

    def _log_done(self) -> None:
        r, p = self.run, self.run.progress
        final = self.last_eval.get("val", float("nan"))
        skipped = f"; {p.bad_total} non-finite step(s) skipped" if p.bad_total else ""
        r.log(f"done in {time.time() - self.t_start:.1f} s: best val loss {p.best_val:.4f} (final {final:.4f}){skipped}")
        r.log(f"checkpoints: {r.ckpt_dir}   tensorboard: tensorboard --logdir {r.out_dir / 'tb'}")
