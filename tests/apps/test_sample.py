"""gpt/apps/sample.py: `python sample.py` / `tinygpt sample` as a user runs it: the newest run,
a run directory, a checkpoint, prompts from the command line, stdin and files, stop strings,
JSONL output, an exported Hugging Face model. Run: pytest tests/apps/test_sample.py"""

from __future__ import annotations

import json
import subprocess
import sys

from gpt.checkpoints import loading
from helpers import REPO, assert_one_line_error, export_hf, relaid, run_script


def test_sample_from_latest_run_and_from_run_dir(trained_run, data_root):
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    latest = run_script("sample.py", ["num_samples=2", "max_new_tokens=40", "prompt=ROMEO:"], cwd, root)
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout.count("---------- sample") == 2 and latest.stdout.count("ROMEO:") == 2
    assert f"{run_dir.name}/checkpoints/best.pt" in latest.stderr

    again = run_script("sample.py", [f"run_dir={run_dir}", "num_samples=2", "max_new_tokens=40", "prompt=ROMEO:"], cwd, root)
    assert again.returncode == 0 and again.stdout == latest.stdout  # same seed, same text

    prompt = cwd / "prompt.txt"
    prompt.write_text("JULIET:\n")
    from_file = run_script(
        "sample.py",
        [f"ckpt={run_dir}/checkpoints/ckpt-0000020.pt", f"prompt_file={prompt}", "num_samples=1", "max_new_tokens=20"],
        cwd,
        root,
    )
    assert from_file.returncode == 0 and "JULIET:\n" in from_file.stdout
    assert not (cwd / "sample.log").exists() and not (cwd / ".hydra").exists()  # sampling writes nothing


def test_sample_from_stdin_batch_file_stop_strings_and_jsonl(trained_run, data_root):
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    piped = run_script(
        "sample.py", ["prompt=-", "num_samples=1", "max_new_tokens=30", "temperature=0"], cwd, root, stdin="KING:\n"
    )
    assert piped.returncode == 0 and "KING:\n" in piped.stdout

    prompts = cwd / "prompts.jsonl"
    prompts.write_text('"ROMEO:"\n{"prompt": "JULIET: O"}\n')
    out = cwd / "samples.jsonl"
    args = [f"prompt_file={prompts}", "num_samples=2", "max_new_tokens=30", "stream=false", f"out_file={out}"]
    batched = run_script("sample.py", args, cwd, root)
    assert batched.returncode == 0, batched.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["prompt"], r["sample"]) for r in records] == [("ROMEO:", 0), ("ROMEO:", 1), ("JULIET: O", 0), ("JULIET: O", 1)]
    assert all(len(r["text"]) == 30 and r["settings"]["max_new_tokens"] == 30 for r in records)
    streamed = run_script("sample.py", args[:-2], cwd, root)  # streaming, one at a time: same text
    assert all(r["prompt"] + r["text"] in streamed.stdout for r in records)

    stop = records[0]["text"][10:12]
    cut = run_script(
        "sample.py", [f"prompt_file={prompts}", "num_samples=1", "max_new_tokens=30", f"stop=[{json.dumps(stop)}]"], cwd, root
    )
    assert cut.returncode == 0, cut.stderr
    first = cut.stdout.split("----------\n", 1)[1].split("\n---------- sample 2", 1)[0]
    assert first == "ROMEO:" + records[0]["text"][: records[0]["text"].index(stop)]


def test_refusals_name_their_cause_and_leave_nothing_behind(trained_run, data_root, tmp_path):
    """A folder given as prompt_file, a checkpoint file as run_dir: said as such (both were "does
    not exist"). A prompt the char vocabulary refuses, with out_file in a new folder: neither the
    file nor the folder is made (an empty file was)."""
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    proc = run_script("sample.py", [f"run_dir={run_dir}", f"prompt_file={tmp_path}"], cwd, root)
    assert_one_line_error(proc, f"prompt_file {tmp_path} is a folder")
    best = run_dir / "checkpoints" / "best.pt"
    proc = run_script("sample.py", [f"run_dir={best}"], cwd, root)
    assert_one_line_error(proc, f"run_dir={best} is a file; pass ckpt={best}")
    out = tmp_path / "new" / "samples.jsonl"
    proc = run_script("sample.py", [f"run_dir={run_dir}", "prompt=\u65e5\u672c", f"out_file={out}"], cwd, root)
    assert_one_line_error(proc, "outside this char-level vocabulary")
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("x")
    proc = run_script("sample.py", [f"run_dir={run_dir}", f"out_file={tmp_path / 'file' / 'x.jsonl'}"], cwd, root)
    assert_one_line_error(proc, f"cannot write out_file={tmp_path / 'file' / 'x.jsonl'} ({tmp_path / 'file'} is a file)")


def test_sample_without_any_run(tmp_path, data_root):
    root, _ = data_root
    assert_one_line_error(run_script("sample.py", [], tmp_path, root), "no trained run found", "python train.py")


