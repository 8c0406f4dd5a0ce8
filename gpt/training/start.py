"""Before a run touches anything: every check that needs no data (`preflight`), and a run
directory taken for one run (`claim`): its lock held, where the run continues from examined.
Decided once, here, and handed down as values: the command line claims the run directory before
Hydra writes into it and passes the claim to `gpt.training.train`; a run started from Python (or
a sweep's job) is claimed by `train` itself."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from gpt.checkpoints.resume import ResumePoint, parse_resume, resume_point
from gpt.config import RunConfig
from gpt.config.overrides import model_settings_given
from gpt.errors import RunRefused, TinyGPTError
from gpt.runtime.runlock import RunLock


def preflight(settings: RunConfig, run_dir: Path | None = None, here: bool = True) -> ResumePoint | None:
    """The checks that need no data: the eval tasks' names, the data source and root, what the
    run resumes from, what it starts from, the runtime (the model's shape was checked when the
    settings were built). `run_dir`: the directory the run trains into, which may hold a run to
    resume; returns where it resumes from, examined once (None without a run directory and no
    resume= path). `here`: whether the run starts on this machine (a SLURM job finds its node's
    devices itself)."""
    from gpt.checkpoints import loading
    from gpt.data import sources
    from gpt.evals import tasks
    from gpt.runtime import devices

    tasks.check_names(settings.train.eval_tasks)
    sources.check(settings.data.source)
    _check_data_root(settings.paths.data_root())
    point = None
    if run_dir is not None or isinstance(parse_resume(settings.resume), Path):
        point = resume_point(settings.resume, run_dir)
    if point is not None and point.checkpoint is not None:
        _check_same_run(point.checkpoint, point.source, settings)
    finetune = point is not None and point.checkpoint is not None and (point.checkpoint.config or {}).get("init_from")
    if point is not None and point.checkpoint is not None and not (settings.init_from or finetune):
        # (a finetune's data takes its model's tokenizer, whatever data.tokenizer says: compared
        # with the checkpoint's once the data is prepared, gpt.training.setup)
        _check_tokenizer_kind(point.checkpoint, point.source, settings)
    if settings.init_from:
        loading.check(settings.init_from)
    dtype = None
    if here:
        device, _ = devices.pick_device(settings.device)
        dtype, _ = devices.pick_dtype(device, settings.dtype, training=True)
        devices.pick_compile(device, settings.compile)
    if settings.distributed == "fsdp":
        _check_fsdp(settings, dtype)
    return point


def _check_fsdp(settings: RunConfig, dtype) -> None:
    """What distributed=fsdp does not cover (yet): recurrent models (nothing to shard by block)
    and fp16 loss scaling."""
    import torch

    from gpt.config import MuonSettings
    from gpt.config.model import RNNConfig

    if isinstance(settings.model, RNNConfig):
        raise TinyGPTError(
            f"distributed=fsdp shards a GPT block by block; model.arch={settings.model.arch} is recurrent: use distributed=ddp"
        )
    if dtype == torch.float16:
        raise TinyGPTError("distributed=fsdp trains in bfloat16 or float32, not float16; pass dtype=bfloat16 or dtype=float32")
    if settings.cpu_offload and isinstance(settings.optim, MuonSettings):
        raise TinyGPTError(
            "cpu_offload=true steps the optimizer in host memory, where Muon's Newton-Schulz would run on the CPU "
            "(minutes a step at 1B parameters); use optim=adamw"
        )


@dataclass
class Claim:
    """A run directory taken for one run: its lock, held until `release`, and where the run
    continues from."""

    run_dir: Path
    point: ResumePoint | None
    lock: RunLock

    def release(self) -> None:
        self.lock.release()


def claim(settings: RunConfig, run_dir: Path, log=None) -> Claim:
    """Lock `run_dir` (one writer per run directory: of two starts into one directory exactly one
    goes on, and nothing of the other's run is read or moved meanwhile), then `preflight`. A
    refused start releases the lock and leaves no empty directory it made. The lock's refusal is
    a RunRefused (the directory is another process's: nothing of it may be touched)."""
    run_dir = Path(run_dir).expanduser().absolute()
    outermost = next((f for f in (run_dir, *run_dir.parents) if not f.exists() and f.parent.exists()), None)  # made here
    lock = RunLock(run_dir, log=log or (lambda m: print(m, file=sys.stderr)))
    try:
        lock.acquire()
    except RunRefused:
        raise
    except TinyGPTError as e:
        raise RunRefused(str(e)) from None
    try:
        return Claim(run_dir, preflight(settings, run_dir), lock)
    except BaseException:
        lock.release()
        _remove_empty(run_dir, outermost)
        raise


def _remove_empty(folder: Path, outermost: Path | None) -> None:
    """The folders a refused start made (the run directory and, on a first run, outputs/runs/
    above it), up to `outermost`, each only if it is empty."""
    while outermost is not None and folder.is_relative_to(outermost) and folder.is_dir() and not any(folder.iterdir()):
        try:
            folder.rmdir()
        except OSError:  # another start, at the same moment, made or removed it: it is that one's now
            return
        folder = folder.parent


def _check_data_root(root: Path) -> None:
    """A data root that is a file (or under one) cannot hold prepared data."""
    for folder in (root, *root.parents):
        if folder.exists():
            if not folder.is_dir():
                raise TinyGPTError(f"paths.data_dir={root}: {folder} is a file; name a folder for prepared data")
            return


def _check_same_run(resumed, source: Path, settings: RunConfig) -> None:
    """A run resumes on the data it trained on and with the optimizer it trained with (where the
    loader stands, and the optimizer's state, belong to them). A resumed run's settings are
    composed from the defaults and the command line, as any run's, so a resume that repeats
    neither would go on with the defaults' (the quickstart's data, Muon) and a "changed:" notice;
    refused instead, with what the run's last start passed."""
    recorded = resumed.config or {}
    data, optim = (recorded.get("data") or {}).get("name"), (recorded.get("optim") or {}).get("name")
    wrong = []
    if data and data != settings.data.name:
        wrong.append(f"data.name={data} (this command's: {settings.data.name})")
    if optim and optim != settings.optim.name:
        wrong.append(f"optim={optim} (this command's: optim={settings.optim.name})")
    if wrong:
        raise TinyGPTError(
            f"{source} was trained with {' and '.join(wrong)}; a run resumes with its own data and optimizer: "
            f"{started_with(source)}"
        )


def started_with(source: Path) -> str:
    """How to pass a run's data and optimizer again: what its last start's command line set of
    them (Hydra's record, <run>/.hydra/overrides.yaml), where there is one."""
    ours = recorded_overrides(source, ("data", "optim", "experiment"))
    if not ours:
        return "pass the data and optimizer settings it was started with again"
    return "pass again what its last start passed of them: " + " ".join(ours)


def recorded_overrides(source: Path, groups: tuple[str, ...]) -> list[str]:
    """What the last start of the run a checkpoint belongs to passed on its command line of the
    settings `groups`; [] without a record."""
    # a step checkpoint sits in <run>/checkpoints/; one elsewhere has no run record to read
    source = Path(source)
    given = hydra_overrides(source.parent.parent) if source.parent.name == "checkpoints" else None
    return [o for o in given or [] if o.lstrip("+~").split("=")[0].split(".")[0].split("/")[0] in groups]


def hydra_overrides(run_dir: Path) -> list[str] | None:
    """The command line of a run's last start: Hydra's record, <run>/.hydra/overrides.yaml (None
    without one: a run built in Python, or a folder that is no run)."""
    import yaml  # omegaconf's own dependency

    try:
        return [str(o) for o in yaml.safe_load((Path(run_dir) / ".hydra" / "overrides.yaml").read_text()) or []]
    except (OSError, yaml.YAMLError, TypeError):
        return None


def model_settings_at(run_dir: Path) -> set[str] | None:
    """The model settings a run's last start gave on its command line (Hydra's record, written
    into the run directory before the run is built); None for a run built in Python, whose
    settings object is all it was given."""
    given = hydra_overrides(run_dir)
    return model_settings_given(given) if given is not None else None


def _check_tokenizer_kind(resumed, source: Path, settings: RunConfig) -> None:
    """A run resumes on data of its own tokenizer. The kind and, for a fixed vocabulary, the whole
    identity are known now; a char vocabulary or a BPE is fitted to its corpus, compared once the
    data is prepared (gpt.training.setup)."""
    from gpt.tokenizers import difference, normalize_spec, tokenizer_identity

    theirs, ours = tokenizer_identity(resumed.tokenizer), tokenizer_identity(normalize_spec(asdict(settings.data.tokenizer)))
    if ours.get("vocab_size") is None:  # known once the ranks file is read (the settings say None)
        theirs.pop("vocab_size", None)
        ours.pop("vocab_size", None)
    # char and bpe are fitted to the corpus and hf read from its file: compared once the data is prepared
    if theirs["kind"] != ours["kind"] or (ours["kind"] not in ("char", "bpe", "hf") and theirs != ours):
        raise TinyGPTError(
            f"the checkpoint's tokenizer differs from data={settings.data.name}'s ({difference(resumed.tokenizer, ours)}); "
            f"a run resumes with its own data and optimizer: {started_with(source)}"
        )
