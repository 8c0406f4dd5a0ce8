"""A model with its own trained BPE, as a user runs it: train, resume, sample, eval, export (the
exported tokenizer.json read by transformers' AutoTokenizer gives the same ids), and a resume on
data of another tokenizer refused. Run: pytest tests/apps/test_tokenizers.py"""

from __future__ import annotations

import json
import random

import pytest

from gpt.checkpoints import loading
from helpers import assert_one_line_error, run_script

TEXT = "Grüße aus Köln! 日本語 😀  tabs\tand runs   of spaces.\nÄpfel und Öl, ß."


@pytest.mark.slow
def test_a_trained_bpe_travels_with_the_model(tmp_path):
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyzäöüß") for _ in range(rng.randint(2, 7))) for _ in range(200)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choice(words) for _ in range(300))}) + "\n" for _ in range(40)))
    root, run = tmp_path / "root", tmp_path / "run"
    data = [
        "data=local",
        f"data.source.path={corpus}",
        "data.name=mine",
        "data.tokenizer.kind=bpe",
        "data.tokenizer.vocab_size=300",
    ]
    common = ["debug=tiny", *data, f"hydra.run.dir={run}", "train.sample_tokens=0"]
    first = run_script("train.py", [*common, "train.max_iters=10"], tmp_path, root)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "trained a byte-level BPE of 300 tokens" in first.stdout + first.stderr
    resumed = run_script("train.py", [*common, "train.max_iters=20"], tmp_path, root)
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout + resumed.stderr, resumed.stderr[-2000:]
    sampled = run_script("sample", [f"run_dir={run}", f"prompt={TEXT[:12]}", "max_new_tokens=8", "num_samples=1"], tmp_path, root)
    assert sampled.returncode == 0, sampled.stderr[-2000:]

    text = tmp_path / "essay.txt"
    text.write_text(TEXT)
    tok = loading.load(str(run)).tokenizer()
    evaluated = run_script("eval", [f"run_dir={run}", f"text_file={text}"], tmp_path, root)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    first_piece = len(tok.decode(tok.encode(TEXT)[:1]).encode())  # the first token is context, not scored
    assert f"({len(TEXT.encode()) - first_piece:,} bytes" in evaluated.stdout  # bits per byte over real bytes

    exported = run_script("export", [f"run_dir={run}", f"out={tmp_path / 'hf'}"], tmp_path, root)
    assert exported.returncode == 0, exported.stderr[-2000:]
    transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    for sample in (TEXT, "a <|endoftext|> b", " ".join(words[:20])):
        assert hf_tok(sample)["input_ids"] == tok.encode(sample)
    assert hf_tok.eos_token_id == tok.eot_id

    # the same data name prepared with another vocabulary: the run's checkpoints do not fit it
    other = [a.replace("vocab_size=300", "vocab_size=280") for a in common]
    assert_one_line_error(run_script("train.py", [*other, "train.max_iters=30"], tmp_path, root), "tokenizer differs")
