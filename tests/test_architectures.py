"""gpt/model/registry.py: the settings of every model family convert to its model's config (the
schemas and the model configs cannot drift apart), and every architecture trains, resumes and
samples through the entry points. Run: pytest tests/test_architectures.py"""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

from gpt.checkpoints import checkpoint
from gpt.config import GPTSettings, RNNSettings
from gpt.errors import TinyGPTError
from gpt.model import GPTConfig, registry
from gpt.model.rnn import RNNConfig
from helpers import run_script


@pytest.mark.parametrize("settings, config", [(GPTSettings, GPTConfig), (RNNSettings, RNNConfig)])
def test_settings_and_model_config_have_the_same_fields_and_defaults(settings, config):
    """The model section's schema (gpt/config/__init__.py) and the model's own config (gpt/model/config.py,
    gpt/model/rnn.py) are two classes by design (the model knows nothing of Hydra, and composing a
    config needs no torch); this keeps them one definition in effect."""
    # (the label, and the size knob that sets n_layer / n_head / n_embd at the boundary)
    ours = {f.name: f.default for f in fields(settings) if f.name not in ("name", "depth", "aspect_ratio")}
    theirs = {f.name: f.default for f in fields(config)}
    if config is GPTConfig:
        theirs["arch"] = "gpt"  # implied: GPTConfig is the "gpt" family
    assert set(ours) == set(theirs)
    # The settings leave the vocabulary to the tokenizer, and a recurrent preset must name its cell.
    free = {"vocab_size": None, "arch": "???"} if config is RNNConfig else {"vocab_size": None}
    assert {k: v for k, v in ours.items() if k not in free} == {k: v for k, v in theirs.items() if k not in free}
    assert all(ours[k] == v for k, v in free.items())
    assert all(f.default is not MISSING for f in fields(config))


def test_conversion_takes_the_vocabulary_and_checks_the_shape():
    config = registry.config_from_settings(GPTSettings(n_layer=2), vocab_size=65)
    assert isinstance(config, GPTConfig) and config.vocab_size == 65 and config.n_layer == 2
    lstm = registry.config_from_settings(RNNSettings(arch="lstm", n_hidden=32), vocab_size=10)
    assert isinstance(lstm, RNNConfig) and lstm.n_hidden == 32
    with pytest.raises(TinyGPTError, match="n_embd=30 is not divisible by model.n_head=4"):
        registry.config_from_settings(GPTSettings(n_embd=30), vocab_size=65)
    with pytest.raises(TinyGPTError, match="model.arch='transformer' is unknown"):
        registry.config_from_settings(GPTSettings(arch="transformer"), vocab_size=65)


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
    assert checkpoint.load(checkpoint.latest(run_dir)).step == 8
    sample = run_script(
        "sample.py", [f"run_dir={run_dir}", "num_samples=2", "max_new_tokens=40", "prompt=ROMEO:"], tmp_path, root
    )
    assert sample.returncode == 0, sample.stderr[-2000:]
    assert sample.stdout.count("ROMEO:") == 2
