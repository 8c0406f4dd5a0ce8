"""An IsoFLOP scaling study: for each compute budget, train a ladder of model sizes on exactly that
many FLOPs, fit each budget's best size, and the power laws that say how big a model, trained on
how many tokens, your next budget should buy.

    tinygpt scaling preset=smoke out=outputs/scaling/smoke          # 3 budgets x 3 tiny sizes, ~1 minute
    tinygpt scaling preset=cpu out=outputs/scaling/cpu check=true   # 3 x 4 on Tiny Shakespeare, ~20 min on 2 cores
    tinygpt scaling preset=gpu out=outputs/scaling/gpu device=cuda  # FineWeb-Edu, GPT-2 BPE (one GPU)

Study settings: preset, out (default outputs/scaling/<preset>), budgets=[...] (FLOPs),
depths=[...] (model.depth), predict=<FLOPs>, check=true (train the predicted optimum at
`predict` and compare). Any other key=value is given to every training job (e.g. optim=adamw, data=tinystories, hydra/launcher=slurm). The jobs run as one
Hydra multirun into <out>/runs/; rerunning the same command reuses the finished ones. <out> gets
report.md, fit.json, isoflops.png, frontier.png and loss_vs_compute.png.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import fields
from pathlib import Path

from gpt.apps import common
from gpt.config import ScalingConfig
from gpt.errors import TinyGPTError
from gpt.tracking import ensure_console_logging, logger

_COMMAND = "tinygpt scaling"
_OWN = {f.name for f in fields(ScalingConfig)} | {"preset"}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    own = [a for a in argv if a.startswith("-") or a.split("=", 1)[0].lstrip("+~") in _OWN or "=" not in a]
    jobs = [a for a in argv if a not in own]
    common.run_command(own, "scaling", _COMMAND, __doc__, lambda s: run(s, jobs, argv), verbatim=("out",))


def run(s: ScalingConfig, extra: list[str], argv: list[str]) -> dict:
    """The whole study (see gpt.scaling.study); returns what fit.json holds."""
    from gpt.data import load_data
    from gpt.scaling import fit, report, study

    ensure_console_logging()
    log = logger.info
    out = Path(s.out).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise TinyGPTError(f"out={s.out} is a file; name a folder for the study (new, or an earlier study's to continue it)")
    overrides = [*s.train, *extra]
    _refuse_horizon_overrides(overrides)
    family = common.compose("config", [o for o in overrides if not o.startswith("model.")], "tinygpt train").model
    if not hasattr(family, "depth"):
        raise TinyGPTError(
            "this model has no model.depth (a recurrent one?); a scaling study walks a GPT's sizes: model=gpt-micro-modern"
        )
    first = [f"model.depth={s.depths[0]}", f"train.flops_budget={min(s.budgets):g}"]
    settings = common.compose("config", [*overrides, *first], "tinygpt train")
    data = load_data(settings.data, settings.paths.data_root(), log=log)
    vocab = settings.model.vocab_size or data.tokenizer.vocab_size
    jobs = study.plan(s, settings, vocab, log)
    per_step = study.tokens_per_step(settings)
    log(
        f"study: {len(s.budgets)} budgets x {len(s.depths)} sizes (N {min(j.params for j in jobs):,}..{max(j.params for j in jobs):,}), "
        f"{per_step:,} tokens/step; {sum(j.steps for j in jobs):,} steps in all"
    )

    status = study.launch(out, s, overrides, log)
    if status < 0:  # killed outright (kill -9, out of memory): nothing of its own was said
        common.fail(f"the training process was ended by signal {-status}; rerun the same command to resume the study")
    if status not in (0, 1):  # refused before it trained (the reason is printed above), or Ctrl-C
        sys.exit(status)
    got = study.collect(out, jobs)
    if got.unfinished:  # stopped (SIGTERM): the sweep ends at the job it was in
        log(
            f"the study stopped with {len(got.unfinished)} of {len(jobs)} jobs unfinished; rerun the same command to finish "
            f"(finished jobs are kept, an interrupted one resumes)"
        )
        return {}
    result = fit.fit(got.points, s.predict)
    result["seconds"] = {"jobs": got.seconds}
    if s.check:
        result["check"] = _check(out, result["prediction"], settings, vocab, overrides)
        result["seconds"]["check"] = result["check"].pop("elapsed_s")
    header = [
        f"# Scaling study: {out.name}",
        "",
        f"`{' '.join(['tinygpt scaling', *(shlex.quote(a) for a in argv)])}`",
        "",
        f"Data `{settings.data.name}`, {per_step:,} tokens per step; sizes `model.depth` in {s.depths} "
        f"(depth layers and heads, {settings.model.aspect_ratio} dims per head); budgets "
        + ", ".join(f"{b:.3g}" for b in s.budgets)
        + " training FLOPs (6N + attention per token, gpt/model/compute.py). Loss: each run's final val loss.",
        "",
        f"Time: {got.seconds / 60:.1f} min for the {len(jobs)} jobs (their wall-clock times, summed)"
        + (f", {result['seconds']['check'] / 60:.1f} min for the check." if result["seconds"].get("check") else "."),
    ]
    report.write(out, result, got.points, got.failed, got.unfinished, header)
    _say(out, result, got, len(jobs))
    if got.failed:
        sys.exit(1)
    return result


# What the study sets for each job itself: its size and its horizon.
_PER_JOB = (
    "model.depth",
    "model.n_layer",
    "model.n_head",
    "model.n_embd",
    "train.flops_budget",
    "train.max_iters",
    "train.tokens_per_param",
)


def _refuse_horizon_overrides(overrides: list[str]) -> None:
    """What the jobs may not be given: their size and horizon (the study's), or a sweep of a
    setting (its jobs would share folders: one study per value)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for arg in overrides:
        key = arg.split("=", 1)[0].lstrip("+~")
        if key in ("hydra.sweep.dir", "hydra.sweep.subdir", "hydra.run.dir"):
            raise TinyGPTError(f"{arg}: the study puts its jobs in <out>/runs/<job>; choose the folder with out=<folder>")
        if key in _PER_JOB:
            raise TinyGPTError(
                f"{arg}: the study sets each job's size and horizon itself; give sizes as depths=[...] and budgets as budgets=[...]"
            )
        try:
            sweep = OverridesParser.create().parse_override(arg).is_sweep_override()
        except Exception:  # unreadable: composing the jobs says so in one line
            continue
        if sweep:
            raise TinyGPTError(f"{arg}: a study's jobs take one value per setting; run one study per value (out=<folder> each)")


def _check(out: Path, pred: dict, settings, vocab: int, overrides: list[str]) -> dict:
    """Train the ladder's size nearest the predicted N_opt on the predicted budget; its loss."""
    from gpt.scaling import study

    depth, params = study.nearest_depth(settings, pred["params"], vocab)
    name = f"model.depth={depth},train.flops_budget={study.budget_text(pred['budget'])}"  # as Hydra names the study's jobs
    run_dir = out / study.CHECK / name
    logger.info(
        f"check: depth {depth} ({params:,} parameters; predicted N_opt {pred['params']:,.0f}) on {pred['budget']:.3g} FLOPs"
    )
    code = study.train_one(run_dir, depth, pred["budget"], overrides)
    summary = study.read_summary(run_dir)
    finished = code == 0 and summary.get("status") == "finished"
    return {
        "depth": depth,
        "params": params,
        "run": f"{study.CHECK}/{name}",
        "status": summary.get("status", "not run"),
        "tokens": summary.get("tokens_seen"),
        "flops": summary.get("flops"),
        "loss": summary.get("final_val_loss") if finished else None,
        "elapsed_s": summary.get("elapsed_s"),
    }


def _say(out: Path, result: dict, got, n_jobs: int) -> None:
    log, pred = logger.info, result["prediction"]
    for o in result["optima"]:
        edge = (
            "" if o["inside"] else " (outside the ladder: extrapolated" + ("" if o["in_fit"] else ", left out of the laws") + ")"
        )
        log(f"budget {o['budget']:.3g}: N_opt {o['params']:,.0f}, D_opt {o['tokens']:,.0f} tokens, L_opt {o['loss']:.4f}{edge}")
    log(f"fit: N_opt ~ C^{result['a']:.3f} (a), D_opt ~ C^{result['b']:.3f} (b), L_opt ~ C^{result['loss_exponent']:.4f}")
    log(
        f"prediction at {pred['budget']:.3g} FLOPs: N_opt {pred['params']:,.0f}, D_opt {pred['tokens']:,.0f} tokens, L_opt {pred['loss']:.4f}"
    )
    check = result.get("check")
    if check and check["loss"] is not None:
        log(f"check: depth {check['depth']} measured {check['loss']:.4f} vs predicted {pred['loss']:.4f}")
    elif check:
        log(f"check: the run did not finish ({check['status']}); see {out / check['run']}")
    log(f"report: {out / 'report.md'}")
    if got.failed:
        first = next(iter(got.failed.items()))
        print(
            f"error: {len(got.failed)} of {n_jobs} jobs failed and are left out of the fit (first: {first[0]}: {first[1]}); "
            f"see {out / 'report.md'}",
            file=sys.stderr,
        )
