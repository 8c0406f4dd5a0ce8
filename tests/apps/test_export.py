"""gpt/apps/export.py: `tinygpt export` writes a folder transformers loads with the same logits.
Run: pytest tests/apps/test_export.py"""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from gpt import interop
from gpt.checkpoints import loading
from helpers import assert_one_line_error, llama_folder, run_script

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")


def test_export_command(tmp_path, trained_run, data_root):
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    proc = run_script("export", [f"paths.runs_dir={cwd / 'outputs'}", f"out={tmp_path / 'hf'}"], tmp_path, root)
    assert proc.returncode == 0, proc.stderr  # the newest run under paths.runs_dir
    assert f"exported {run_dir / 'checkpoints' / 'best.pt'}" in proc.stdout
    ours = loading.load(str(run_dir)).model
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, ours.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
    assert_one_line_error(run_script("export", [f"run_dir={tmp_path / 'nope'}", "out=x"], tmp_path, root), "nope does not exist")


def test_export_replaces_an_earlier_export_whole_and_refuses_a_folder_of_other_files(tmp_path, trained_run, data_root):
    """out= may name a new or empty folder, or an earlier export, replaced whole: a file the
    earlier one wrote and this one does not (a chat model's generation_config.json beside a plain
    model's weights) is gone. A folder of other files is refused in one line, untouched (an
    export wrote over its config.json and left the rest)."""
    _, run_dir, _ = trained_run
    root, _ = data_root
    export = lambda out: run_script("export", [f"run_dir={run_dir}", f"out={out}"], tmp_path, root)  # noqa: E731
    assert export(tmp_path / "hf").returncode == 0
    first = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    assert "generation_config.json" not in first  # GPT-2's block, no chat: none written
    (tmp_path / "hf" / "generation_config.json").write_text('{"eos_token_id": [260, 256], "pad_token_id": 260}')
    dead = _a_finished_pid()
    (tmp_path / f".hf.exporting-{dead}").mkdir()  # an export killed mid-write left it: removed
    (tmp_path / f".hf.exporting-{os.getpid()}").mkdir()  # an export still running: kept
    again = export(tmp_path / "hf")
    assert again.returncode == 0, again.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == first
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [f".hf.exporting-{os.getpid()}"]
    (tmp_path / f".hf.exporting-{os.getpid()}").rmdir()
    # killed after moving the earlier export aside, before its own took the place: it comes back
    (tmp_path / "hf").rename(tmp_path / f".hf.replaced-{dead}")
    interop._remove_leftovers(tmp_path / "h?")  # another folder's leftovers are not its own
    interop._remove_leftovers(tmp_path / "h*")
    assert not (tmp_path / "h?").exists() and not (tmp_path / "h*").exists()
    interop._remove_leftovers(tmp_path / "hf")
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == first

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    (mine / "config.json").write_text('{"a": 1}')
    assert_one_line_error(export(mine), f"out={mine} holds files that are not an earlier export's (notes.txt)")
    assert {p.name: p.read_text() for p in mine.iterdir()} == {"notes.txt": "precious", "config.json": '{"a": 1}'}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging folder left


