"""Train a model: `tinygpt train [key=value ...]` (or `python train.py ...` in a checkout), a
sweep with `-m` (`tinygpt train -m optim.lr=1e-3,3e-4`). `--cfg job` prints the composed
config, `--help` Hydra's help. The settings and their defaults: gpt/config/run.py (RunConfig).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hydra.experimental.callback import Callback

from gpt.apps import common
from gpt.apps.common import JobFailed
from gpt.checkpoints import runs
from gpt.config.overrides import override_value
from gpt.errors import RunRefused, TinyGPTError, one_line

_COMMAND = "tinygpt train"


def main(argv: list[str] | None = None) -> None:
    from gpt.runtime import preemption

    argv = _multirun_first(sys.argv[1:] if argv is None else list(argv))
    start = None
    multirun = argv[:1] in (["-m"], ["--multirun"])
    if common.world_size() > 1:  # a signal to one rank must not end it alone, even now
        preemption.defer_until_the_run_listens()
        if not multirun:  # (a sweep's driver, inside an allocation, meets no one: its jobs meet in train())
            common.guard(_meet)  # before rank 0 alone claims the run directory: its failure there reaches the others too
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    own = [a for a in overrides if not a.startswith(("hydra.", "hydra/", "+hydra", "~hydra"))]
    if not any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        common.guard(lambda: common.refuse_bare_words(argv, _COMMAND))
        common.guard(lambda: _refuse_files(overrides))
        # Check everything before Hydra creates a run directory or rewrites an earlier run's
        # record; for a sweep, every value of its comma lists.
        if multirun:
            from gpt.apps import jobs  # (a sweep's helpers: a single run never reads them)
            from gpt.training.claim import preflight

            common.guard(lambda: jobs.check_sweep("config", own, _COMMAND, then=lambda s, here: preflight(s, here=here)))
        else:
            common.guard(lambda: _refuse_a_search_without_multirun(own))
            start = common.guard(lambda: claim_run_dir(overrides))
            argv = [a for a in argv if not (start.pinned and a.startswith("hydra.run.dir="))] + start.pinned
    _hydra_main([*argv, *quiet_non_zero_ranks(multirun)], start)


# Hydra's options that take a value: a -m right after one of them is that value, not the flag.
_VALUED = ("-c", "--cfg", "-p", "--package", "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir")


def _multirun_first(argv: list[str]) -> list[str]:
    """-m (--multirun) moved before the overrides, where Hydra's argparse takes it: after one
    (`tinygpt train debug=tiny -m model.n_layer=1,2`) argparse ends the overrides there and
    refuses the rest with its usage text. It takes no value and no override starts with '-', so
    the sweep meant is unambiguous."""
    flags = [i for i, a in enumerate(argv) if a in ("-m", "--multirun") and (i == 0 or argv[i - 1] not in _VALUED)]
    return [argv[i] for i in flags[:1]] + [a for i, a in enumerate(argv) if i not in flags]


def _refuse_a_search_without_multirun(overrides: list[str]) -> None:
    """hparams_search=<search> picks a sweeper, which only a multirun uses: without -m it would be
    one plain run of the search's settings, unsaid."""
    search = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("hparams_search=")), None)
    if search not in (None, "", "null"):
        raise TinyGPTError(f"hparams_search={search} is a search, which runs with -m: {_COMMAND} -m hparams_search={search} ...")


def _meet() -> None:
    from gpt.runtime import distributed

    distributed.meet(distributed.from_env())


@dataclass
class Start:
    """What the command found before Hydra wrote anything, handed to the run it starts: the
    override that pins Hydra to the run directory, the directory's claim (gpt.training.claim:
    lock held, resume point examined), and the earlier run's records kept aside from Hydra's."""

    pinned: list[str] = field(default_factory=list)
    claim: object = None  # gpt.training.Claim; None on ranks other than 0
    kept: list[tuple[Path, Path]] = field(default_factory=list)  # (where an earlier .hydra/ went, where it was)


