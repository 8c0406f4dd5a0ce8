"""Train a model: `tinygpt train [key=value ...]` (or `python train.py ...` in a checkout), a
sweep with `-m` (`tinygpt train -m optim.lr=1e-3,3e-4`). `--cfg job` prints the composed
config, `--help` Hydra's help. The settings and their defaults: gpt/config/__init__.py (RunConfig).
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
    from gpt.runtime import preemption

    if common.world_size() > 1:  # a signal to one rank must not end it alone, even now
        preemption.defer_until_the_run_listens()
    argv = sys.argv[1:] if argv is None else list(argv)
    multirun = any(a in ("-m", "--multirun") for a in argv)
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    own = [a for a in overrides if not a.startswith(("hydra.", "hydra/", "+hydra", "~hydra"))]
    if not any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        common.guard(lambda: common.refuse_bare_words(argv, _COMMAND))
        common.guard(lambda: _refuse_files(overrides))
        # Check everything before Hydra creates a run directory or rewrites an earlier run's
        # record; for a sweep, every value of its comma lists.
        if multirun:
            common.guard(lambda: common.check_sweep("config", own, _COMMAND, then=lambda s, here: preflight(s, here=here)))
        else:
            pinned = common.guard(lambda: claim_run_dir(overrides, own))
            argv = [a for a in argv if not (pinned and a.startswith("hydra.run.dir="))] + pinned
    _hydra_main([*argv, *quiet_non_zero_ranks()])


def claim_run_dir(overrides: list[str], own: list[str]) -> list[str]:
    """A single run, before Hydra writes anything: its directory resolved (a `${now:...}` or
    `${optim.lr}` in hydra.run.dir too) and locked first, in one atomic step, so that of two starts
    into one directory exactly one goes on and nothing of the other's run is read or moved
    meanwhile; then every check (`preflight`), and the earlier run's record kept aside. Returns
    the override that pins Hydra to the directory resolved."""
    from gpt.runtime import runlock

    if common.rank() != 0:  # rank 0 owns the run directory (quiet_non_zero_ranks)
        preflight(common.compose("config", own, _COMMAND))
        return []
    cfg = common.compose_raw("config", overrides, _COMMAND, hydra=True)  # once: the run directory and the settings
    run_dir, pinned = _resolve_run_dir(cfg)
    created = not run_dir.exists()
    lock = runlock.RunLock(run_dir, log=lambda m: print(m, file=sys.stderr))
    lock.acquire()
    try:
        point = preflight(_settings_without_hydra(cfg), run_dir)
        _examined[run_dir.resolve()] = point
        _keep_earlier_record(run_dir, point)
    except BaseException:
        lock.release()
        if created and run_dir.is_dir() and not any(run_dir.iterdir()):  # a refused start leaves no empty run
            run_dir.rmdir()
        raise
    atexit.register(lock.release)  # held until this process ends (the trainer finds it its own)
    return pinned


def _settings_without_hydra(cfg):
    from omegaconf import open_dict

    with open_dict(cfg):
        del cfg["hydra"]
    return common.settings_of(cfg)


def _resolve_run_dir(cfg) -> tuple[Path, list[str]]:
    """The run directory Hydra would make (from `cfg`, composed with Hydra's own settings), and
    the override that pins it: resolved once here, as a `${now:...}` resolved twice would name
    two directories."""
    from omegaconf import OmegaConf

    # Always from the composition, never the override's text: Hydra has parsed its quoting
    # ('/x/my runs') and resolved its interpolations; and always pinned, expanded and absolute,
    # so that Hydra writes where the lock was taken (it would not expand a quoted ~ itself).
    try:
        resolved = str(OmegaConf.select(cfg, "hydra.run.dir"))
    except Exception as e:  # an interpolation only Hydra's own run can resolve (${hydra:...})
        given = OmegaConf.select(cfg, "hydra.run.dir", throw_on_resolution_failure=False)
        raise TinyGPTError(f"hydra.run.dir={given!r} cannot be resolved before the run ({e}); name a folder") from None
    if "${" in resolved:
        raise TinyGPTError(f"hydra.run.dir resolves to {resolved!r}, which names no folder; name one")
    run_dir = Path(resolved).expanduser().absolute()
    return run_dir, [f"hydra.run.dir={override_value(str(run_dir))}"]


def override_value(text: str) -> str:
    """`text` quoted as a Hydra override value (single quotes; a quote, and backslashes before a
    quote or at the end, escaped), so any path reads back as itself."""
    import re

    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"


# Resume points the command line found, by run directory: the run's set-up takes them as found.
_examined: dict[Path, object] = {}


def preflight(settings: RunConfig, run_dir: Path | None = None, here: bool = True):
    """The checks that need no data (model shape, data source and root, what the run resumes
    from, runtime; the others ran when the settings were built). `run_dir`: the directory the
    run trains into, which may hold a run to resume; returns where it resumes from
    (gpt.checkpoints.loading.ResumePoint), examined once. `here`: whether it runs on this machine (a SLURM job
    finds its node's devices itself)."""
    from gpt.checkpoints import loading
    from gpt.data import sources
    from gpt.evals import tasks
    from gpt.model import registry
    from gpt.runtime import devices

    registry.config_from_settings(settings.model, vocab_size=1)
    tasks.check_names(settings.train.eval_tasks)
    sources.check(settings.data.source)
    _check_data_root(settings.paths.data_root())
    point = _resume_point(settings, run_dir)
    if point is not None and point.checkpoint is not None:
        _check_tokenizer_kind(point.checkpoint, settings)
    if settings.init_from:
        loading.check(settings.init_from)
    if here:
        device, _ = devices.pick_device(settings.device)
        devices.pick_dtype(device, settings.dtype)
        devices.pick_compile(device, settings.compile)
    return point


def _check_data_root(root: Path) -> None:
    """A data root that is a file (or under one) cannot hold prepared data."""
    for folder in (root, *root.parents):
        if folder.exists():
            if not folder.is_dir():
                raise TinyGPTError(f"paths.data_dir={root}: {folder} is a file; name a folder for prepared data")
            return


def _resume_point(settings: RunConfig, run_dir: Path | None):
    """Where the run continues from (checked as set-up will use it: loads, holds the training
    state, weights fit). Without a run directory (a sweep's job, a rank other than 0), only a
    resume= checkpoint given by path is checked."""
    from gpt.checkpoints import checkpoint, loading

    if run_dir is not None or isinstance(checkpoint.parse_resume(settings.resume), Path):
        return loading.resume_point(settings.resume, run_dir)
    return None


def _check_tokenizer_kind(resumed, settings: RunConfig) -> None:
    """A run resumes on data of its own tokenizer. The kind and, for a fixed vocabulary, the whole
    identity are known now; a char vocabulary or a BPE is fitted to its corpus, compared once the
    data is prepared (gpt.training.setup)."""
    from dataclasses import asdict

    from gpt.tokenizers import difference, normalize_spec, tokenizer_identity

    theirs, ours = tokenizer_identity(resumed.tokenizer), tokenizer_identity(normalize_spec(asdict(settings.data.tokenizer)))
    if "vocab_size" not in ours:  # known once the ranks file is read
        theirs.pop("vocab_size", None)
    # char and bpe are fitted to the corpus and hf read from its file: compared once the data is prepared
    if theirs["kind"] != ours["kind"] or (ours["kind"] not in ("char", "bpe", "hf") and theirs != ours):
        raise TinyGPTError(
            f"the checkpoint's tokenizer differs from data={settings.data.name}'s ({difference(resumed.tokenizer, ours)}); "
            f"resume with the data the run was trained on (data={resumed.config.get('data', {}).get('name', '?')})"
        )


def _refuse_files(overrides: list[str]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for arg in overrides:
        key = arg.split("=", 1)[0]
        if key not in ("hydra.run.dir", "hydra.sweep.dir"):
            continue
        try:
            value = OverridesParser.create().parse_override(arg).value()  # its quoting as Hydra reads it
        except Exception:  # unreadable: composing says so in one line
            continue
        path = Path(str(value)).expanduser()
        if isinstance(value, str) and path.exists() and not path.is_dir():
            raise TinyGPTError(f"{key}={value} is a file; name a directory (new, or a run's own to resume it)")


def _keep_earlier_record(run_dir: Path, point) -> None:
    """Training into a directory that holds a run resumes it (or was refused by now): Hydra would
    overwrite that run's .hydra/ record before any of our code runs, so it is kept as .hydra-<n>/."""
    from gpt.checkpoints import checkpoint

    record = run_dir / ".hydra"
    if not checkpoint.has_run(run_dir) or not record.is_dir():
        return
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

    from gpt.runtime import distributed
    from gpt.runtime.preemption import Preempted
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
            point = _examined.pop(Path(settings.paths.output_dir).resolve(), None)  # found by claim_run_dir
            summary = train(settings, overrides=overrides, resume_point=point)
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
        if summary.get("chat"):  # finetuned on conversations: a chat model
            say(f"chat with: tinygpt chat run_dir={settings.paths.output_dir}")
        else:
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
        from gpt.runtime import devices

        devices.free_memory()
        if str(hydra_cfg.sweeper.get("_target_", "")).endswith("basic_sweeper.BasicSweeper"):
            return float("nan")
        raise JobFailed(f"job {hydra_cfg.job.num} ({' '.join(overrides)}) failed: {reason}")

    return common.guard(sweep_job if multirun else run)


def _unexpected(error: Exception, job_dir: Path) -> str:
    """One line for a job's unexpected error; its traceback goes to <job>/traceback.txt."""
    import traceback

    from gpt.runtime import io

    try:
        io.write_bytes(job_dir / "traceback.txt", "".join(traceback.format_exception(error)).encode())
        where = f"; traceback in {job_dir / 'traceback.txt'}"
    except OSError:
        where = ""
    return one_line(error) + where


def after_stop(run_dir: Path, launcher: str) -> str:
    """What to do after a signal stopped the run: resume it, or (stopped during set-up, before its
    first checkpoint) start it again."""
    from gpt.checkpoints import checkpoint

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
