"""gpt/apps/eval.py: `tinygpt eval` on a text file and on the model's own validation split.
Run: pytest tests/apps/test_eval.py"""

from __future__ import annotations

import json
import math

import torch

from helpers import assert_one_line_error, run_script


def _figures(line: str) -> tuple[float, float, float]:
    loss = float(line.split("loss ")[1].split(",")[0])
    ppl = float(line.split("perplexity ")[1].split(",")[0])
    bpb = float(line.split("bits per byte ")[1])
    return loss, ppl, bpb


def test_eval_command_reports_loss_perplexity_and_bits_per_byte(tmp_path, trained_run, data_root):
    cwd, run_dir, _ = trained_run
    root, _ = data_root
    text = tmp_path / "eval.txt"
    text.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 20)
    proc = run_script("eval", [f"run_dir={run_dir}", f"text_file={text}"], tmp_path, root)
    assert proc.returncode == 0, proc.stderr
    loss, ppl, bpb = _figures(proc.stdout.strip().splitlines()[-1])
    assert abs(ppl - math.exp(loss)) / ppl < 1e-3
    assert abs(bpb - loss / math.log(2)) < 1e-3  # ASCII text, one char = one token = one byte
    # no run named: the newest run under paths.runs_dir, on its own data's val split
    split = run_script("eval", [f"paths.runs_dir={cwd / 'outputs'}", "max_tokens=2000"], tmp_path, root)
    assert split.returncode == 0, split.stderr
    assert "shakespeare_char val: 2,000 tokens" in split.stdout  # 2001 tokens -> 125 windows of 16 targets


def test_eval_refuses_a_missing_text_file(tmp_path, trained_run, data_root):
    _, run_dir, _ = trained_run
    root, _ = data_root
    assert_one_line_error(
        run_script("eval", [f"run_dir={run_dir}", f"text_file={tmp_path / 'nope.txt'}"], tmp_path, root),
        "nope.txt does not exist",
    )


def test_eval_scores_a_zero_shot_task_on_a_char_model(tmp_path, trained_run, data_root):
    """The CLI as a user types it: a char model (Tiny Shakespeare's alphabet) on ARC items in the
    Hub's format; a task name that does not exist, text outside the vocabulary, and a task
    combined with a text file are one-line errors."""
    import json

    _, run_dir, _ = trained_run
    root, _ = data_root
    items = tmp_path / "données (1).jsonl"  # a browser download's name: taken as typed, past Hydra's grammar
    rows = [
        {
            "id": "1",
            "question": "Which is a bird?",
            "choices": {"text": ["crow", "stone"], "label": ["A", "B"]},
            "answerKey": "A",
        },
        {
            "id": "2",
            "question": "What falls?",
            "choices": {"text": ["rain", "up", "sky"], "label": ["A", "B", "C"]},
            "answerKey": "A",
        },
    ]
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = [f"task.path={items}"]
    proc = run_script("eval", [f"run_dir={run_dir}", "task=arc_easy", *source], tmp_path, root)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert "on arc_easy (2 items): acc " in line and ", acc_norm " in line
    assert float(line.split("acc ")[1].split(",")[0]) in (0.0, 0.5, 1.0)
    assert_one_line_error(run_script("eval", [f"run_dir={run_dir}", "task=hellaswa"], tmp_path, root), "hellaswa", "hellaswag")
    rows[0]["question"] = "Which is a bird? 鳥"
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert_one_line_error(
        run_script("eval", [f"run_dir={run_dir}", "task=arc_easy", *source], tmp_path, root),
        "task arc_easy item 1: text has characters outside this char-level vocabulary: '鳥'",
    )
    assert_one_line_error(
        run_script("eval", [f"run_dir={run_dir}", "task=arc_easy", f"text_file={items}"], tmp_path, root), "pass one of them"
    )