def claim_run_dir(overrides: list[str]) -> Start:
    """A single run, before Hydra writes anything: its directory resolved (a `${now:...}` or
    `${optim.lr}` in hydra.run.dir too) and claimed (locked, every check run, where it resumes from
    examined: gpt.training.claim.claim), so that of two starts into one directory exactly one goes
    on and nothing of the other's run is read or moved meanwhile; then the earlier run's record
    kept aside. Its `pinned` override pins Hydra to the directory resolved."""
    from gpt.training.claim import claim

    if common.rank() != 0:  # rank 0 owns the run directory (quiet_non_zero_ranks); the run checks the rest
        return Start()
    cfg = common.compose_raw("config", overrides, _COMMAND, hydra=True)  # once: the run directory and the settings
    run_dir, pinned = _resolve_run_dir(cfg)
    claimed = claim(_settings_without_hydra(cfg), run_dir, log=lambda m: print(m, file=sys.stderr))
    atexit.register(claimed.release)  # in case Hydra fails before the run takes it over (then the run releases it)
    try:
        kept = _keep_earlier_record(run_dir)
    except BaseException:
        claimed.release()
        raise
    return Start(pinned, claimed, kept)


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


def _keep_earlier_record(run_dir: Path) -> list[tuple[Path, Path]]:
    """Training into a directory that holds a run resumes it (or was refused by now): Hydra would
    overwrite that run's .hydra/ record before any of our code runs, so it is kept as .hydra-<n>/.
    Returns where it went, to be put back if the run is refused."""
    from gpt.checkpoints import runs

    record = run_dir / ".hydra"
    if not runs.has_run(run_dir) or not record.is_dir():
        return []
    n = 1
    while (run_dir / f".hydra-{n}").exists():
        n += 1
    record.rename(run_dir / f".hydra-{n}")
    return [(run_dir / f".hydra-{n}", record)]


def _put_back_earlier_record(kept: list[tuple[Path, Path]]) -> None:
    """A run refused during set-up changed nothing: the earlier run's record goes back in place of
    this attempt's (its error stays in train.log)."""
    import shutil

    for aside, record in reversed(kept):
        if aside.is_dir():
            shutil.rmtree(record, ignore_errors=True)
            aside.rename(record)


def quiet_non_zero_ranks(multirun: bool = False) -> list[str]:
    """Under torchrun every rank runs the Hydra app; only rank 0 may create the run directory
    and its logs (the trainer hands rank 0's directory to the others). In a sweep every rank's
    launcher makes a sweep folder (each rank's own `${now:...}`) and a folder per job: the other
    ranks' go to a scratch folder, removed when the process exits, and only rank 0 writes the
    leaderboard (LeaderboardCallback, below)."""
    if common.rank() == 0:
        return []
    quiet = ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    if multirun:
        scratch = tempfile.mkdtemp(prefix=f"tinygpt-sweep-rank{common.rank()}-")
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        quiet.append(f"hydra.sweep.dir={override_value(scratch)}")
    return quiet


def _hydra_main(argv: list[str], start: Start | None = None) -> None:
    import hydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    common.register_schemas("config")
    sys.argv = [sys.argv[0], *argv]
    # Hydra prints an error it catches as a trimmed traceback; unless the user asked for its
    # full ones (HYDRA_FULL_ERROR), let errors reach us and say them in one line. A bug keeps
    # its traceback either way.
    ours = "HYDRA_FULL_ERROR" not in os.environ
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        # A single run's task gets what the command found (a closure: no module state in between);
        # a multirun's is the module's function, which launchers may pickle and run elsewhere.
        task = _task if start is None else (lambda cfg: _task(cfg, start))
        hydra.main(version_base="1.3", config_path=str(common.config_dir()), config_name="config")(task)()
    except (HydraException, OmegaConfBaseException) as e:
        if not ours:
            raise
        common.fail(str(e) if isinstance(e, JobFailed) else common.explain(e, _COMMAND))
    except TinyGPTError as e:  # raised by a sweeper between jobs (our search space)
        if not ours:
            raise
        common.fail(str(e))
    except RuntimeError as e:  # submitit, asked to submit where there is no SLURM
        if not ours or 'Could not detect "srun"' not in str(e):
            raise
        common.fail("hydra/launcher=slurm submits the jobs to SLURM and finds no srun here: run it on the cluster (a login node)")
    except ValueError as e:  # Optuna's study, when not one trial completed; Hydra's, for -m with --cfg
        if ours and "Only one of --run, --multirun" in str(e):
            common.fail(f"{e}: -m runs a sweep, --cfg and --info print settings without running")
        if not ours or "No trials are completed" not in str(e):
            raise
        common.fail("no trial of the search completed: each one's reason is in its summary.json and the sweep's leaderboard.md")


