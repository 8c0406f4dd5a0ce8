"""Every setting tinygpt reads, defined once: typed dataclasses with their defaults and checks.

    checks.py    the checks they share (types, bounds, threads=, from plain data, differences)
    model.py     the model: GPTConfig / RNNConfig, the settings and the model's own config at once
    run.py       a training run (RunConfig) and its sections; the device fields every command shares
    commands.py  the other commands (sample, chat, serve, eval, export, sweep, scaling)
    overrides.py settings as command-line overrides

Hydra composes `configs/*.yaml` on top of these schemas (`register_schemas`, below, puts them in
its ConfigStore), so a misspelt key or a value of the wrong type is refused while the config is
composed, for `-m` sweeps too. The YAML files hold only what differs from the defaults: model
presets, datasets, experiments (a test checks that none restates a default). `__post_init__`
checks ranges and relations, so a settings object that exists is a valid one, whether Hydra
built it or Python code did. No torch here: composing a config (and refusing a bad one) stays
fast. Everything is importable from `gpt.config` itself; the other commands' settings on first use
(a training run never reads commands.py).
"""

from gpt.config.checks import MISSING, changed_settings, check_threads, check_types, expected_type, from_dict
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

# configs/<name>.yaml -> its schema, a class of gpt.config.commands (training's is RunConfig)
COMMANDS = {
    "sample": "SampleConfig",
    "eval": "EvalConfig",
    "export": "ExportConfig",
    "sweep": "SweepConfig",
    "scaling": "ScalingConfig",
    "serve": "ServeConfig",
    "chat": "ChatConfig",
    "plot": "PlotConfig",
}


def register_schemas(config_name: str | None = None) -> None:
    """Put the schemas in Hydra's ConfigStore, under the names configs/*.yaml refer to: training's
    and its groups' (model, optim) always, the other commands' for `config_name` (all for None)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="schema_train", node=RunConfig)
    store.store(group="model", name="schema_gpt", node=GPTConfig)
    store.store(group="model", name="schema_rnn", node=RNNConfig)
    for name, node in OPTIMIZERS.items():
        store.store(group="optim", name=f"schema_{name}", node=node)
    wanted = COMMANDS if config_name is None else {k: v for k, v in COMMANDS.items() if k == config_name}
    if wanted:
        from gpt.config import commands

        for name, cls in wanted.items():
            store.store(name=f"schema_{name}", node=getattr(commands, cls))


_COMMANDS = {
    "ChatConfig", "EvalConfig", "ExportConfig", "ModelChoice", "PlotConfig", "SampleConfig", "SamplingSettings",
    "ScalingConfig", "ServeConfig", "SweepConfig", "TaskSettings",
}  # fmt: skip


def __getattr__(name: str):
    if name in _COMMANDS:
        from gpt.config import commands

        return getattr(commands, name)
    raise AttributeError(f"module 'gpt.config' has no attribute {name!r}")


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
