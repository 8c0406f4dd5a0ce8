"""The settings classes in Hydra's ConfigStore, under the names configs/*.yaml refer to
(`defaults: [schema_train, ...]`), so Hydra checks every key and type while it composes."""

from __future__ import annotations

from gpt.config.commands import (
    ChatConfig,
    EvalConfig,
    ExportConfig,
    PlotConfig,
    SampleConfig,
    ScalingConfig,
    ServeConfig,
    SweepConfig,
)
from gpt.config.model import GPTConfig, RNNConfig
from gpt.config.run import OPTIMIZERS, RunConfig


def register_schemas() -> None:
    """Put the schemas in Hydra's ConfigStore, under the names configs/*.yaml refer to."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, node in (
        ("schema_train", RunConfig),
        ("schema_sample", SampleConfig),
        ("schema_eval", EvalConfig),
        ("schema_export", ExportConfig),
        ("schema_sweep", SweepConfig),
        ("schema_scaling", ScalingConfig),
        ("schema_serve", ServeConfig),
        ("schema_chat", ChatConfig),
        ("schema_plot", PlotConfig),
    ):
        store.store(name=name, node=node)
    store.store(group="model", name="schema_gpt", node=GPTConfig)
    store.store(group="model", name="schema_rnn", node=RNNConfig)
    for name, node in OPTIMIZERS.items():
        store.store(group="optim", name=f"schema_{name}", node=node)
