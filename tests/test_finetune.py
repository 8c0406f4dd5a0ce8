"""gpt/training/finetune.py: training from trained weights (an exported GPT-2 folder or a run of ours):
freezing, LoRA adapters that resume and merge, tokenizer and base-model checks.
Run: pytest tests/test_finetune.py"""

from __future__ import annotations

import math

import pytest
import torch

from gpt.checkpoints import checkpoint, loading, runs
from gpt.errors import TinyGPTError
from gpt.model import registry
from gpt.model.lora import apply_lora
from gpt.training import build_run, train
from helpers import compose, export_hf


def _char_overrides(root, data_overrides, steps=6):
    return [
        "debug=tiny",
        "data=shakespeare_char",
        *data_overrides,
        f"paths.data_dir={root}",
        f"train.max_iters={steps}",
        "train.eval_interval=3",
        "train.sample_tokens=0",
    ]


def test_finetune_from_an_exported_then_reimported_model(tmp_path, data_root):
    root, data_overrides = data_root
    base = _char_overrides(root, data_overrides)
    train(compose(base, tmp_path / "pretrain"))
    loaded = loading.load(str(tmp_path / "pretrain"))
    model = loaded.model
    export_hf(model, loaded.tokenizer(), tmp_path / "hf")

    losses = []
    train(
        compose(
            [
                *base,
                f"init_from={tmp_path / 'hf'}",
                "finetune.freeze_layers=1",
                "finetune.freeze_embeddings=true",
                "optim.lr=1e-3",
            ],
            tmp_path / "finetune",
        ),
        on_step=lambda step, loss: losses.append(loss),
    )
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    tuned = checkpoint.load(runs.latest(tmp_path / "finetune")).model
    start = model.state_dict()
    for key in ("transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight"):
        assert torch.equal(tuned[key], start[key]), key  # frozen
    assert not torch.equal(tuned["transformer.ln_f.weight"], start["transformer.ln_f.weight"])  # trained


def test_lora_finetune_resumes_and_samples_merged(tmp_path, data_root):
    root, data_overrides = data_root
    base = _char_overrides(root, data_overrides)
    train(compose(base, tmp_path / "pretrain"))
    lora = [*base, f"init_from={tmp_path / 'pretrain'}", "finetune.lora_rank=2", "optim.lr=1e-2", "optim.decay_iters=8"]
    train(compose([*lora, "train.max_iters=6"], tmp_path / "ft"))
    train(compose([*lora, "train.max_iters=8"], tmp_path / "ft"))  # resumes the adapters
    step_ckpt = checkpoint.load(runs.latest(tmp_path / "ft"))
    assert step_ckpt.step == 8 and any(".lora_A" in k for k in step_ckpt.model) and step_ckpt.lora["rank"] == 2
    best = checkpoint.load(tmp_path / "ft" / "checkpoints" / "best.pt")
    assert not any(".lora_" in k for k in best.model) and best.lora is None  # merged for sampling and export
    merged = loading.load(str(runs.latest(tmp_path / "ft"))).model  # adapters folded in on load
    unmerged = registry.build(registry.config_from_dict(step_ckpt.model_config)).eval()
    apply_lora(unmerged, step_ckpt.lora["rank"], step_ckpt.lora["alpha"])
    unmerged.load_state_dict(step_ckpt.model)
    idx = torch.randint(0, 10, (1, 8))
    with torch.no_grad():
        assert torch.allclose(merged(idx)[0], unmerged(idx)[0], atol=1e-5)
    assert loading.load(str(tmp_path / "ft")).checkpoint.lora is None  # best.pt: a plain model