def _task(cfg, start: Start | None = None) -> float:
    """One training job (a multirun calls it once per job); returns what sweepers minimise.
    `start`: what the command found for a single run (claim_run_dir)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from gpt.runtime import distributed
    from gpt.runtime.preemption import Preempted
    from gpt.tracking import logger
    from gpt.tracking.records import record_failure
    from gpt.training import train  # imported here so that `--help` and config errors stay fast

    hydra_cfg = HydraConfig.get()
    overrides, output_dir = list(hydra_cfg.overrides.task), hydra_cfg.runtime.output_dir
    dist = distributed.from_env()
    say = logger.info if dist.is_main else (lambda *a: None)

    multirun = hydra_cfg.mode == RunMode.MULTIRUN

    def run() -> float:
        settings = common.settings_of(cfg)
        settings.paths.output_dir = settings.paths.output_dir or output_dir
        claimed = start.claim if start is not None else None
        if claimed is not None and claimed.run_dir != Path(settings.paths.output_dir).expanduser().absolute():
            claimed.release()  # Hydra trains elsewhere than the command found (never, as it is pinned)
            claimed = None
        try:
            summary = train(settings, overrides=overrides, claimed=claimed)
        except RunRefused:
            _put_back_earlier_record(start.kept if start is not None else [])
            raise
        except Preempted:
            launcher = "torchrun <its options> train.py" if dist.enabled or dist.launched else _command("train")
            say(after_stop(Path(settings.paths.output_dir), launcher))
            if multirun and dist.is_main:  # the sweep stops here: its leaderboard shows this job too
                from gpt.apps import sweep

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
        traceback.txt) and the sweep goes on: Hydra's basic sweeper would stop at a raised
        error, so it gets a JobFailure, a NaN that carries the reason to the sweep's end
        (LeaderboardCallback, below); a sweeper that draws trials (Optuna)
        gets JobFailed, a failed trial. Under torchrun the job stops as a single run does: the
        other ranks must not wait in a job that rank 0 has left."""
        from gpt.apps import jobs

        try:
            jobs.refuse_another_sweeps_run(Path(output_dir), hydra_cfg.job.num, overrides)
            return run()
        except Exception as e:
            if dist.enabled or isinstance(e, Preempted):  # a stop request stops the sweep, to be rerun
                raise
            reason = str(e) if isinstance(e, TinyGPTError) else _unexpected(e, Path(output_dir))
            if not isinstance(e, jobs.OtherSweepsRun):  # that folder's run and its record stay as they were
                record_failure(Path(output_dir), reason, replaces=one_line(e), overrides=overrides)
            logger.error(f"error: {reason}")  # the sweep's end reads it back from the job's summary.json
        # Out of the except block, the error and the frames it holds (the failed job's model and
        # optimizer) are gone: free them before the next job, which a sweeper may start while it
        # still holds the failure raised below.
        from gpt.runtime import devices

        devices.free_memory()
        if str(hydra_cfg.sweeper.get("_target_", "")).endswith("basic_sweeper.BasicSweeper"):
            return JobFailure(reason)  # NaN to the sweeper; the reason to the sweep's end
        failed = JobFailed(f"job {hydra_cfg.job.num} ({' '.join(overrides)}) failed: {reason}")
        failed.reason = reason  # what the sweep's end says after the job's number (LeaderboardCallback, below)
        raise failed

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

    if runs.latest(run_dir) is None:
        return (
            f"stopped before the run saved a checkpoint: nothing to resume; start it again with {launcher} <the same overrides>"
        )
    return f"resume with: {launcher} <the same overrides> hydra.run.dir={run_dir}"


def _command(name: str) -> str:
    """How the user runs command `name`: as a checkout's script if that is how training started."""
    return f"python {name}.py" if Path(sys.argv[0]).name == "train.py" else f"tinygpt {name}"


# --- the multirun's Hydra callbacks (configs/hydra/default.yaml) --------------------------------
# Hydra makes them for a single run too: what they need is imported when a multirun calls them.


class JobFailure(float):
    """What a failed job of a sweep whose sweeper must go on (Hydra's basic one) returns: NaN to
    the sweeper, and why it failed to the sweep's end (LeaderboardCallback), in the job's own
    return value."""

    reason: str

    def __new__(cls, reason: str) -> JobFailure:
        failure = super().__new__(cls, "nan")
        failure.reason = reason
        return failure


