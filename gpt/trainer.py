"""The training loop: the library side of `train.py`.

`train(cfg)` takes the resolved config as a plain dict, validates all of it before touching
data or models, trains, and returns the best validation loss (what a sweeper optimises).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from gpt import checkpoint, runtime
from gpt.config import TrainSettings, optim_settings, train_settings
from gpt.data import Dataset, load_data
from gpt.data.loader import RandomWindows
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.optim import CosineSchedule, build_optimizer
from gpt.generation import SamplingConfig, generate
from gpt.tracking import TensorBoardTracker, ensure_console_logging, logger


def model_config(cfg: dict, data: Dataset) -> GPTConfig:
    """The model section of the config, with the vocabulary taken from the data by default."""
    model_cfg = dict(cfg["model"])
    vocab = data.tokenizer.vocab_size
    if model_cfg.get("vocab_size") is None:
        model_cfg["vocab_size"] = vocab
    elif model_cfg["vocab_size"] < vocab:
        raise TinyGPTError(
            f"model.vocab_size={model_cfg['vocab_size']} is smaller than the tokenizer's {vocab} tokens; "
            f"set model.vocab_size=null to take it from the data"
        )
    return GPTConfig.from_dict(model_cfg)


def check_data_fits(data: Dataset, block_size: int) -> None:
    for split, tokens in (("train", data.train), ("val", data.val)):
        if len(tokens) < block_size + 1:
            raise TinyGPTError(
                f"model.block_size={block_size} is longer than the {split} split ({len(tokens)} tokens); "
                f"use a block_size below {len(tokens)} or more data"
            )


@torch.no_grad()
def estimate_loss(model, data: Dataset, ts: TrainSettings, block_size: int, rt, seed: int) -> dict[str, float]:
    """Mean loss over `eval_iters` batches per split. The batches are the same at every eval
    (fixed seed), so successive evals compare the model, not the luck of the draw."""
    model.eval()
    out = {}
    for i, (split, tokens) in enumerate((("train", data.train), ("val", data.val))):
        batches = RandomWindows(tokens, block_size, ts.batch_size, rt.device, seed=seed + 1 + i)
        total = torch.zeros((), device=rt.device)
        for _ in range(ts.eval_iters):
            x, y = batches.next()
            with rt.autocast():
                _, loss = model(x, y)
            total += loss.float()
        out[split] = total.item() / ts.eval_iters  # one host sync per split, not per batch
    model.train()
    return out


def train(cfg: dict) -> float:
    ensure_console_logging()
    log = logger.info
    t_start = time.time()

    # --- validate everything cheap first -------------------------------------------------
    ts = train_settings(cfg)
    out_dir = Path(cfg["paths"]["output_dir"])
    checkpoint.ensure_fresh_run_dir(out_dir)
    # Check the model shape now (the vocabulary comes from the data later) so a typo fails in
    # a second instead of after the data is downloaded and prepared.
    GPTConfig.from_dict({**cfg["model"], "vocab_size": cfg["model"].get("vocab_size") or 1})
    optim = optim_settings(cfg)
    schedule = CosineSchedule.from_settings(optim)
    rt = runtime.setup(cfg["device"], cfg["dtype"], cfg["compile"])
    log(rt.describe())
    runtime.seed_everything(cfg["seed"])

    # --- data and model ----------------------------------------------------------------------
    data = load_data(cfg["data"], cfg["paths"]["data_dir"], log=log)
    mcfg = model_config(cfg, data)
    check_data_fits(data, mcfg.block_size)
    log(f"data {data.name}: {len(data.train):,} train / {len(data.val):,} val tokens, vocab {data.tokenizer.vocab_size}")

    model = GPT(mcfg).to(rt.device)
    optimizer = build_optimizer(model, optim, rt.device)
    scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.use_grad_scaler)
    step_model = torch.compile(model) if rt.compile else model
    tokens_per_step = ts.batch_size * mcfg.block_size * ts.grad_accum_steps
    log(
        f"model {mcfg.n_layer}L {mcfg.n_head}H {mcfg.n_embd}D block {mcfg.block_size}: {model.num_params():,} parameters; "
        f"batch {ts.batch_size} x accum {ts.grad_accum_steps} = {tokens_per_step:,} tokens/step"
    )

    tracker = TensorBoardTracker(out_dir / "tb")
    tracker.config(cfg)
    batches = RandomWindows(data.train, mcfg.block_size, ts.batch_size, rt.device, seed=cfg["seed"])
    ckpt_dir = out_dir / checkpoint.CKPT_DIR

    def payload(step: int, best: float, with_optimizer: bool) -> dict:
        p = {
            "model": checkpoint.unwrap(model).state_dict(),
            "model_config": mcfg.to_dict(),
            "tokenizer": data.tokenizer.to_dict(),
            "step": step,
            "best_val_loss": best,
            "config": cfg,
        }
        if with_optimizer:
            p["optimizer"] = optimizer.state_dict()
            p["scaler"] = scaler.state_dict()
        return p

    # --- the loop ------------------------------------------------------------------------------
    best_val = math.inf
    last_losses: dict[str, float] = {}
    t_interval, steps_in_interval = time.time(), 0
    try:
        for step in range(ts.max_iters + 1):
            if step % ts.eval_interval == 0 or step == ts.max_iters:
                last_losses = estimate_loss(step_model, data, ts, mcfg.block_size, rt, seed=cfg["seed"])
                tracker.scalars(step, {"loss/train_eval": last_losses["train"], "loss/val": last_losses["val"]})
                improved = last_losses["val"] < best_val
                best_val = min(best_val, last_losses["val"])
                log(f"eval step {step}: train {last_losses['train']:.4f}, val {last_losses['val']:.4f}" + (" (best)" if improved else ""))
                if step > 0:
                    if improved:
                        checkpoint.save(ckpt_dir / checkpoint.BEST, payload(step, best_val, with_optimizer=False))
                    checkpoint.save(ckpt_dir / checkpoint.LAST, payload(step, best_val, with_optimizer=True))
                t_interval, steps_in_interval = time.time(), 0  # keep eval time out of step timing
            if step == ts.max_iters:
                break

            lr = schedule(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for _ in range(ts.grad_accum_steps):
                x, y = batches.next()
                with rt.autocast():
                    _, loss = step_model(x, y)
                scaler.scale(loss / ts.grad_accum_steps).backward()
            if ts.grad_clip > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), ts.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            steps_in_interval += 1

            if (step + 1) % ts.log_interval == 0:
                loss_value = loss.item()  # host sync: only once per log interval
                dt = (time.time() - t_interval) / steps_in_interval
                tok_s = tokens_per_step / dt
                log(f"step {step + 1}/{ts.max_iters}: loss {loss_value:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/step, {tok_s:,.0f} tok/s")
                tracker.scalars(step + 1, {"loss/train": loss_value, "lr": lr, "perf/tokens_per_s": tok_s, "perf/ms_per_step": dt * 1000})
                t_interval, steps_in_interval = time.time(), 0

        # --- wrap up ---------------------------------------------------------------------------
        if ts.sample_tokens:
            with rt.autocast():
                sampling = SamplingConfig(max_new_tokens=ts.sample_tokens, temperature=0.8, top_k=200, seed=cfg["seed"])
                text = generate(model, data.tokenizer, [""], sampling)[0][0]
            tracker.text("sample", text, ts.max_iters)
            log(f"---------- sample at step {ts.max_iters} ----------\n{text}\n" + "-" * 42)
    finally:
        tracker.close()

    wall = time.time() - t_start
    log(f"done in {wall:.1f} s: best val loss {best_val:.4f} (final {last_losses['val']:.4f})")
    log(f"checkpoints: {ckpt_dir}   tensorboard: tensorboard --logdir {out_dir / 'tb'}")
    log(f"sample with: python sample.py run_dir={out_dir}")
    return best_val