def test_tokenizer_mismatch_and_missing_base(tmp_path, data_root):
    root, data_overrides = data_root
    base = _char_overrides(root, data_overrides)
    train(compose(base, tmp_path / "pretrain"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(6):
        (corpus / f"{i}.txt").write_text("some bytes of text to train on, long enough for a window " * 3)
    byte_data = [
        "debug=tiny",
        "data=local",
        f"data.source.path={corpus}",
        "data.name=bytes",
        "data.tokenizer.kind=byte",
        f"paths.data_dir={root}",
        "train.max_iters=2",
    ]
    with pytest.raises(TinyGPTError, match="another tokenizer than the data's .*its char vocabulary was fitted to the corpus"):
        train(compose([*byte_data, f"init_from={tmp_path / 'pretrain'}"], tmp_path / "x"))
    # a byte-level base (the quickstart's) and data of another tokenizer: the error names the
    # setting that gives the data the base's, and with it the finetune trains
    train(compose(byte_data, tmp_path / "byte_base"))
    char_data = [*byte_data, "data.tokenizer.kind=char", "data.name=chars", f"init_from={tmp_path / 'byte_base'}", "optim=adamw"]
    with pytest.raises(TinyGPTError, match="pass data.tokenizer.kind=byte$"):
        train(compose(char_data, tmp_path / "ft"))
    assert train(compose([*char_data, "data.tokenizer.kind=byte", "data.name=bytes"], tmp_path / "ft"))["step"] == 2
    with pytest.raises(TinyGPTError, match="init_from=/nowhere"):
        train(compose([*base, "init_from=/nowhere"], tmp_path / "y"))
    with pytest.raises(TinyGPTError, match="needs a model to start from"):
        train(compose([*base, "experiment=finetune_char"], tmp_path / "z"))


def test_lora_run_resumes_with_its_adapters_without_repeating_the_flag(tmp_path, data_root):
    root, data_overrides = data_root
    base = _char_overrides(root, data_overrides)
    train(compose(base, tmp_path / "pretrain"))
    lora = [*base, f"init_from={tmp_path / 'pretrain'}", "optim.decay_iters=8"]
    train(compose([*lora, "finetune.lora_rank=2", "train.max_iters=6"], tmp_path / "ft"))
    train(compose([*lora, "train.max_iters=8"], tmp_path / "ft"))  # no lora_rank given: taken from the checkpoint
    assert checkpoint.load(runs.latest(tmp_path / "ft")).lora["rank"] == 2
    with pytest.raises(TinyGPTError, match="lora_rank=2"):
        train(compose([*lora, "finetune.lora_rank=4", "train.max_iters=10"], tmp_path / "ft"))


def test_a_rotary_base_finetunes_at_a_longer_context_and_a_learned_one_is_refused(tmp_path, data_root, caplog):
    """finetune.block_size beyond the base's context: rotary positions reach any length, so the
    same weights see the longer windows (their logits over the base's own context unchanged);
    a learned position table has no rows there: one line, nothing trained."""
    root, data_overrides = data_root
    base = [*_char_overrides(root, data_overrides), "model.pos_encoding=rope"]
    train(compose(base, tmp_path / "base"))
    ft = ["debug=tiny", *data_overrides, f"paths.data_dir={root}", "train.max_iters=2", "train.sample_tokens=0"]
    ft += ["data=shakespeare_char", f"init_from={tmp_path / 'base'}", "finetune.block_size=32", "optim=adamw"]
    summary = train(compose(ft, tmp_path / "long"))
    before, after = loading.load(str(tmp_path / "base")).model, loading.load(str(tmp_path / "long")).model
    assert (before.config.block_size, after.config.block_size) == (16, 32) and summary["status"] == "finished"
    fresh = registry.build(before.config.changed(block_size=32)).eval()  # the base's weights at the longer context
    fresh.load_state_dict(before.state_dict())
    idx = torch.randint(0, before.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(fresh(idx)[0], before.eval()(idx)[0])
        assert fresh(torch.randint(0, before.config.vocab_size, (1, 32)))[0].shape[1] == 32
    train(compose(_char_overrides(root, data_overrides), tmp_path / "learned"))
    with pytest.raises(TinyGPTError, match="finetune.block_size=32 is longer than .* learned position table"):
        train(compose([*ft[:-3], f"init_from={tmp_path / 'learned'}", "finetune.block_size=32"], tmp_path / "refused"))
    # finetune.min_block_size (experiment=sft's 256): extends the rotary base, keeps the learned one, says so
    at_least = [*ft[:-3], "finetune.min_block_size=40", "optim=adamw"]
    train(compose([*at_least, f"init_from={tmp_path / 'base'}"], tmp_path / "min-rope"))
    assert loading.load(str(tmp_path / "min-rope")).model.config.block_size == 40
    with caplog.at_level("INFO", logger="tinygpt"):
        train(compose([*at_least, f"init_from={tmp_path / 'learned'}"], tmp_path / "min-learned"))
    assert loading.load(str(tmp_path / "min-learned")).model.config.block_size == 16
    assert "context kept at 16 (finetune.min_block_size=40)" in caplog.text


def test_a_finetune_names_only_the_model_settings_the_command_line_gave(tmp_path, data_root, caplog):
    """The settings a finetune keeps are its base's (and its context the one it was extended to):
    a notice names only the model settings the command line gave that it ignores, at the start
    and at a resume, never the defaults' values nor what the finetune made (found by a review:
    resuming a LoRA chat finetune 'ignored model.block_size=64 (checkpoint: 256)', never given).
    model.dropout and model.activation_checkpointing change no weight: they apply."""
    root, data_overrides = data_root
    base = [*_char_overrides(root, data_overrides), "model.pos_encoding=rope", "model.n_layer=2"]
    train(compose(base, tmp_path / "base"))
    ft = [*_char_overrides(root, data_overrides, steps=2), "model.pos_encoding=rope", f"init_from={tmp_path / 'base'}"]
    ft += ["finetune.lora_rank=2", "finetune.min_block_size=40", "optim=adamw"]  # context 16 -> 40, as sft's 64 -> 256
    run_dir = tmp_path / "ft"
    with caplog.at_level("INFO", logger="tinygpt"):
        train(compose(ft, run_dir), overrides=ft)  # what the command line passes on (gpt.apps.train)
        longer = [*ft, "train.max_iters=3"]
        train(compose(longer, run_dir), overrides=longer)  # resumed by its run folder
    assert "ignoring" not in caplog.text and "resuming from" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="tinygpt"):
        deeper = [*ft, "train.max_iters=4", "model.n_layer=3"]
        train(compose(deeper, run_dir), overrides=deeper)
    assert "ignoring model.n_layer=3 (checkpoint: 2)\n" in caplog.text, caplog.text
    caplog.clear()
    given = [*ft, "model.n_layer=8", "model.dropout=0.1", "model.activation_checkpointing=true"]
    with caplog.at_level("INFO", logger="tinygpt"):
        run = build_run(compose(given, tmp_path / "new"), overrides=given)
    assert "; ignoring model.n_layer=8 (the finetune's: 2)\n" in caplog.text, caplog.text
    caplog.clear()  # the context the finetune extended to (16 -> 40), not the base's, and what sets it
    with caplog.at_level("INFO", logger="tinygpt"):
        build_run(compose([*ft, "model.block_size=64"], tmp_path / "new2"), overrides=[*ft, "model.block_size=64"])
    assert "(its context: finetune.block_size); ignoring model.block_size=64 (the finetune's: 40)\n" in caplog.text
    assert run.model_config.activation_checkpointing and run.model_config.dropout == 0.1 and run.model_config.n_layer == 2