def test_sample_py_from_an_exported_model(tmp_path, trained_run):
    cwd, run_dir, _ = trained_run
    loaded = loading.load(str(run_dir))
    export_hf(loaded.model, loaded.tokenizer(), tmp_path / "hf")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "sample.py"),
            f"init_from={tmp_path / 'hf'}",
            "num_samples=1",
            "max_new_tokens=20",
            "prompt=ROMEO:",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ROMEO:" in proc.stdout and str(tmp_path / "hf") in proc.stderr


def test_sampling_settings_are_the_generation_settings():
    """sample.py adds where the model and prompts come from to the generation controls; it does
    not copy them (a new control is one field in gpt.config.SamplingSettings)."""
    from dataclasses import fields

    from gpt.config import SampleConfig, SamplingSettings

    assert issubclass(SampleConfig, SamplingSettings)
    settings = SampleConfig(top_k=5, stop="END")
    assert settings.stop == ("END",) and settings.sampling_only()["top_k"] == 5
    assert set(settings.sampling_only()) == {f.name for f in fields(SamplingSettings)}


def test_stop_strings_typed_on_the_command_line_mean_what_they_say(tmp_path):
    """The README's `'stop=["\\n\\n"]'`: the shell passes a backslash and an n, which must stop
    at the first blank line. A model trained on `ab<blank line>` repeats it greedily."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "ab.txt").write_text("ab\n\n" * 3000)
    data = ["data=local", f"data.source.path={corpus}", "data.name=ab", "data.tokenizer.kind=char", "data.split_by=tail"]
    trained = run_script(
        "train.py", ["debug=tiny", *data, "train.max_iters=60", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, tmp_path
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    common = [f"run_dir={tmp_path / 'run'}", "prompt=a", "temperature=0", "num_samples=1", "max_new_tokens=12"]
    free = run_script("sample.py", common, tmp_path, tmp_path)
    assert free.stdout.endswith("ab\n\nab\n\nab\n\na\n"), free.stdout  # what the model writes
    for stop in ('stop=["\\n\\n"]', "stop=\\n\\n"):  # as typed in single quotes, list or not
        cut = run_script("sample.py", [*common, stop], tmp_path, tmp_path)
        assert cut.returncode == 0 and cut.stdout.endswith("----------\nab\n"), (stop, cut.stdout, cut.stderr)


def test_escapes_typed_in_a_shell_are_the_characters_they_name():
    from gpt.apps.sample import unescape

    assert [unescape(s) for s in ("\\n\\n", "a\\tb", "C:\\\\new", "\\q")] == ["\n\n", "a\tb", "C:\\new", "\\q"]


def test_eager_sampling_decodes_with_weights_laid_out_for_the_cpu(trained_run, monkeypatch, capsys):
    """sample.py (compile=false, a CPU) hands the decoder a model whose linear weights are stored
    input-major (gpt/generation/layout.py), and writes the text nn.Linear's layout gives."""
    import gpt.generation as generation
    from gpt.apps import sample as sample_app
    from gpt.config import SamplingSettings

    _, run_dir, _ = trained_run
    seen = []

    class Spy(generation.Decoder):
        def __init__(self, model, *args, **kwargs):
            seen.append(relaid(model))
            super().__init__(model, *args, **kwargs)

    monkeypatch.setattr(generation, "Decoder", Spy)
    args = [f"run_dir={run_dir}", "prompt=ROMEO:", "temperature=0", "max_new_tokens=40", "num_samples=1", "device=cpu"]
    sample_app.main([*args, "threads=1"])
    text = capsys.readouterr().out
    assert seen == [True]
    monkeypatch.undo()
    loaded = loading.load(str(run_dir))
    assert not relaid(loaded.model)
    greedy = generation.generate(loaded.model, loaded.tokenizer(), ["ROMEO:"], SamplingSettings(max_new_tokens=40, temperature=0))
    assert "ROMEO:" + greedy[0][0] in text


def test_sample_compile_true_traces_a_few_graphs_and_writes_what_eager_writes(trained_run, monkeypatch, capsys):
    """compile=true compiles the model once for the whole generation (a counting backend stands
    in for inductor): a few graphs, not one per token, and the same greedy text."""
    import torch

    import gpt.generation as generation
    from gpt.apps import sample as sample_app

    _, run_dir, _ = trained_run
    graphs = []
    real = generation.compile_for_generation
    monkeypatch.setattr(
        generation,
        "compile_for_generation",
        lambda model, **kw: real(model, **kw, backend=lambda gm, _: graphs.append(gm) or gm.forward),
    )
    common = [
        f"run_dir={run_dir}",
        "prompt=ROMEO:",
        "temperature=0",
        "num_samples=2",
        "max_new_tokens=30",
        "device=cpu",
        "threads=1",
    ]
    torch.compiler.reset()
    try:
        sample_app.main([*common, "compile=false"])
        eager = capsys.readouterr().out
        sample_app.main([*common, "compile=true"])
        compiled = capsys.readouterr().out
    finally:
        torch.compiler.reset()
    assert compiled == eager and eager.count("ROMEO:") == 2
    assert 1 <= len(graphs) <= 4, len(graphs)
