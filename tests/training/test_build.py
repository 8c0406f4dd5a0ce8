"""gpt/training/build.py: what a run is built from, checked before it trains: the data fits the
context, a resumed run keeps its tokenizer and shape, any tokenizer trains end to end.
Run: pytest tests/training/test_build.py"""

from __future__ import annotations

import pytest

from gpt.checkpoints import loading, runs
from gpt.config import SamplingSettings
from gpt.errors import TinyGPTError
from gpt.generation import generate
from gpt.training import build_run, train
from helpers import compose, write_corpus, write_ranks


def test_corpus_shorter_than_a_window_and_tokenizer_mismatch(tmp_path):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    for i in range(4):
        (tiny / f"{i}.txt").write_text(f"tiny {i}")
    base = [
        "debug=tiny",
        "data=local",
        f"data.source.path={tiny}",
        "data.name=tiny",
        "data.tokenizer.kind=byte",
        f"paths.data_dir={tmp_path / 'root'}",
        "data.val_fraction=0.25",
    ]
    with pytest.raises(TinyGPTError, match=r"block_size=16 is longer than the val split .* \(or a larger data.val_fraction\)"):
        train(compose(base, tmp_path / "run1"))

    text = tmp_path / "text"
    write_corpus(text, "txt")
    ok = [
        "debug=tiny",
        "data=local",
        f"data.source.path={text}",
        "data.name=text",
        f"paths.data_dir={tmp_path / 'root'}",
        "train.max_iters=4",
        "train.eval_interval=2",
        "train.sample_tokens=0",
    ]
    train(compose([*ok, "data.tokenizer.kind=byte"], tmp_path / "run2"))
    ranks = write_ranks(tmp_path / "r.tiktoken")
    other = [*ok, "data.tokenizer.kind=tiktoken", f"data.tokenizer.ranks_file={ranks}", "train.max_iters=6"]
    with pytest.raises(TinyGPTError, match="tokenizer differs"):
        train(compose(other, tmp_path / "run2"))
    # and a run on a tiktoken encoding resumes with its own settings (its vocabulary size is known
    # only once the ranks are read: the settings' None is no difference)
    bpe = [*other, "data.name=text_bpe", "train.max_iters=4"]
    train(compose(bpe, tmp_path / "run3"))
    assert train(compose([*bpe, "train.max_iters=6"], tmp_path / "run3"))["step"] == 6
    # a GPT run resumed with a recurrent model named: the checkpoint's model, as for any model setting
    assert train(compose([*bpe, "train.max_iters=8", "model=lstm"], tmp_path / "run3"))["step"] == 8
    # a char run whose corpus gained characters since: the characters named, and what resumes it
    chars = [*ok, "data.tokenizer.kind=char", "data.name=text_char"]
    train(compose(chars, tmp_path / "run4"))
    (text / "zz.txt").write_text("A document with digits 0123 and a tilde ~ " * 4)
    with pytest.raises(TinyGPTError, match=r"only the data has .*'~'\); a run resumes on the data it was trained on: its data"):
        train(compose([*chars, "train.max_iters=6"], tmp_path / "run4"))


def test_tiny_bpe_end_to_end_train_and_sample(tmp_path):
    """An Encoding from a ranks file the test wrote: prepare, train, checkpoint, sample."""
    ranks = write_ranks(tmp_path / "r.tiktoken")
    corpus = write_corpus(tmp_path / "corpus", "txt")
    overrides = [
        "debug=tiny",
        "data=local",
        f"data.source.path={corpus}",
        "data.name=tinybpe",
        f"data.tokenizer.ranks_file={ranks}",
        f"paths.data_dir={tmp_path / 'root'}",
        "train.max_iters=6",
        "train.eval_interval=3",
        "train.sample_tokens=0",
    ]
    train(compose(overrides, tmp_path / "run"))
    loaded = loading.load(str(tmp_path / "run"))
    model, tok = loaded.model, loaded.tokenizer()
    assert loaded.checkpoint.tokenizer == {"kind": "tiktoken", "name": "gpt2", "ranks_file": str(ranks), "vocab_size": 267}
    assert tok.vocab_size == 267 and model.config.vocab_size == 267
    text = generate(model, tok, ["the "], SamplingSettings(max_new_tokens=20, temperature=1.0))[0][0]
    assert isinstance(text, str) and len(text) > 0


def _four_steps(data_root) -> list[str]:
    root, data_overrides = data_root
    return [
        "debug=tiny",
        *data_overrides,
        f"paths.data_dir={root}",
        "train.max_iters=4",
        "train.eval_interval=2",
        "train.sample_tokens=0",
    ]


def test_a_resumed_run_keeps_its_shape_and_says_what_it_ignores(tmp_path, data_root, caplog):
    base = _four_steps(data_root)
    train(compose(base, tmp_path))
    with caplog.at_level("INFO", logger="tinygpt"):
        run = build_run(compose([*base, "model.n_embd=36", "train.max_iters=6"], tmp_path))
    assert run.model_config.n_embd == 24 and run.progress.step == 4
    assert "ignoring model.n_embd=36 (checkpoint: 24)" in caplog.text and "train.max_iters: 4 -> 6" in caplog.text
    # what it ignores is not also "changed" (the model goes on as the checkpoint's), nor is the
    # vocabulary size the first start left to the data; what applies (activation checkpointing) is
    resuming = next(line for line in caplog.text.splitlines() if "resuming from" in line)
    assert "model.n_embd" not in resuming and "vocab_size" not in resuming, resuming
    caplog.clear()
    with caplog.at_level("INFO", logger="tinygpt"):
        run = build_run(compose([*base, "model.activation_checkpointing=true", "train.max_iters=6"], tmp_path))
    assert "changed: model.activation_checkpointing: False -> True" in caplog.text and run.cfg.model.n_embd == 24