def test_the_quickstarts_block_exports_with_its_modeling_code(tmp_path, data_root):
    """The quickstart's block (RMSNorm, RoPE, QK-norm, GPT-2's GELU MLP) is neither GPT-2's nor
    Llama's: `tinygpt export` writes tinygpt's own form, its modeling code beside the weights,
    which transformers loads (trust_remote_code) with the run's logits."""
    root, data = data_root
    block = ["model.norm=rmsnorm", "model.pos_encoding=rope", "model.qk_norm=true", "model.bias=false"]
    trained = run_script("train.py", ["debug=tiny", *data, *block, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, root)
    assert trained.returncode == 0, trained.stderr[-2000:]
    proc = run_script("export", [f"run_dir={tmp_path / 'run'}", f"out={tmp_path / 'hf'}"], tmp_path, root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TinyGPTForCausalLM" in proc.stdout and "trust_remote_code=True" in proc.stdout
    ours = loading.load(str(tmp_path / "run")).model
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    idx = torch.randint(0, ours.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
    gguf = run_script("export", [f"run_dir={tmp_path / 'run'}", "format=gguf", f"out={tmp_path / 'q.gguf'}"], tmp_path, root)
    assert_one_line_error(gguf, "llama.cpp has no architecture for this model's block", "model=llama-nano")
    assert not (tmp_path / "q.gguf").exists()
    lstm = run_script("train.py", ["debug=tiny", *data, "model=lstm", f"hydra.run.dir={tmp_path / 'lstm'}"], tmp_path, root)
    assert lstm.returncode == 0, lstm.stderr[-2000:]
    refused = run_script("export", [f"run_dir={tmp_path / 'lstm'}", f"out={tmp_path / 'hf-lstm'}"], tmp_path, root)
    assert_one_line_error(refused, "it is a recurrent model (lstm)")
    assert not (tmp_path / "hf-lstm").exists()


@pytest.mark.slow
def test_a_llama_folder_through_the_commands(tmp_path, data_root):
    """A LlamaForCausalLM folder with its tokenizer.json, as a user has one on disk: sampled,
    evaluated, finetuned with LoRA on data of its tokenizer (and resumed), exported again
    (`tinygpt export init_from=<folder>`) bitwise; one whose RoPE is scaled is refused by train.py
    in one line before anything is written."""
    import json

    from safetensors.torch import load_file

    root, _ = data_root
    folder, corpus = llama_folder(tmp_path, root)

    sample = run_script("sample", [f"init_from={folder}", "prompt=ROMEO:", "max_new_tokens=8", "num_samples=1"], tmp_path, root)
    assert sample.returncode == 0 and "\nROMEO:" in sample.stdout, sample.stderr[-1500:]
    scored = run_script("eval", [f"init_from={folder}", f"text_file={corpus}", "max_tokens=500"], tmp_path, root)
    assert scored.returncode == 0 and "perplexity" in scored.stdout, scored.stderr[-1500:]

    run_dir = tmp_path / "run"
    finetune = [
        f"init_from={folder}", "data=local", f"data.source.path={corpus}", "data.name=llama_ft", "data.split_by=tail",
        "data.tokenizer.kind=hf", f"data.tokenizer.name={folder}", "finetune.lora_rank=4", "optim=adamw",
        "train.batch_size=4", "train.eval_iters=2", "train.eval_interval=4", "train.sample_tokens=0", "threads=1",
        "finetune.block_size=32", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    first = run_script("train.py", [*finetune, "train.max_iters=4", "optim.decay_iters=8"], tmp_path, root)
    assert first.returncode == 0 and "LoRA" in first.stdout, first.stderr[-2000:]
    again = run_script("train.py", [*finetune, "train.max_iters=8", "optim.decay_iters=8"], tmp_path, root)
    assert again.returncode == 0 and "resuming from" in again.stdout, again.stderr[-2000:]

    out = tmp_path / "again"
    exported = run_script("export", [f"init_from={folder}", f"out={out}"], tmp_path, root)
    assert exported.returncode == 0 and "LlamaForCausalLM" in exported.stdout, exported.stderr[-1500:]
    a, b = load_file(str(folder / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)

    scaled = tmp_path / "scaled"
    scaled.mkdir()
    spec = json.loads((folder / "config.json").read_text())
    spec["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    (scaled / "config.json").write_text(json.dumps(spec))
    before = sorted(p.name for p in tmp_path.iterdir())
    refused = run_script(
        "train.py", [*finetune[1:-1], f"init_from={scaled}", f"hydra.run.dir={tmp_path / 'new'}"], tmp_path, root
    )
    assert_one_line_error(refused, "rope scaling")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run directory, nothing written


def _a_finished_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.slow
def test_a_gpt2_bpe_run_pads_its_tables_and_exports_the_tokenizer_s_vocabulary(tmp_path, data_root, gpt2_ranks):
    """model=gpt-nano on GPT-2's BPE: model.vocab_multiple left null pads the 50,257 tokens to
    50,304 rows (a multiple of 64, as GPU matmuls want); the logits, the export and its tokenizer
    keep 50,257."""
    import json

    from safetensors import safe_open

    root, data_overrides = data_root
    run = tmp_path / "run"
    steps = ["train.max_iters=1", "train.eval_iters=1", "train.sample_tokens=0", "train.eval_sample_tokens=0"]
    proc = run_script(
        "train.py", ["model=gpt-nano", "data=shakespeare", *data_overrides, *steps, f"hydra.run.dir={run}"], tmp_path, root
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = loading.load(str(run)).model
    assert model.lm_head.weight.size(0) == model.transformer.wte.weight.size(0) == 50304
    assert model(torch.zeros(1, 4, dtype=torch.long))[0].size(-1) == 50257
    out = tmp_path / "hf"
    proc = run_script("export", [f"run_dir={run}", f"out={out}"], tmp_path, root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 50257
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        rows = {f.get_slice(k).get_shape()[0] for k in f.keys() if k.endswith(("wte.weight", "lm_head.weight"))}
    assert rows == {50257}


def test_refusals_are_one_line_and_write_nothing(tmp_path, trained_run, data_root):
    """The quickstart's block (no llama.cpp architecture) names the presets that export; a
    folder, a name without .gguf and a file of something else are refused; quant without
    format=gguf too. Nothing is written, the other file is untouched."""
    _, run_dir, _ = trained_run
    root, _ = data_root
    export = lambda *args: run_script("export", [f"run_dir={run_dir}", "format=gguf", *args], tmp_path, root)  # noqa: E731
    other = tmp_path / "notes.gguf"
    other.write_text("mine")
    assert_one_line_error(export(f"out={other}"), "is not a GGUF file")
    assert other.read_text() == "mine"
    assert_one_line_error(export(f"out={tmp_path}"), "does not end in .gguf")
    proc = run_script("export", [f"run_dir={run_dir}", "quant=q8_0", f"out={tmp_path / 'hf'}"], tmp_path, root)
    assert_one_line_error(proc, "quant=q8_0 is a GGUF setting; add format=gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.gguf"]


def test_export_command_writes_a_file_transformers_reads(tmp_path, trained_run, data_root):
    """`tinygpt export format=gguf` of the shared run (GPT-2's block, exact GELU: the command
    says llama.cpp computes the tanh approximation); a second export replaces the first."""
    _, run_dir, _ = trained_run
    root, _ = data_root
    out = tmp_path / "m.gguf"
    for quant in ("q8_0", "f32"):
        proc = run_script("export", [f"run_dir={run_dir}", "format=gguf", f"quant={quant}", f"out={out}"], tmp_path, root)
        assert proc.returncode == 0, proc.stderr
        assert f"(GGUF gpt2, {quant}: llama-cli -m {out}) (llama.cpp's gpt2 computes GELU's tanh" in proc.stdout
    ours = loading.load(str(run_dir)).model
    # (n_positions: transformers' GGUF reader does not read gpt2's context_length; see tests/interop/test_gguf.py)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=out.name, n_positions=ours.config.block_size)
    idx = torch.randint(0, ours.config.vocab_size, (2, 16))
    with torch.no_grad():
        diff = (theirs.eval()(idx).logits - ours(idx)[0]).abs().max().item()
    assert diff < 1e-2  # GPT-2's tanh GELU in transformers against the run's exact GELU
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".gguf") == ["m.gguf"]
