"""gpt/apps/common.py: composing configs into settings, and every user mistake across the
commands ending in one line (`error: ...`, exit status 2) with nothing written or damaged.
Run: pytest tests/apps/test_common.py"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from gpt.apps import common
from gpt.checkpoints import runs
from gpt.errors import TinyGPTError
from helpers import assert_one_line_error, run_script


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.lr=fast"], "optim.lr must be a number, got 'fast'"),
        (["seed=abc"], "seed must be an integer, got 'abc'"),
        (
            ["train.max_iter=20"],
            "unknown setting 'train.max_iter' (did you mean train.max_iters?); list the valid keys with `tinygpt train --cfg job`",
        ),
        (["trian.max_iters=20"], "unknown setting 'trian' (did you mean train?); list the valid keys"),
        (["model=gru", "model.n_hiden=8"], "unknown setting 'model.n_hiden' (did you mean model.n_hidden?)"),
        (["finetune.lora=true"], "unknown setting 'finetune.lora' (did you mean finetune.lora_rank?)"),
        (["train.zzz=1"], "unknown setting 'train.zzz'; list the valid keys"),  # nothing near: no guess
        (["experiment=shakespeare_char", "optim.muon_lr=0.05"], "optim.muon_lr is a Muon setting and this run uses optim=adamw"),
        (["model=gtp2"], "unknown model config 'gtp2'; choose one of: baby-gpt, gpt-micro"),
        (["optim.weight_decay=-1"], "optim.weight_decay >= 0"),
        (["finetune.lora_dropout=1.5"], "finetune.lora_dropout must be in [0, 1)"),
        (["data.num_proc=abc"], "data.num_proc must be an integer or null, got 'abc'"),
        (["data.max_tokens=-5"], "data.max_tokens must be a positive integer"),
        (["train.batch_size=0"], "train.batch_size must be a positive integer"),
        (["model=lstm", "model.n_head=4"], "model.n_head is a GPT setting; model=lstm has none"),
    ],
)
def test_compose_refuses_mistakes_in_one_line(overrides, message):
    with pytest.raises(TinyGPTError) as e:
        common.compose("config", overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_compose_builds_the_typed_settings():
    from gpt.config import AdamWSettings, GPTConfig, MuonSettings, RNNConfig

    settings = common.compose("config", ["optim=adamw", "model=lstm", "train.max_iters=7"])
    assert type(settings.optim) is AdamWSettings and type(settings.model) is RNNConfig
    assert settings.train.max_iters == 7 and settings.model.arch == "lstm"
    default = common.compose("config", [])
    assert type(default.optim) is MuonSettings and type(default.model) is GPTConfig and default.paths.output_dir is None


def test_explain_follows_the_chain_hydra_leaves():
    """Hydra raises its composition error *during* handling of OmegaConf's (the key is in
    __context__, not __cause__)."""
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf

    from gpt.config import RNNConfig

    try:
        try:
            OmegaConf.merge(OmegaConf.structured(RNNConfig), {"n_head": 2})
        except Exception:
            raise ConfigCompositionException("In 'debug/x': ConfigKeyError raised while composing config:")  # noqa: B904
    except ConfigCompositionException as e:
        assert common.explain(e) == "unknown setting 'n_head'; list the valid keys with `tinygpt train --cfg job`"


def test_paths_are_taken_verbatim(trained_run, data_root, tmp_path):
    """Sweep job folders are named like `lr=1e-3,bs=4`; Hydra's grammar would reject such a value."""
    import shutil

    cwd, run_dir, _ = trained_run
    root, _ = data_root
    odd = tmp_path / "lr=1e-3,bs=4" / "run"
    shutil.copytree(run_dir, odd)
    proc = run_script("eval", [f"run_dir={odd}", "max_tokens=64"], tmp_path, root)
    assert proc.returncode == 0 and str(odd) in proc.stdout, proc.stderr
    proc = run_script("sample.py", [f"ckpt={odd}/checkpoints/best.pt", "num_samples=1", "max_new_tokens=5"], tmp_path, root)
    assert proc.returncode == 0, proc.stderr