def test_extending_a_finished_run_says_how_the_learning_rate_moves(tmp_path, data_root, caplog):
    """train.max_iters beyond a finished run's end stretches the cosine over the new horizon: the
    learning rate at the old end climbs from its floor, and the resume says so, with the numbers
    the schedule then uses; optim.decay_iters=<old> keeps the old curve, and nothing is said."""
    base = [*_four_steps(data_root), "optim.lr=1e-3", "optim.warmup_iters=1"]
    train(compose(base, tmp_path))
    with caplog.at_level("INFO", logger="tinygpt"):
        run = build_run(compose([*base, "train.max_iters=8"], tmp_path))
    assert run.schedule.decay_iters == 8 and run.schedule(4) > 5e-4  # back above half the peak
    assert f"decays over 8 steps (was 4): the learning rate at step 4 goes from 0.0001 to {run.schedule(4):.3g}" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="tinygpt"):
        kept = build_run(compose([*base, "train.max_iters=8", "optim.decay_iters=4"], tmp_path))
    assert kept.schedule(4) == pytest.approx(1e-4) and "decays over" not in caplog.text


def test_eval_batches_are_capped_at_the_training_steps(tmp_path, data_root, caplog):
    root, data_overrides = data_root
    with caplog.at_level("INFO", logger="tinygpt"):
        run = build_run(
            compose(
                ["debug=tiny", *data_overrides, f"paths.data_dir={root}", "train.max_iters=3", "train.eval_iters=50"], tmp_path
            )
        )
    assert run.cfg.train.eval_iters == 3 and "eval_iters 50 -> 3" in caplog.text


@pytest.mark.parametrize("dtype, below", [("bfloat16", 256), ("float32", 0)])
def test_a_cpu_run_in_bf16_attends_in_fp32_over_short_contexts(tmp_path, data_root, dtype, below):
    """The CPU's attention policy (gpt.runtime.devices.CPU_FP32_ATTENTION_BELOW) reaches the model
    a run trains: set by the runtime on every attention layer, nothing in float32."""
    root, data_overrides = data_root
    run = build_run(compose(["debug=tiny", *data_overrides, f"paths.data_dir={root}", "device=cpu", f"dtype={dtype}"], tmp_path))
    assert [block.attn.fp32_below for block in run.model.transformer.h] == [below] * len(run.model.transformer.h)


def test_a_run_from_before_min_lr_ratio_keeps_its_floor(tmp_path, data_root, caplog):
    """Checkpoints written before optim.min_lr_ratio existed record an absolute min_lr; resuming
    one without a floor on the command line keeps it (not lr * the ratio's default)."""
    from gpt.checkpoints import checkpoint

    base = [*_four_steps(data_root), "optim.lr=1e-3"]
    train(compose(base, tmp_path))
    path = runs.latest(tmp_path)
    old = checkpoint.load(path)
    del old.config["optim"]["min_lr_ratio"]
    old.config["optim"]["min_lr"] = 3e-4
    checkpoint.save(path, old)
    with caplog.at_level("INFO", logger="tinygpt"):
        run = build_run(compose([*base, "train.max_iters=6"], tmp_path))
    assert run.schedule.min_lr == 3e-4 and "keeping the checkpoint's optim.min_lr=0.0003" in caplog.text
    fresh = build_run(compose(base, tmp_path / "new"))
    assert fresh.schedule.min_lr == pytest.approx(1e-4)


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(tmp_path, data_root, caplog):
    """A checkpoint cut short (a full disk, a copy that stopped) is not where a run continues from:
    the newest one that loads is, the damaged one kept beside it as <name>.damaged, and the log
    says so. When none loads, the run is refused and every file stays."""
    from gpt.checkpoints import checkpoint

    base = _four_steps(data_root)
    train(compose(base, tmp_path))
    older, newest = runs.step_checkpoints(tmp_path)[-2:]
    damaged = newest.read_bytes()[:4096]
    newest.write_bytes(damaged)
    with caplog.at_level("INFO", logger="tinygpt"):
        run = build_run(compose(base, tmp_path))
    assert run.progress.step == checkpoint.load(older).step
    aside = newest.with_name(newest.name + ".damaged")
    assert aside.read_bytes() == damaged and not newest.exists()
    assert f"set aside as {aside.name}, resuming from {older.name}" in caplog.text
    kept = runs.step_checkpoints(tmp_path)
    for path in kept:
        path.write_bytes(b"not a checkpoint")
    with pytest.raises(TinyGPTError, match="holds checkpoints but none can be resumed from"):
        build_run(compose(base, tmp_path))
    assert kept and [p.read_bytes() for p in kept] == [b"not a checkpoint"] * len(kept)
