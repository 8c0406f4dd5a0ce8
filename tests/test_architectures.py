"""gpt/config/model.py and gpt/model/registry.py: one config per model family, the settings and the
model's own at once; every architecture trains, resumes and samples through the entry points. Run: pytest tests/test_architectures.py"""

from __future__ import annotations

import pytest

from gpt.checkpoints import checkpoint, runs
from gpt.config import RNNConfig
from gpt.errors import TinyGPTError
from gpt.model import GPTConfig, registry
from helpers import run_script


def test_the_model_section_is_the_models_own_config():
    """The model's shape is declared once (gpt/config/model.py): the class Hydra composes the
    `model` section into is the one the model is built from, its derived values resolved once,
    under their own names; the vocabulary is the tokenizer's until set."""
    from gpt.apps.common import compose
    from gpt.model import GPT

    settings = compose("config", ["model=gpt-micro"]).model
    assert type(settings) is GPTConfig and settings.vocab_size is None and settings.name == "gpt-micro"
    assert (settings.n_kv_head, settings.head_dim, settings.mlp_hidden, settings.qkv_bias) == (4, 32, 512, True)
    assert type(compose("config", ["model=lstm"]).model) is RNNConfig
    qwen_like = GPTConfig(n_embd=576, n_head=9, n_kv_head=3, mlp="swiglu", bias=False, qkv_bias=True)
    assert (qwen_like.mlp_hidden, qwen_like.head_dim, qwen_like.n_kv_head, qwen_like.qkv_bias) == (1536, 64, 3, True)
    assert (GPTConfig(bias=False).qkv_bias, GPTConfig(n_embd=96, n_head=3, head_dim=16).head_dim) == (False, 16)
    deep = GPTConfig(depth=6, aspect_ratio=32)
    assert (deep.n_layer, deep.n_head, deep.n_embd, deep.head_dim, deep.mlp_hidden) == (6, 6, 192, 32, 768)
    # resolved once: a config rebuilt from its own record (a checkpoint's) is itself
    assert GPTConfig.from_dict(qwen_like.to_dict()) == qwen_like and GPTConfig.from_dict(deep.to_dict()) == deep
    with pytest.raises(TinyGPTError, match="vocab_size is null"):
        GPT(GPTConfig())
    with pytest.raises(TinyGPTError, match="unknown model setting.*model.n_heads"):
        GPTConfig.from_dict({"n_heads": 4})


def test_the_vocabulary_comes_from_the_tokenizer_and_the_shape_is_checked():
    config = registry.with_vocab(GPTConfig(n_layer=2), 65)
    assert isinstance(config, GPTConfig) and config.vocab_size == 65 and config.n_layer == 2
    lstm = registry.with_vocab(RNNConfig(arch="lstm", n_hidden=32), 10)
    assert isinstance(lstm, RNNConfig) and lstm.n_hidden == 32 and lstm.vocab_size == 10
    assert registry.with_vocab(GPTConfig(vocab_size=80), 65).vocab_size == 80  # a larger table holds the tokenizer's
    with pytest.raises(TinyGPTError, match="model.vocab_size=50 is smaller than the tokenizer's 65 tokens"):
        registry.with_vocab(GPTConfig(vocab_size=50), 65)
    with pytest.raises(TinyGPTError, match="n_embd=30 is not divisible by model.n_head=4"):
        GPTConfig(n_embd=30)
    with pytest.raises(TinyGPTError, match="model.arch='transformer' is not a GPT"):
        GPTConfig(arch="transformer")
    with pytest.raises(TinyGPTError, match="model.arch='transformer' is unknown"):
        registry.config_from_dict({"arch": "transformer"})


@pytest.mark.parametrize(
    "given, hints",
    [
        # RoPE turns its heads' channels in pairs: 20 (heads 4 wide), not 25 (5 wide, which RoPE refused)
        (["model=llama-nano", "model.n_head=5"], ["model.n_embd=20"]),
        (["model=llama-nano", "model.n_head=5", "model.n_embd=25"], ["model.n_embd=20"]),  # RoPE's own refusal
        (["model.n_head=5"], ["model.n_embd=25"]),  # gpt-nano's learned positions: any multiple
        # the key/value heads first, as no n_embd mends them (25 was told, then n_kv_head refused)
        (["model.n_head=5", "model.n_kv_head=2"], ["model.n_kv_head=1", "model.n_embd=25"]),
        (["model=llama-nano", "model.n_head=10", "model.n_kv_head=4"], ["model.n_kv_head=5", "model.n_embd=20"]),
    ],
)
def test_a_shape_refusal_suggests_a_value_the_run_takes(tmp_path, data_root, given, hints):
    """A user follows each refusal's 'e.g.' as typed: every one is taken, and the run trains."""
    import re

    root, data_overrides = data_root
    args, told = ["debug=tiny", "train.max_iters=2", "train.sample_tokens=0", *data_overrides, *given], []
    for _ in range(len(hints) + 1):
        proc = run_script("train.py", [*args, f"hydra.run.dir={tmp_path / str(len(told))}"], tmp_path, root)
        if proc.returncode == 0 or len(told) > len(hints):
            break
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
        hint = re.search(r"\(e\.g\. (model\.\w+=\d+)\)", proc.stderr)
        assert hint is not None, proc.stderr
        told.append(hint.group(1))
        args.append(hint.group(1))
    assert (proc.returncode, told) == (0, hints), proc.stderr[-2000:]


ARCH_RUNS = {
    "lstm": ["debug=tiny", "model=lstm", "model.n_hidden=16"],
    "gru": ["debug=tiny", "model=gru", "model.n_hidden=16"],
    "rnn": ["debug=tiny", "model=rnn", "model.n_hidden=16"],
    "gpt-rope-gqa": ["debug=tiny", "model.pos_encoding=rope", "model.n_kv_head=1"],
    "gpt-sinusoidal-manual": ["debug=tiny", "model.pos_encoding=sinusoidal", "model.attention=manual"],
    "gpt-no-positions": ["debug=tiny", "model.pos_encoding=none"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ARCH_RUNS))
def test_architecture_trains_resumes_and_samples(name, tmp_path, data_root):
    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    common = [
        *ARCH_RUNS[name],
        *data_overrides,
        "train.batch_size=4",
        "train.eval_iters=2",
        "train.eval_interval=4",
        "train.log_interval=2",
        "train.sample_tokens=10",
        f"hydra.run.dir={run_dir}",
    ]
    first = run_script("train.py", [*common, "train.max_iters=4", "optim.decay_iters=8"], tmp_path, root)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_script("train.py", [*common, "train.max_iters=8", "optim.decay_iters=8"], tmp_path, root)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from" in again.stdout and "at step 4" in again.stdout
    assert checkpoint.load(runs.latest(run_dir)).step == 8
    sample = run_script(
        "sample.py", [f"run_dir={run_dir}", "num_samples=2", "max_new_tokens=40", "prompt=ROMEO:"], tmp_path, root
    )
    assert sample.returncode == 0, sample.stderr[-2000:]
    assert sample.stdout.count("ROMEO:") == 2