def test_user_mistakes_get_one_line_errors_and_earlier_runs_survive(trained_run, data_root):
    cwd, run_dir, _ = trained_run
    root, data_overrides = data_root
    before = _snapshot(cwd / "outputs")
    runs_before = sorted(p.name for p in (cwd / "outputs" / "runs").iterdir())
    early = [  # refused before anything is written: no new run directory either
        ("train.py", ["model.n_embd=30", "model.n_head=4"], ["n_embd=30", "n_head=4", "multiple"]),
        ("train.py", ["model=gpt5"], ["unknown model config 'gpt5'", "gpt-micro"]),
        (
            "train.py",
            [f"hydra.run.dir={run_dir}", "resume=false", "debug=tiny", *data_overrides],
            ["already holds a run", "resume=false"],
        ),
        ("train.py", [f"hydra.run.dir={run_dir}", "optim.lr=fast"], ["optim.lr must be a number", "'fast'"]),
        ("train.py", ["compile=maybe"], ["compile=", "true"]),
        ("train.py", ["debug=tiny", "model.bias=1"], ["model.bias must be true or false, got 1"]),
        ("train.py", ["debug=tiny", "model.bias=maybe"], ["model.bias must be true or false, got 'maybe'"]),
        ("train.py", ["-m", "debug=tiny", "optim.lr=3e-3,abc"], ["optim.lr must be a number, got 'abc'"]),
        ("train.py", ["-m", "debug=tiny", "train.max_iter=3,4"], ["unknown setting 'train.max_iter'"]),
        (
            "train.py",
            ["-m", "debug=tiny", "model.n_head=5", "optim.lr=1e-3,3e-3"],
            ["the sweep's job optim.lr=0.001: model.n_embd=24 is not divisible by model.n_head=5"],
        ),
        ("train.py", [f"hydra.run.dir={run_dir / 'train.log'}", "debug=tiny"], ["is a file; name a directory"]),
        ("train.py", [f"hydra.run.dir={run_dir}", "resume=False", "debug=tiny"], ["already holds a run", "resume=false"]),
        ("train.py", [f"hydra.run.dir={run_dir}", "resume=never", "debug=tiny"], ["already holds a run", "resume=false"]),
        ("eval", ["data.tokenizer.ranks_file=/x"], ["cannot apply 'data.tokenizer.ranks_file=/x'", "data=<name>"]),
        ("export", [f"run_dir={run_dir}", "out=/proc/tinygpt-export"], ["cannot write to /proc/tinygpt-export"]),
        ("train.py", ["data=local"], ["data.source.path is required for data.source.kind=local"]),
        ("prepare", ["data=local"], ["data.source.path is required for data.source.kind=local"]),
        ("train.py", ["data.source.kind=ftp"], ["data.source.kind='ftp' is unknown; use url, hub, disk, local"]),
        ("train.py", ["device=tpu"], ["device='tpu' is unknown"]),
        ("train.py", ["train.max_iter=20"], ["unknown setting 'train.max_iter'", "--cfg job"]),
        ("train.py", ["-m", "model=gpt5,gpt-nano"], ["unknown model config 'gpt5'"]),
        (
            "train.py",
            ["experiment=shakespeare_char", "optim.muon_lr=0.05"],
            ["optim.muon_lr is a Muon setting", "add optim=muon"],
        ),
        ("sample.py", ["prompt=Ωmega"], ["'Ω'", "vocabulary"]),
        ("sample.py", ["ckpt=nowhere/best.pt"], ["nowhere/best.pt", "does not exist"]),
        ("sample.py", ["temperature=-1"], ["temperature"]),
        ("sample.py", ["top_p=1.5"], ["top_p must be in (0, 1]"]),
        ("sample.py", ["--bogus"], ["unknown option '--bogus'"]),
        ("eval", ["split=test"], ["split='test': use train or val"]),
        ("eval", ["batch_size=0"], ["batch_size must be a positive integer"]),
        ("export", [], ["out is required"]),
        ("sweep", [], ["dir is required"]),
        ("sweep", ["dir=/nowhere/sweep"], ["/nowhere/sweep does not exist"]),
        ("fly", [], ["unknown command 'fly'", "train, sample"]),
    ]
    for script, args, needles in early:
        assert_one_line_error(run_script(script, args, cwd, root), *needles)
    assert sorted(p.name for p in (cwd / "outputs" / "runs").iterdir()) == runs_before
    assert (run_dir / ".hydra").is_dir() and not (run_dir / ".hydra-1").exists()  # the refused resume renamed nothing
    late = [("train.py", ["debug=tiny", *data_overrides, "model.block_size=200000"], ["block_size=200000", "val split"])]
    for script, args, needles in late:
        assert_one_line_error(run_script(script, args, cwd, root), *needles)
    after = _snapshot(cwd / "outputs")
    # A run that failed on its data leaves a new run directory holding its log; no earlier file changes.
    assert {k: after.get(k) for k in before} == before