class LeaderboardCallback(Callback):
    """Keeps a multirun's leaderboard current: rewritten as each job ends (an interrupted or
    killed sweep still has one), and at the end a line on the best run and on the jobs of this
    sweep that failed (then the exit status is 1). How each job ended is what Hydra hands over as
    it ends: a JobFailure it returned, or its failure (a sweeper's failed trial, a bug); not read
    back from folders, which an earlier invocation may have left."""

    def __init__(self) -> None:
        self.failed: dict[int, str] = {}  # by job number, the jobs of this multirun that ran in this process
        self.ended: set[int] = set()

    def on_multirun_start(self, config, **kwargs) -> None:
        self.failed.clear()
        self.ended.clear()

    def on_job_end(self, config, job_return=None, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode != RunMode.MULTIRUN or common.rank() != 0:
            return
        num = hydra_cfg.job.num
        self.ended.add(num)
        if job_return is not None and job_return.status == JobStatus.FAILED:  # JobFailed, or a bug
            failure = job_return._return_value  # JobFailed says its job; its reason, without it
            self.failed.setdefault(num, getattr(failure, "reason", None) or str(failure).splitlines()[0])
        elif job_return is not None and isinstance(job_return.return_value, JobFailure):
            self.failed.setdefault(num, job_return.return_value.reason)
        from gpt.tracking import logger
        from gpt.tracking.leaderboard import write_leaderboard

        try:
            write_leaderboard(hydra_cfg.sweep.dir)
        except Exception as e:  # a plot or a full disk must not end the sweep
            logger.warning(f"could not write the leaderboard: {e}")

    def on_multirun_end(self, config, **kwargs) -> None:
        if common.rank() != 0:  # under torchrun the other ranks' sweep folders are scratch (train.quiet_non_zero_ranks)
            return
        from gpt.tracking.leaderboard import run_order, write_leaderboard

        sweep_dir = Path(config.hydra.sweep.dir)
        rows = write_leaderboard(sweep_dir)
        best = next((r for r in rows if r["status"] == "finished" and r["best_val_loss"] is not None), None)
        if best is not None:
            print(
                f"leaderboard: {sweep_dir / 'leaderboard.md'} (best: run {best['run']}, val {best['best_val_loss']:.4f}, {best['overrides']})"
            )
        failed, ended = dict(self.failed), self.ended | set(self.failed)
        if not ended:  # the jobs ran in other processes (SLURM, submitit): their summaries say how they ended
            failed = {r["run"]: r["error"] or "no reason recorded" for r in rows if r["status"] == "failed"}
            ended = {r["run"] for r in rows}
        if failed:
            first = min(failed, key=lambda num: run_order(str(num)))
            print(
                f"error: {len(failed)} of {len(ended)} jobs failed (first: job {first}: {failed[first]}); see {sweep_dir / 'leaderboard.md'}",
                file=sys.stderr,
            )
            sys.exit(1)


class EarlierRecords(Callback):
    """At a sweep's start (configs/hydra/default.yaml), a copy of the .hydra/ record of each run
    already in the sweep folder, as .hydra-<n>/ beside it: Hydra rewrites a job's record before
    the job runs, so this is the last moment the earlier run's is there. A refused job puts its
    copy back (refuse_another_sweeps_run); a job that resumes its run keeps it, as a single run
    resumed in place keeps its earlier record; at the sweep's end a copy equal to its record (a
    job this sweep did not run, or ran with the same record) goes."""

    def __init__(self) -> None:
        self.kept: list[tuple[Path, Path]] = []  # (copy, record)

    def on_multirun_start(self, config, **kwargs) -> None:
        if common.rank() != 0:  # the other ranks' sweep folders are scratch (train.quiet_non_zero_ranks)
            return
        from gpt.apps.jobs import _copy_aside
        from gpt.checkpoints import runs

        sweep_dir = Path(str(config.hydra.sweep.dir))
        records = sorted(sweep_dir.rglob(".hydra")) if sweep_dir.is_dir() else []
        self.kept = [(_copy_aside(r), r) for r in records if r.is_dir() and runs.has_run(r.parent)]

    def on_multirun_end(self, config, **kwargs) -> None:  # (before the leaderboard's: callbacks end in reverse)
        from gpt.apps.jobs import _same_files

        for copy, record in self.kept:
            if copy.is_dir() and record.is_dir() and _same_files(copy, record):
                shutil.rmtree(copy, ignore_errors=True)
        self.kept = []


if __name__ == "__main__":  # python -m gpt.apps.train, as `tinygpt train`
    main()
