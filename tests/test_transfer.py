"""Transfer learning: GPT-2 weights in (Hugging Face format), export back, finetuning from an
initial model (freezing, LoRA), evaluation. Run: pytest tests/test_transfer.py"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from conftest import REPO, TINY_RUN, compose  # noqa: E402
from gpt import checkpoint  # noqa: E402
from gpt.errors import TinyGPTError  # noqa: E402
from gpt.lora import apply_lora, merge_lora, merged_state_dict  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.pretrained import export_hf, load_hf_gpt2, load_initial  # noqa: E402
from gpt.tokenizer import CharTokenizer, TiktokenTokenizer, tokenizer_from_dict  # noqa: E402
from gpt.trainer import train  # noqa: E402


def _random_hf(vocab=64, activation="gelu_new") -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_positions=16, n_embd=32, n_layer=2, n_head=4, activation_function=activation,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial biases and norms, so a transposition mistake shows
        for name, p in model.named_parameters():
            if "bias" in name or "ln_" in name:
                p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("safetensors", [True, False])
def test_hf_gpt2_loads_with_identical_logits(tmp_path, safetensors):
    hf = _random_hf()
    hf.save_pretrained(tmp_path, safe_serialization=safetensors)
    ours, tokenizer = load_hf_gpt2(str(tmp_path))
    assert tokenizer is None  # a 64-token vocabulary is not GPT-2's
    assert ours.config.activation == "gelu_tanh" and ours.config.n_head == 4
    idx = torch.randint(0, 64, (3, 16))
    with torch.no_grad():
        diff = (ours.eval()(idx)[0] - hf(idx).logits).abs().max().item()
    assert diff <= 1e-5


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_export_loads_in_transformers_with_identical_logits(tmp_path, activation):
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32, activation=activation)).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "bias" in name:
                p.normal_(0, 0.1)
    export_hf(ours, CharTokenizer([chr(32 + i) for i in range(65)]), tmp_path)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    idx = torch.randint(0, 65, (3, 16))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
    back, tokenizer = load_hf_gpt2(str(tmp_path))  # our own export comes back with its tokenizer
    assert tokenizer["kind"] == "char" and torch.equal(back(idx)[0], ours(idx)[0])


def test_gpt2_tokenizer_files_match_tiktoken(tmp_path, gpt2_ranks):
    if gpt2_ranks is None:
        pytest.skip("GPT-2's ranks file is not in ../shared")
    from transformers import GPT2Tokenizer

    tok = TiktokenTokenizer("gpt2")
    export_hf(GPT(GPTConfig(vocab_size=50257, block_size=8, n_layer=1, n_head=1, n_embd=8)), tok, tmp_path)
    hf_tok = GPT2Tokenizer.from_pretrained(tmp_path)
    text = "Hello world! To be, or not to be: that is the question.\n  Ünïcödé 日本語 🦜 1234"
    assert hf_tok.encode(text) == tok.encode(text)
    assert hf_tok.eos_token_id == 50256


def test_export_refuses_what_gpt2_cannot_hold(tmp_path):
    rope = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8, pos_encoding="rope"))
    with pytest.raises(TinyGPTError, match="learned positions"):
        export_hf(rope, CharTokenizer(list("abcdefghijklmnop")), tmp_path)


def test_lora_merged_equals_unmerged():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)).eval()
    assert apply_lora(model, rank=4, alpha=8.0) == 8  # c_attn, c_proj, c_fc, c_proj per block
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".lora_" in n}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B" in n:
                p.normal_(0, 0.5)  # a trained adapter is not zero
    idx = torch.randint(0, 32, (2, 8))
    with torch.no_grad():
        unmerged = model(idx)[0]
        plain = GPT(model.config).eval()
        plain.load_state_dict(merged_state_dict(model))
        merged = merge_lora(model)(idx)[0]
    assert (unmerged - merged).abs().max().item() < 1e-5
    assert (unmerged - plain(idx)[0]).abs().max().item() < 1e-5
    assert not any(".lora_" in n for n, _ in model.named_parameters())


def _char_overrides(root, data_overrides, steps=6):
    return [*TINY_RUN, *data_overrides, f"paths.data_dir={root}", f"train.max_iters={steps}", "train.eval_interval=3",
            "train.sample_tokens=0"]


def test_finetune_from_an_exported_then_reimported_model(tmp_path, data_root):
    root, data_overrides = data_root
    base = _char_overrides(root, data_overrides)
    train(compose(base, tmp_path / "pretrain"))
    model, tokenizer = load_initial(str(tmp_path / "pretrain"), dropout=0.0)
    export_hf(model, tokenizer_from_dict(tokenizer), tmp_path / "hf")

    losses = []
    train(compose([*base, f"init_from={tmp_path / 'hf'}", "finetune.freeze_layers=1", "finetune.freeze_embeddings=true",
                   "optim.lr=1e-3"], tmp_path / "finetune"), on_step=lambda s, l: losses.append(l))
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    tuned = checkpoint.load(checkpoint.latest(tmp_path / "finetune"))["model"]
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
    step_ckpt = checkpoint.load(checkpoint.latest(tmp_path / "ft"))
    assert step_ckpt["step"] == 8 and any(".lora_A" in k for k in step_ckpt["model"]) and step_ckpt["lora"]["rank"] == 2
    best = checkpoint.load(tmp_path / "ft" / "checkpoints" / "best.pt")
    assert not any(".lora_" in k for k in best["model"])  # merged for sampling and export
    from gpt.sampling import load_model

    a, _, _ = load_model(checkpoint.latest(tmp_path / "ft"), torch.device("cpu"))
    idx = torch.randint(0, 10, (1, 8))
    assert torch.isfinite(a(idx)[0]).all()


def test_tokenizer_mismatch_and_missing_base(tmp_path, data_root):
    root, data_overrides = data_root
    base = _char_overrides(root, data_overrides)
    train(compose(base, tmp_path / "pretrain"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(6):
        (corpus / f"{i}.txt").write_text("some bytes of text to train on, long enough for a window " * 3)
    byte_data = [*TINY_RUN, "data=local", f"data.source.path={corpus}", "data.name=bytes", "data.tokenizer.kind=byte",
                 f"paths.data_dir={root}", "train.max_iters=2"]
    with pytest.raises(TinyGPTError, match="tokenizer"):
        train(compose([*byte_data, f"init_from={tmp_path / 'pretrain'}"], tmp_path / "x"))
    with pytest.raises(TinyGPTError, match="init_from=/nowhere"):
        train(compose([*base, "init_from=/nowhere"], tmp_path / "y"))
    with pytest.raises(TinyGPTError, match="needs a model to start from"):
        train(compose([*base, "experiment=finetune_char"], tmp_path / "z"))


def test_offline_gpt2_download_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(TinyGPTError, match="cannot download gpt2.*config.json"):
        load_hf_gpt2("gpt2")


def test_eval_command_reports_loss_perplexity_and_bits_per_byte(tmp_path, data_root):
    root, data_overrides = data_root
    train(compose(_char_overrides(root, data_overrides), tmp_path / "run"))
    text = tmp_path / "eval.txt"
    text.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 20)
    proc = subprocess.run([sys.executable, "-m", "gpt.eval", f"run_dir={tmp_path / 'run'}", f"text_file={text}"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    loss = float(line.split("loss ")[1].split(",")[0])
    ppl = float(line.split("perplexity ")[1].split(",")[0])
    bpb = float(line.split("bits per byte ")[1])
    assert abs(ppl - math.exp(loss)) / ppl < 1e-3
    assert abs(bpb - loss / math.log(2)) < 1e-3  # ASCII text, one char = one token = one byte
    # no run named: the newest run under runs_dir
    split = subprocess.run([sys.executable, "-m", "gpt.eval", f"runs_dir={tmp_path}", "max_tokens=2000"],
                           cwd=REPO, capture_output=True, text=True, env={**os.environ, "TINYGPT_DATA_DIR": str(root)})
    assert split.returncode == 0, split.stderr
    assert "shakespeare_char val: 2,000 tokens" in split.stdout  # 2001 tokens -> 125 windows of 16 targets


def test_sample_py_from_an_exported_model(tmp_path, data_root):
    root, data_overrides = data_root
    train(compose(_char_overrides(root, data_overrides), tmp_path / "run"))
    model, tokenizer = load_initial(str(tmp_path / "run"), dropout=0.0)
    export_hf(model, tokenizer_from_dict(tokenizer), tmp_path / "hf")
    proc = subprocess.run([sys.executable, str(REPO / "sample.py"), f"init_from={tmp_path / 'hf'}", "num_samples=1",
                           "max_new_tokens=20", "prompt=ROMEO:"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "ROMEO:" in proc.stdout and str(tmp_path / "hf") in proc.stderr


def test_export_command(tmp_path, data_root):
    root, data_overrides = data_root
    train(compose(_char_overrides(root, data_overrides), tmp_path / "run"))
    proc = subprocess.run([sys.executable, "-m", "gpt.export", f"runs_dir={tmp_path}", f"out={tmp_path / 'hf'}"],
                          cwd=REPO, capture_output=True, text=True)  # the newest run under runs_dir
    assert f"exported {tmp_path / 'run' / 'checkpoints'}" in proc.stdout, proc.stderr
    assert proc.returncode == 0, proc.stderr
    ours, _ = load_initial(str(tmp_path / "run"), dropout=0.0)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, ours.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert (ours.eval()(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
    bad = subprocess.run([sys.executable, "-m", "gpt.export", f"run_dir={tmp_path / 'nope'}", "out=x"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


def test_hub_layout_with_unprefixed_keys_and_mask_buffers(tmp_path):
    """The files on the Hub for gpt2 predate transformers' current layout: keys without the
    `transformer.` prefix, attention-mask buffers, pytorch_model.bin."""
    hf = _random_hf()
    state = {}
    for key, value in hf.state_dict().items():
        if key == "lm_head.weight":
            continue
        state[key.removeprefix("transformer.")] = value
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 16, 16))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    hf.config.to_json_file(tmp_path / "config.json")
    ours, _ = load_hf_gpt2(str(tmp_path))
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        assert (ours.eval()(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5


def test_lora_run_resumes_with_its_adapters_without_repeating_the_flag(tmp_path, data_root):
    root, data_overrides = data_root
    base = _char_overrides(root, data_overrides)
    train(compose(base, tmp_path / "pretrain"))
    lora = [*base, f"init_from={tmp_path / 'pretrain'}", "optim.decay_iters=8"]
    train(compose([*lora, "finetune.lora_rank=2", "train.max_iters=6"], tmp_path / "ft"))
    train(compose([*lora, "train.max_iters=8"], tmp_path / "ft"))  # no lora_rank given: taken from the checkpoint
    assert checkpoint.load(checkpoint.latest(tmp_path / "ft"))["lora"]["rank"] == 2
    with pytest.raises(TinyGPTError, match="lora_rank=2"):
        train(compose([*lora, "finetune.lora_rank=4", "train.max_iters=10"], tmp_path / "ft"))