BAD_INPUTS = {  # id: (command, arguments, what the one line must name); {run}, {text}, ... are filled in below
    "split_by": ("train.py", ["hydra.run.dir={run}", "data.split_by=random"], "data.split_by"),
    "shard_tokens": ("train.py", ["hydra.run.dir={run}", "data.shard_tokens=-1"], "data.shard_tokens"),
    "refused_resume": ("train.py", ["hydra.run.dir={run}", "optim.lr=fast"], "optim.lr"),
    "seed": ("train.py", ["seed=abc"], "seed"),
    "device": ("train.py", ["device=0"], "device"),
    "weight_decay": ("train.py", ["optim.weight_decay=-1"], "optim.weight_decay"),
    "lora_dropout": ("train.py", ["finetune.lora_dropout=1.5"], "finetune.lora_dropout"),
    "num_proc": ("train.py", ["data.num_proc=abc"], "data.num_proc"),
    "max_docs": ("train.py", ["data.max_docs=abc"], "data.max_docs"),
    "max_tokens": ("train.py", ["data.max_tokens=-5"], "data.max_tokens"),
    "threads": ("train.py", ["threads=0"], "threads must be a positive integer"),
    "distributed": ("train.py", ["distributed=zero3"], "distributed='zero3' is not understood; use distributed=ddp"),
    "fsdp_recurrent": ("train.py", ["model=lstm", "distributed=fsdp"], "model.arch=lstm is recurrent: use distributed=ddp"),
    "fsdp_float16": (
        "train.py",
        ["distributed=fsdp", "dtype=float16", "device=cpu"],
        "distributed=fsdp trains in bfloat16 or float32",
    ),
    "offload_without_fsdp": ("train.py", ["cpu_offload=true"], "cpu_offload=true offloads FSDP2's shards to host memory; add"),
    "threads_word": ("train.py", ["threads=many"], "threads must be a positive integer, null"),
    "eval_task_name": ("train.py", ["train.eval_tasks=[hellaswa]"], "task='hellaswa' is unknown"),
    "mlp_unknown": ("train.py", ["model.mlp=swiglu2"], "model.mlp='swiglu2' is unknown; use one of gelu, swiglu, relu2"),
    "norm_unknown": ("train.py", ["model.norm=batchnorm"], "model.norm='batchnorm' is unknown"),
    "unquoted_tilde": ("train.py", ["data=local", "data.source.path=~/corpus/*.md"], "\"data.source.path='~/corpus/*.md'\""),
    "run_dir_is_a_file": ("train.py", ["hydra.run.dir={text}"], "hydra.run.dir"),
    "resume_a_text_file": ("train.py", ["resume={text}"], "resume="),
    "weights_that_do_not_fit": ("sample.py", ["ckpt={bad_ckpt}"], "bad.pt"),
    "data_root_is_a_file": ("train.py", ["debug=tiny", "paths.data_dir={text}"], "paths.data_dir"),
    "prompt_file_not_utf8": ("sample.py", ["prompt_file={latin1}"], "prompt_file"),
    "text_file_not_utf8": ("eval", ["text_file={latin1}"], "text_file"),
    "out_file_a_folder": ("sample.py", ["out_file={folder}", "max_new_tokens=5"], "out_file="),
    "eval_batch_size": ("eval", ["batch_size=0"], "batch_size"),
    "export_over_a_file": ("export", ["out={text}"], "out="),
    "bare_word_train": ("train.py", ["debug=tiny", "fast"], "'fast' is not a setting"),
    "bare_word_prepare": ("prepare", ["fast"], "'fast' is not a setting"),
    "bare_word_eval": ("eval", ["fast"], "'fast' is not a setting"),
    "local_without_path": ("train.py", ["data=local"], "data.source.path"),
    # refused in place: the earlier run's .hydra record and train.log must not change either
    "data_root_is_a_file_in_place": ("train.py", ["hydra.run.dir={run}", "paths.data_dir={text}"], "paths.data_dir"),
    "tokenizer_mismatch_in_place": (
        "train.py",
        ["hydra.run.dir={run}", "data=shakespeare", "data.name=shakespeare_char"],
        "tokenizer differs",
    ),
    "other_data_in_place": (
        "train.py",
        ["hydra.run.dir={run}", "data=shakespeare"],
        "was trained with data.name=shakespeare_char",
    ),
    "resume_best_into_its_run": ("train.py", ["hydra.run.dir={run}", "resume={run}/checkpoints/best.pt"], "weights only"),
    "resume_weights_that_do_not_fit": ("train.py", ["resume={bad_step}"], "do not fit"),
    "no_checkpoint_of_the_run_loads": ("train.py", ["hydra.run.dir={broken_run}"], "none can be resumed"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_get_one_line_and_touch_nothing(case, trained_run, data_root, tmp_path):
    """Each mistake through the real command: exit status 2, no traceback, one line naming the
    setting (or the file it points at), and every earlier file (the runs, the prepared data)
    byte-identical afterwards."""
    import torch

    from gpt.checkpoints import checkpoint

    cwd, run_dir, _ = trained_run
    root, data_overrides = data_root
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    (tmp_path / "latin1.txt").write_bytes("Caf\xe9 cr\xe8me".encode("latin-1"))
    (tmp_path / "folder").mkdir()
    bad = checkpoint.load(run_dir / "checkpoints" / "best.pt")
    bad.model["transformer.wte.weight"] = torch.zeros(3, 3)
    checkpoint.save(tmp_path / "bad.pt", bad)
    bad_step = checkpoint.load(runs.latest(run_dir))
    bad_step.model["transformer.wte.weight"] = torch.zeros(3, 3)
    checkpoint.save(tmp_path / "bad_step.pt", bad_step)
    shutil.copytree(run_dir, tmp_path / "broken_run")
    for path in runs.step_checkpoints(tmp_path / "broken_run"):
        path.write_bytes(path.read_bytes()[:1000])  # cut short
    names = {
        "run": run_dir,
        "text": tmp_path / "notes.txt",
        "latin1": tmp_path / "latin1.txt",
        "folder": tmp_path / "folder",
        "bad_ckpt": tmp_path / "bad.pt",
        "bad_step": tmp_path / "bad_step.pt",
        "broken_run": tmp_path / "broken_run",
    }
    command, args, needle = BAD_INPUTS[case]
    args = [a.format(**names) for a in args]
    before = {"outputs": _snapshot(cwd / "outputs"), "data": _snapshot(root), "broken": _snapshot(tmp_path / "broken_run")}
    proc = run_script(command, [*args, *(data_overrides if command == "train.py" else [])], cwd, root)
    assert_one_line_error(proc, needle)
    after = {"outputs": _snapshot(cwd / "outputs"), "data": _snapshot(root), "broken": _snapshot(tmp_path / "broken_run")}
    for where in before:
        assert {k: after[where].get(k) for k in before[where]} == before[where], where
    assert not (run_dir / ".hydra-1").exists() and not (tmp_path / "broken_run" / ".hydra-1").exists()


def test_a_refused_first_run_leaves_no_folder_behind(tmp_path, data_root):
    """Refused before it trains (a misspelt dtype): no outputs/runs/ left in the working folder,
    and a folder that was there already is left alone, empty or not."""
    root, data = data_root
    proc = run_script("train.py", ["debug=tiny", *data, "dtype=bf16"], tmp_path, root)
    assert_one_line_error(proc, "dtype='bf16' is unknown")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "outputs" / "runs").mkdir(parents=True)
    assert_one_line_error(run_script("train.py", ["debug=tiny", *data, "dtype=bf16"], tmp_path, root))
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")] == ["outputs", "outputs/runs"]


def test_a_refused_start_racing_another_for_its_folders_still_ends_in_one_line(tmp_path, monkeypatch):
    """Two first runs refused at once race to remove outputs/runs/: the loser's rmdir fails (the
    folder is gone, or the other start has put its run in it), and that is no new error."""
    from gpt.training import claim

    run_dir = tmp_path / "outputs" / "runs" / "r"
    run_dir.mkdir(parents=True)
    monkeypatch.setattr(Path, "rmdir", lambda self: (_ for _ in ()).throw(FileNotFoundError(2, "gone", str(self))))
    claim._remove_empty(run_dir, tmp_path / "outputs")  # no exception


def test_a_list_typed_unquoted_is_told_how_to_quote_its_items_and_the_hint_runs(tmp_path):
    """A list setting whose items hold '=' (configs/hydra/launcher/slurm.yaml's setup lines, and
    docs/training.md's MASTER_ADDR line with its $(...)), typed unquoted, is refused with an
    example that quotes each item inside single quotes (quoting the whole list makes a string,
    which then said 'must be Invalid value assigned'; double quotes outside let the shell run the
    $(...) as the example was typed); that example, split as a shell splits it, composes the lines
    as written, an apostrophe included; a string where a list goes says so."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the slurm extra: pip install -e '.[slurm]'")
    import shlex

    import yaml

    args = ["--cfg", "hydra", "hydra/launcher=slurm"]
    meet = "export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1) MASTER_PORT=29500"
    for lines in (["export SLURM_KILL_BAD_EXIT=1", "module load cuda"], ["export SLURM_KILL_BAD_EXIT=1", meet, "echo it's=1"]):
        typed = run_script("train.py", [*args, f"hydra.launcher.setup=[{','.join(lines)}]"], tmp_path, tmp_path)
        assert_one_line_error(typed)
        message = typed.stderr.strip()
        assert "takes an item holding '=' (or other punctuation) only quoted; quote each item, e.g. '" in message
        hint = shlex.split(message.rpartition("e.g. ")[2])
        assert len(hint) == 1 and hint[0].startswith('hydra.launcher.setup=["export SLURM_KILL_BAD_EXIT=1",'), hint
        composed = run_script("train.py", [*args, *hint], tmp_path, tmp_path)
        assert composed.returncode == 0, composed.stderr[-2000:]
        setup = yaml.safe_load(composed.stdout)["hydra"]["launcher"]["setup"]
        assert setup == lines, setup
    string = run_script("train.py", [*args, "hydra.launcher.setup='[a b]'"], tmp_path, tmp_path)
    assert_one_line_error(string)
    assert string.stderr.strip() == "error: hydra.launcher.setup must be a list, e.g. [a,b], got '[a b]'"