def test_eval_reads_data_settings_recorded_by_another_version(tmp_path, trained_run, data_root):
    """A checkpoint whose recorded data settings hold a key this tinygpt does not know (written
    by another version) is evaluated on its data all the same, with a notice naming the key."""
    from gpt.checkpoints import checkpoint

    _, run_dir, _ = trained_run
    root, _ = data_root
    ckpt = checkpoint.load(run_dir / "checkpoints" / "best.pt")
    ckpt.config["data"]["old_setting"] = 1
    checkpoint.save(tmp_path / "other_version.pt", ckpt)
    proc = run_script("eval", [f"ckpt={tmp_path / 'other_version.pt'}", "max_tokens=2000"], tmp_path, root)
    assert proc.returncode == 0, proc.stderr
    assert "shakespeare_char val: 2,000 tokens" in proc.stdout
    assert "records data.old_setting, unknown to this tinygpt: ignored" in proc.stderr


def test_eval_runs_its_forward_passes_under_the_runtime_autocast(tmp_path, trained_run, monkeypatch, capsys):
    """dtype=bfloat16 (what dtype=auto picks on a GPU with bf16): every forward pass of the
    perplexity and of a zero-shot task runs under bf16 autocast, as training's evals do;
    dtype=float32 runs none. Shown on the CPU, whose autocast the same code enters."""
    from gpt.apps import eval as eval_app
    from gpt.model import GPT

    _, run_dir, _ = trained_run
    seen = []  # the autocast dtype each forward pass ran under (None: none)
    real = GPT.forward

    def forward(self, *args, **kw):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return real(self, *args, **kw)

    monkeypatch.setattr(GPT, "forward", forward)
    text = tmp_path / "eval.txt"
    text.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 5)
    items = tmp_path / "arc.jsonl"
    question = {"id": "1", "question": "Which is a bird?", "choices": {"text": ["crow", "stone"], "label": ["A", "B"]}}
    items.write_text(json.dumps({**question, "answerKey": "A"}) + "\n")
    losses = {}
    for dtype, expected in (("bfloat16", torch.bfloat16), ("float32", None)):
        seen.clear()
        common = [f"run_dir={run_dir}", "device=cpu", f"dtype={dtype}", "threads=1"]
        eval_app.main([*common, f"text_file={text}"])
        eval_app.main([*common, "task=arc_easy", f"task.path={items}"])
        assert len(seen) >= 2 and set(seen) == {expected}, (dtype, seen)
        losses[dtype] = float(capsys.readouterr().out.split("loss ")[1].split(",")[0])
    # the same loss up to bf16's rounding (which the 4 printed decimals may or may not show)
    assert abs(losses["bfloat16"] - losses["float32"]) < 0.05 * losses["float32"]


def test_eval_does_not_prepare_over_data_prepared_with_another_tokenizer(tmp_path, trained_run):
    """The model's data.name holds data prepared with other settings (here another tokenizer,
    for another run): eval refuses in one line, saying what differs and how to prepare the
    model's, and leaves that data as it was (it used to prepare the model's over it, unsaid)."""
    _, run_dir, _ = trained_run
    root = tmp_path / "root"
    (tmp_path / "corpus.txt").write_text("Another corpus, prepared under the model's data.name.\n" * 40)
    other = [
        "data=local",
        f"data.source.path={tmp_path / 'corpus.txt'}",
        "data.name=shakespeare_char",
        "data.tokenizer.kind=byte",
    ]
    assert run_script("prepare", other, tmp_path, root).returncode == 0
    meta = (root / "shakespeare_char" / "meta.json").read_bytes()
    proc = run_script("eval", [f"run_dir={run_dir}"], tmp_path, root)
    assert_one_line_error(
        proc,
        "holds data prepared with other settings",
        "tokenizer: byte there, char here",
        "tinygpt prepare data=shakespeare_char",
    )
    assert (root / "shakespeare_char" / "meta.json").read_bytes() == meta
