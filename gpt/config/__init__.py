"""Every setting tinygpt reads, defined once: typed dataclasses with their defaults and checks.

    checks.py    the checks they share (types, bounds, threads=, from plain data, differences)
    model.py     the model: GPTConfig / RNNConfig, the settings and the model's own config at once
    run.py       a training run (RunConfig) and its sections; the device fields every command shares
    commands.py  the other commands (sample, chat, serve, eval, export, sweep, scaling)
    store.py     the schemas in Hydra's ConfigStore
    overrides.py settings as command-line overrides

Hydra composes `configs/*.yaml` on top of these schemas (`register_schemas` puts them in its
ConfigStore), so a misspelt key or a value of the wrong type is refused while the config is
composed, for `-m` sweeps too. The YAML files hold only what differs from the defaults: model
presets, datasets, experiments (a test checks that none restates a default). `__post_init__`
checks ranges and relations, so a settings object that exists is a valid one, whether Hydra
built it or Python code did. No torch here: composing a config (and refusing a bad one) stays
fast. Everything is importable from `gpt.config` itself.
"""

from gpt.config.checks import MISSING, changed_settings, check_threads, check_types, expected_type, from_dict
from gpt.config.commands import (
    ChatConfig,
    EvalConfig,
    ExportConfig,
    ModelChoice,
    PlotConfig,
    SampleConfig,
    SamplingSettings,
    ScalingConfig,
    ServeConfig,
    SweepConfig,
    TaskSettings,
)
from gpt.config.model import GPTConfig, RNNConfig, config_from_dict
from gpt.config.run import (
    OPTIMIZERS,
    AdamWSettings,
    DataSettings,
    DeviceSettings,
    FinetuneSettings,
    MuonSettings,
    PathsSettings,
    RunConfig,
    SourceSettings,
    TokenizerSettings,
    TrainSettings,
)
from gpt.config.store import register_schemas

__all__ = [
    "MISSING",
    "OPTIMIZERS",
    "AdamWSettings",
    "ChatConfig",
    "DataSettings",
    "DeviceSettings",
    "EvalConfig",
    "ExportConfig",
    "PlotConfig",
    "FinetuneSettings",
    "GPTConfig",
    "ModelChoice",
    "MuonSettings",
    "PathsSettings",
    "RNNConfig",
    "RunConfig",
    "SampleConfig",
    "SamplingSettings",
    "ScalingConfig",
    "ServeConfig",
    "SourceSettings",
    "SweepConfig",
    "TaskSettings",
    "TokenizerSettings",
    "TrainSettings",
    "changed_settings",
    "check_threads",
    "check_types",
    "config_from_dict",
    "expected_type",
    "from_dict",
    "register_schemas",
]
