"""Every YAML in configs/ composes with Hydra's compose API; presets and experiments say what
they should. Run: pytest tests/test_configs.py"""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import REPO
from gpt.architectures import config_from_dict
from gpt.config import optim_settings, train_settings
from gpt.model import GPT, GPTConfig
from gpt.optim import CosineSchedule

CONFIGS = REPO / "configs"


def _compose(name: str, overrides: list[str], tmp_path) -> dict:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name=name, overrides=[f"paths.output_dir={tmp_path}", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["model", "data", "optim", "paths", "experiment"])
def test_every_option_composes(group, tmp_path):
    for option in _options(group):
        cfg = _compose("config", [f"{group}={option}"], tmp_path)
        train_settings(cfg)  # validates the train section
        CosineSchedule.from_settings(optim_settings(cfg))
        config_from_dict({**cfg["model"], "vocab_size": cfg["model"]["vocab_size"] or 65})


def test_sample_config_composes(tmp_path):
    cfg = _compose("sample", [], tmp_path)
    assert cfg["temperature"] == 0.8 and cfg["run_dir"] is None


def test_quickstart_defaults(tmp_path):
    cfg = _compose("config", [], tmp_path)
    m, t = cfg["model"], cfg["train"]
    assert (m["n_layer"], m["n_head"], m["n_embd"], m["block_size"], m["dropout"]) == (4, 4, 128, 64, 0.0)
    assert (t["batch_size"], t["max_iters"]) == (12, 2000)
    assert cfg["optim"]["decay_iters"] == 2000 and cfg["data"]["name"] == "shakespeare_char"


def test_shakespeare_char_experiment_is_the_baby_gpt(tmp_path):
    cfg = _compose("config", ["experiment=shakespeare_char"], tmp_path)
    m, t = cfg["model"], cfg["train"]
    assert (m["n_layer"], m["n_head"], m["n_embd"], m["block_size"], m["dropout"]) == (6, 6, 384, 256, 0.2)
    assert (t["batch_size"], t["max_iters"], cfg["optim"]["lr"]) == (64, 5000, 1e-3)
    assert cfg["optim"]["decay_iters"] == 5000  # the schedule follows the experiment's length


def test_data_dir_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYGPT_DATA_DIR", str(tmp_path / "elsewhere"))
    assert _compose("config", [], tmp_path)["paths"]["data_dir"] == str(tmp_path / "elsewhere")
    monkeypatch.delenv("TINYGPT_DATA_DIR")
    assert _compose("config", [], tmp_path)["paths"]["data_dir"] == "~/.cache/tinygpt"


def test_gpt2_preset_has_124m_parameters(tmp_path):
    cfg = _compose("config", ["model=gpt2"], tmp_path)
    with torch.device("meta"):  # shapes only: no memory, no init time
        model = GPT(GPTConfig.from_dict(cfg["model"]))
    assert model.config.vocab_size == 50257
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.num_params() == 124_439_808
