"""gpt/config/ and configs/: every setting has one typed schema and one default. Every group
option composes onto its schema, no YAML file restates a default, and settings built in Python
are checked like composed ones. Run: pytest tests/test_config.py"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, fields

import pytest
import torch
import yaml

from gpt.apps.common import compose, config_dir
from gpt.config import (
    AdamWSettings,
    DataSettings,
    FinetuneSettings,
    GPTConfig,
    MuonSettings,
    PathsSettings,
    RNNConfig,
    RunConfig,
    SampleConfig,
    SamplingSettings,
    TaskSettings,
    TrainSettings,
    from_dict,
)
from gpt.errors import TinyGPTError
from gpt.model import GPT, registry
from gpt.training.optim import CosineSchedule

CONFIGS = config_dir()
GROUPS = ("model", "data", "optim", "experiment", "debug")


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def _yaml(path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _lookup(obj, dotted: str):
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_onto_its_schema(group):
    for option in _options(group):
        extra = ["data.source.path=corpus"] if option == "local" else []
        settings = compose("config", [f"{group}={option}", *extra])
        assert isinstance(settings, RunConfig) and isinstance(settings.data, DataSettings)
        assert type(settings.model) in (GPTConfig, RNNConfig) and type(settings.optim) in (AdamWSettings, MuonSettings)
        CosineSchedule.from_settings(settings.optim, settings.train.max_iters)
        registry.with_vocab(settings.model, 65)


def test_every_task_composes_onto_its_schema():
    for option in _options("task"):
        task = compose("eval", [f"task={option}"]).task
        assert isinstance(task, TaskSettings) and task.name == option


def test_the_other_commands_compose():
    assert compose("sample", []).temperature == SamplingSettings().temperature
    assert compose("eval", []).data is None and compose("eval", ["data=shakespeare"]).data.name == "shakespeare"
    assert compose("export", ["out=x"]).out == "x" and compose("sweep", ["dir=y"]).dir == "y"
    from gpt.config import ChatConfig

    assert compose("chat", []) == ChatConfig() and compose("chat", ["temperature=0"]).temperature == 0


@pytest.mark.parametrize("group", ("model", "data", "optim", "task"))
def test_no_group_option_restates_a_default(group):
    """A value in a group file must differ from what its schema (or the file it extends) gives:
    a default lives in gpt/config/ only, so the two cannot drift apart."""
    from omegaconf import OmegaConf

    for option in _options(group):
        raw = _yaml(CONFIGS / group / f"{option}.yaml")
        bases = [d for d in raw.pop("defaults", []) if isinstance(d, str) and d != "_self_"]
        if group in ("data", "task"):  # typed by their field's class; a data file may extend another one
            base = OmegaConf.structured(DataSettings if group == "data" else TaskSettings)
            for parent in bases:
                base = OmegaConf.merge(base, _yaml(CONFIGS / group / f"{parent}.yaml"))
        else:
            schema = {
                "schema_gpt": GPTConfig,
                "schema_rnn": RNNConfig,
                "schema_adamw": AdamWSettings,
                "schema_muon": MuonSettings,
            }[bases[0]]
            base = OmegaConf.structured(schema)
        for key, value in _leaves(raw).items():
            section = key.rpartition(".")[0]
            if section and OmegaConf.is_missing(base, section):
                continue  # a required section (data.source): no default to restate
            assert OmegaConf.select(base, key, throw_on_missing=False) != value, f"{group}/{option}.yaml restates {key}: {value}"


@pytest.mark.parametrize("group", ("experiment", "debug"))
def test_no_global_option_restates_what_it_changes(group):
    """An experiment holds deltas only: each value differs from the config it modifies (with the
    groups it selects, e.g. `override /optim: adamw`, already applied)."""
    for option in _options(group):
        raw = _yaml(CONFIGS / group / f"{option}.yaml")
        picks = [f"{k.split()[-1].lstrip('/')}={v}" for d in raw.pop("defaults", []) if isinstance(d, dict) for k, v in d.items()]
        raw.pop("hydra", None)  # the sweeper's settings: Hydra's, not ours
        base = asdict(compose("config", picks))
        for key, value in _leaves(raw).items():
            assert _lookup(base, key) != value, f"{group}/{option}.yaml restates {key}: {value}"


def test_root_configs_only_pick_groups():
    for path in CONFIGS.glob("*.yaml"):
        assert set(_yaml(path)) == {"defaults"}, f"{path.name}: settings belong in gpt/config/"


def test_the_default_config_is_the_schema_defaults():
    settings = compose("config", [])
    assert settings.train == TrainSettings() and settings.finetune == FinetuneSettings() and settings.paths == PathsSettings()
    assert settings.optim == MuonSettings() and compose("config", ["model=gpt-micro"]).model == GPTConfig(name="gpt-micro")
    modern = GPTConfig(name="gpt-micro-modern", norm="rmsnorm", pos_encoding="rope", qk_norm=True, bias=False)
    assert settings.model == modern  # the quickstart's preset: the defaults with today's block
    assert compose("config", ["optim=adamw"]).optim == AdamWSettings()
    assert {
        f.name: getattr(settings, f.name)
        for f in fields(RunConfig)
        if f.name not in ("model", "data", "optim", "train", "finetune", "paths")
    } == {
        "seed": 1337,
        "resume": "auto",
        "init_from": None,
        "device": "auto",
        "dtype": "auto",
        "compile": "auto",
        "threads": None,
        "distributed": "ddp",
        "cpu_offload": False,
    }
    assert compose("sample", []) == SampleConfig()


def test_quickstart_defaults():
    s = compose("config", [])
    assert (s.model.n_layer, s.model.n_head, s.model.n_embd, s.model.block_size, s.model.dropout) == (4, 4, 128, 64, 0.0)
    assert (s.train.batch_size, s.train.max_iters) == (12, 2000) and s.data.name == "shakespeare_bytes"
    assert s.data.tokenizer.kind == "byte" and s.data.source.filename == "tinyshakespeare/input.txt"
    assert CosineSchedule.from_settings(s.optim, s.train.max_iters).decay_iters == 2000


def test_shakespeare_char_experiment_is_the_baby_gpt():
    s = compose("config", ["experiment=shakespeare_char"])
    assert (s.model.n_layer, s.model.n_head, s.model.n_embd, s.model.block_size, s.model.dropout) == (6, 6, 384, 256, 0.2)
    assert (s.train.batch_size, s.train.max_iters, s.optim.lr, s.optim.name) == (64, 5000, 1e-3, "adamw")
    assert CosineSchedule.from_settings(s.optim, s.train.max_iters).decay_iters == 5000  # follows the experiment's length


def test_debug_tiny_is_a_tiny_run():
    s = compose("config", ["debug=tiny"])
    assert (s.model.name, s.model.n_layer, s.model.n_embd, s.model.block_size) == ("gpt-nano", 1, 24, 16)
    assert (s.train.max_iters, s.train.batch_size, s.train.eval_interval) == (20, 4, 10)
    lstm = compose("config", ["debug=tiny", "model=lstm"]).model  # the same shrinking for every family
    assert (lstm.arch, lstm.n_layer, lstm.n_embd, lstm.block_size) == ("lstm", 1, 24, 16)


@pytest.mark.parametrize(
    "overrides, told",
    [
        (["model=gru", "model.attention=manual"], "model.attention is a GPT setting; model=gru has none"),
        (["model=lstm", "model.n_head=2"], "model.n_head is a GPT setting; model=lstm has none"),
        (["model=gpt-micro", "model.n_hidden=64"], "model.n_hidden is a recurrent model's setting; model=gpt-micro is a GPT"),
    ],
)
def test_a_setting_of_the_other_kind_of_model_is_named_so_not_unknown(overrides, told):
    """A GPT's setting under a recurrent model (or the reverse) is no typo: the error says whose
    setting it is and how to fix it, where a misspelt one stays unknown."""
    with pytest.raises(TinyGPTError) as e:
        compose("config", overrides)
    assert str(e.value).startswith(told) and "drop " + overrides[1].split("=")[0] in str(e.value), e.value
    with pytest.raises(TinyGPTError, match="unknown setting 'model.atention'"):
        compose("config", ["model=gru", "model.atention=manual"])


def test_data_dir_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYGPT_DATA_DIR", str(tmp_path / "elsewhere"))
    assert compose("config", []).paths.data_root() == tmp_path / "elsewhere"
    assert compose("config", [f"paths.data_dir={tmp_path}"]).paths.data_root() == tmp_path
    monkeypatch.delenv("TINYGPT_DATA_DIR")
    assert PathsSettings().data_root() == (tmp_path.home() / ".cache" / "tinygpt")


def test_gpt2_preset_has_124m_parameters():
    """GPT-2 small: 124,439,808 parameters at GPT-2's 50257 tokens; the preset pads the tables to
    50304 rows (model.vocab_multiple=64), 47 x 768 more."""
    s = compose("config", ["model=gpt2"])
    assert s.model.vocab_size is None and s.model.vocab_multiple == 64  # the tokenizer's, padded
    with torch.device("meta"):  # shapes only: no memory, no init time
        model = GPT(dataclasses.replace(s.model, vocab_size=50257))
        unpadded = GPT(dataclasses.replace(s.model, vocab_size=50257, vocab_multiple=1))
    assert model.config.vocab_size == 50257 and model.config.padded_vocab_size == 50304
    assert model.lm_head.weight is model.transformer.wte.weight
    assert unpadded.num_params() == 124_439_808 and model.num_params() == 124_439_808 + 47 * 768


def test_settings_built_in_python_are_checked_too():
    with pytest.raises(TinyGPTError, match="train.max_iters must be an integer, got 'many'"):
        TrainSettings(max_iters="many")
    with pytest.raises(TinyGPTError, match="train.eval_interval must be a positive integer"):
        TrainSettings(eval_interval=0)
    with pytest.raises(TinyGPTError, match="data.name is required"):
        DataSettings(source=from_dict(DataSettings, {"name": "x", "source": {"kind": "local", "path": "p"}}).source)
    assert from_dict(DataSettings, {"name": "x", "source": {"kind": "local", "path": "p"}}).tokenizer.kind == "char"
    with pytest.raises(TinyGPTError, match="unknown setting.*data.source.pth"):
        from_dict(DataSettings, {"name": "x", "source": {"kind": "local", "pth": "p"}}, "data")
    assert AdamWSettings(lr=1).lr == 1.0 and isinstance(AdamWSettings(lr=1).lr, float)


def test_an_integer_too_large_for_a_number_is_one_line():
    """min_p=10**400 (from a JSON body or Python): float() overflows; a TinyGPTError, not an
    OverflowError traceback."""
    from gpt.config import SamplingSettings

    with pytest.raises(TinyGPTError, match="min_p is too large for a number \\(an integer of 401 digits\\)"):
        SamplingSettings(min_p=10**400)
