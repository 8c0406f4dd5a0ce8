"""Train a model: `tinygpt train [key=value ...]` (or `python train.py ...` in a checkout), a
sweep with `-m` (`tinygpt train -m optim.lr=1e-3,3e-4`). `--cfg job` prints the composed
config, `--help` Hydra's help. The settings and their defaults: gpt/config.py (RunConfig).
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

from gpt.apps import common, sweep
from gpt.apps.common import JobFailed
from gpt.config import RunConfig
from gpt.errors import RunRefused, TinyGPTError, one_line

_COMMAND = "tinygpt train"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    multirun = any(a in ("-m", "--multirun") for a in argv)
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    own = [a for a in overrides if not a.startswith(("hydra.", "hydra/", "+hydra", "~hydra"))]
    if not any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        common.guard(lambda: common.refuse_bare_words(argv, _COMMAND))
        # Check everything before Hydra creates a run directory or rewrites an earlier run's
        # record; for a sweep, every value of its comma lists.
        if multirun:
            common.guard(lambda: common.check_sweep("config", own, _COMMAND, then=lambda s, here: preflight(s, here=here)))
        else:
            common.guard(lambda: preflight(common.compose("config", own, _COMMAND), _run_dir(overrides)))
        common.guard(lambda: protect_earlier_run(overrides))
    _hydra_main([*argv, *quiet_non_zero_ranks()])


def preflight(settings: RunConfig, run_dir: Path | None = None, here: bool = True) -> None:
    """The checks that need no data (model shape, data source and root, what the run resumes
    from, runtime; the others ran when the settings were built). `run_dir`: the directory the
    run trains into when the command names one (hydra.run.dir), which may hold a run to resume.
    `here`: whether it runs on this machine (a SLURM job finds its node's devices itself)."""
    from gpt import architectures, loading, runtime
    from gpt.data import sources

    architectures.config_from_settings(settings.model, vocab_size=1)
    sources.check(settings.data.source)
    _check_data_root(settings.paths.data_root())
    resumed = _resume_point(settings, run_dir)
    if resumed is not None:
        _check_tokenizer_kind(resumed, settings)
    if settings.init_from:
        loading.check(settings.init_from)
    if here:
        device, _ = runtime.pick_device(settings.device)
        runtime.pick_dtype(device, settings.dtype)
        runtime.pick_compile(device, settings.compile)


def _run_dir(overrides: list[str]) -> Path | None:
    values = dict(a.split("=", 1) for a in overrides)
    return Path(values["hydra.run.dir"]).expanduser() if "hydra.run.dir" in values else None


def _check_data_root(root: Path) -> None:
    """A data root that is a file (or under one) cannot hold prepared data."""
    for folder in (root, *root.parents):
        if folder.exists():
            if not folder.is_dir():
                raise TinyGPTError(f"paths.data_dir={root}: {folder} is a file; name a folder for prepared data")
            return


def _resume_point(settings: RunConfig, run_dir: Path | None):
    """The checkpoint the run will continue from, checked as setup will use it (loads, holds the
    training state, weights fit), or None for a new run."""
    from gpt import checkpoint, loading

    resume = checkpoint.parse_resume(settings.resume)
    if isinstance(resume, Path):
        if not resume.exists():
            raise TinyGPTError(f"resume={settings.resume!r} is neither auto, false, a checkpoint file nor a run directory")
        source = checkpoint.latest(resume) if resume.is_dir() else resume
        if source is None:
            raise TinyGPTError(f"resume={settings.resume}: the directory holds no ckpt-*.pt checkpoint to resume from")
        try:
            ckpt = loading.resumable(source)
        except TinyGPTError as e:
            raise TinyGPTError(f"resume={settings.resume}: {e}") from None
        if run_dir is not None:  # continuing elsewhere into a directory that holds a run of its own
            newest = lambda d: loading.newest_resumable(d)[0]  # noqa: E731
            source = checkpoint.resume_source(settings.resume, run_dir, newest)
            return loading.resumable(source)
        return ckpt
    if resume == checkpoint.AUTO and run_dir is not None and checkpoint.step_checkpoints(run_dir):
        return loading.resumable(loading.newest_resumable(run_dir)[0])
    return None


def _check_tokenizer_kind(resumed, settings: RunConfig) -> None:
    """A run resumes on data of its own tokenizer. The kind and, for a fixed vocabulary, the whole
    identity are known now; a char vocabulary or a BPE is fitted to its corpus, compared once the
    data is prepared (gpt.training.setup)."""
    from dataclasses import asdict

    from gpt.tokenizer import difference, normalize_spec, tokenizer_identity

    theirs, ours = tokenizer_identity(resumed.tokenizer), tokenizer_identity(normalize_spec(asdict(settings.data.tokenizer)))
    if "vocab_size" not in ours:  # known once the ranks file is read
        theirs.pop("vocab_size", None)
    # char and bpe are fitted to the corpus and hf read from its file: compared once the data is prepared
    if theirs["kind"] != ours["kind"] or (ours["kind"] not in ("char", "bpe", "hf") and theirs != ours):
        raise TinyGPTError(
            f"the checkpoint's tokenizer differs from data={settings.data.name}'s ({difference(resumed.tokenizer, ours)}); "
            f"resume with the data the run was trained on (data={resumed.config.get('data', {}).get('name', '?')})"
        )


def protect_earlier_run(overrides: list[str]) -> None:
    """Training into a directory that already holds a run resumes it (resume=auto) or is refused
    (resume=false). Either way Hydra would overwrite that run's .hydra/ record before any of our
    code runs: refuse first, or keep the earlier record as .hydra-<n>/."""
    from gpt import checkpoint, runlock

    values = dict(a.split("=", 1) for a in overrides)
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        if key in values and Path(values[key]).expanduser().exists() and not Path(values[key]).expanduser().is_dir():
            raise TinyGPTError(f"{key}={values[key]} is a file; name a directory (new, or a run's own to resume it)")
    if "hydra.run.dir" not in values or common.rank() != 0:
        return
    if "${" in values["hydra.run.dir"]:  # resolved by Hydra (a time, a job id): the trainer locks what it becomes
        return
    run_dir = Path(values["hydra.run.dir"]).expanduser()
    # Held from now until this process ends (the trainer finds it its own): between a check here
    # and a lock taken in the trainer, a second start could still move the running run's record.
    atexit.register(runlock.RunLock(run_dir, log=lambda m: print(m, file=sys.stderr)).acquire().release)
    if not checkpoint.has_run(run_dir):
        return
    if checkpoint.parse_resume(values.get("resume", "auto")) == checkpoint.NEVER:
        raise TinyGPTError(f"{run_dir} already holds a run and resume=false; train into a new directory or use resume=auto")
    record = run_dir / ".hydra"
    if record.is_dir():
        n = 1
        while (run_dir / f".hydra-{n}").exists():
            n += 1
        record.rename(run_dir / f".hydra-{n}")
        _set_aside.append((run_dir / f".hydra-{n}", record))


_set_aside: list[tuple[Path, Path]] = []  # (where the earlier run's record went, where it was)


def _put_back_earlier_record() -> None:
    """A run refused during set-up changed nothing: the earlier run's record goes back in place of
    this attempt's (its error stays in train.log)."""
    import shutil

    while _set_aside:
        kept, record = _set_aside.pop()
        if kept.is_dir():
            shutil.rmtree(record, ignore_errors=True)
            kept.rename(record)


def quiet_non_zero_ranks() -> list[str]:
    """Under torchrun every rank runs the Hydra app; only rank 0 may create the run directory
    and its logs (the trainer hands rank 0's directory to the others)."""
    if common.rank() == 0:
        return []
    return ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]


def _hydra_main(argv: list[str]) -> None:
    import hydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    common.register_schemas()
    sys.argv = [sys.argv[0], *argv]
    # Hydra prints an error it catches as a trimmed traceback; unless the user asked for its
    # full ones (HYDRA_FULL_ERROR), let errors reach us and say them in one line. A bug keeps
    # its traceback either way.
    ours = "HYDRA_FULL_ERROR" not in os.environ
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        hydra.main(version_base="1.3", config_path=str(common.config_dir()), config_name="config")(_task)()
    except (HydraException, OmegaConfBaseException) as e:
        if not ours:
            raise
        common.fail(str(e) if isinstance(e, JobFailed) else common.explain(e, _COMMAND))
    except TinyGPTError as e:  # raised by a sweeper between jobs (our search space)
        if not ours:
            raise
        common.fail(str(e))
    except ValueError as e:  # Optuna's study, when not one trial completed
        if not ours or "No trials are completed" not in str(e):
            raise
        common.fail("no trial of the search completed: each one's reason is in its summary.json and the sweep's leaderboard.md")


def _task(cfg) -> float:
    """One training job (a multirun calls it once per job); returns what sweepers minimise."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from gpt import distributed
    from gpt.preemption import Preempted
    from gpt.tracking import logger, record_failure
    from gpt.training import train  # imported here so that `--help` and config errors stay fast

    hydra_cfg = HydraConfig.get()
    overrides, output_dir = list(hydra_cfg.overrides.task), hydra_cfg.runtime.output_dir
    dist = distributed.from_env()
    say = logger.info if dist.is_main else (lambda *a: None)

    multirun = hydra_cfg.mode == RunMode.MULTIRUN

    def run() -> float:
        settings = common.settings_of(cfg)
        settings.paths.output_dir = settings.paths.output_dir or output_dir
        try:
            summary = train(settings, overrides=overrides)
        except RunRefused:
            _put_back_earlier_record()
            raise
        except Preempted:
            launcher = "torchrun <its options> train.py" if dist.enabled else _command("train")
            say(after_stop(Path(settings.paths.output_dir), launcher))
            if multirun and dist.is_main:  # the sweep stops here: its leaderboard shows this job too
                try:
                    sweep.write_leaderboard(hydra_cfg.sweep.dir)
                except Exception as e:  # a plot or a full disk must not turn the stop into a failure
                    logger.warning(f"could not write the leaderboard: {e}")
            raise
        say(f"sample with: {_command('sample')} run_dir={settings.paths.output_dir}")
        return summary.get("best_val_loss", float("nan"))  # what a sweeper minimises

    def sweep_job() -> float:
        """A failed job is recorded (its summary.json; for an error that is not a user's
        mistake, a crash of some library or of tinygpt itself, with its traceback beside it in
        traceback.txt) and the sweep goes on: Hydra's basic
        sweeper would stop at a raised error, so it gets a NaN (the sweep's end reports the
        failures, gpt.apps.sweep.LeaderboardCallback); a sweeper that draws trials (Optuna)
        gets JobFailed, a failed trial. Under torchrun the job stops as a single run does: the
        other ranks must not wait in a job that rank 0 has left."""
        try:
            return run()
        except Exception as e:
            if dist.enabled or isinstance(e, Preempted):  # a stop request stops the sweep, to be rerun
                raise
            reason = str(e) if isinstance(e, TinyGPTError) else _unexpected(e, Path(output_dir))
            record_failure(Path(output_dir), reason, replaces=one_line(e), overrides=overrides)
            logger.error(f"error: {reason}")
            sweep.FAILED[hydra_cfg.job.num] = reason
        # Out of the except block, the error and the frames it holds (the failed job's model and
        # optimizer) are gone: free them before the next job, which a sweeper may start while it
        # still holds the failure raised below.
        from gpt import runtime

        runtime.free_memory()
        if str(hydra_cfg.sweeper.get("_target_", "")).endswith("basic_sweeper.BasicSweeper"):
            return float("nan")
        raise JobFailed(f"job {hydra_cfg.job.num} ({' '.join(overrides)}) failed: {reason}")

    return common.guard(sweep_job if multirun else run)


def _unexpected(error: Exception, job_dir: Path) -> str:
    """One line for a job's unexpected error; its traceback goes to <job>/traceback.txt."""
    import traceback

    from gpt import io

    try:
        io.write_bytes(job_dir / "traceback.txt", "".join(traceback.format_exception(error)).encode())
        where = f"; traceback in {job_dir / 'traceback.txt'}"
    except OSError:
        where = ""
    return one_line(error) + where


def after_stop(run_dir: Path, launcher: str) -> str:
    """What to do after a signal stopped the run: resume it, or (stopped during set-up, before its
    first checkpoint) start it again."""
    from gpt import checkpoint

    if checkpoint.latest(run_dir) is None:
        return (
            f"stopped before the run saved a checkpoint: nothing to resume; start it again with {launcher} <the same overrides>"
        )
    return f"resume with: {launcher} <the same overrides> hydra.run.dir={run_dir}"


def _command(name: str) -> str:
    """How the user runs command `name`: as a checkout's script if that is how training started."""
    return f"python {name}.py" if Path(sys.argv[0]).name == "train.py" else f"tinygpt {name}"


if __name__ == "__main__":  # python -m gpt.apps.train, as `tinygpt train`
    main()
