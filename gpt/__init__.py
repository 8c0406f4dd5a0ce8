"""tinygpt: train, sample, chat with, export, serve and sweep small decoder-only GPTs.

From Python, with the same configs and overrides as the command line:

    from gpt import sample, train
    summary = train(["model=gpt-nano", "train.max_iters=100"])   # what summary.json holds
    texts = sample([f"run_dir={summary['run_dir']}", "num_samples=2"], prompt="ROMEO:")
"""

from __future__ import annotations

from gpt.version import __version__

__all__ = ["__version__", "loading", "sample", "train"]

# Modules reachable from the package's face by their documented names, imported on first use:
# `from gpt import loading; loading.load("outputs/runs/<stamp>")` (docs/sampling.md) is
# gpt.checkpoints.loading.
_FACE_MODULES = {"loading": "gpt.checkpoints.loading"}


def __getattr__(name: str):
    if name in _FACE_MODULES:
        import importlib

        return importlib.import_module(_FACE_MODULES[name])
    raise AttributeError(f"module 'gpt' has no attribute {name!r}")


def train(overrides: list[str] | tuple[str, ...] = (), on_step=None, on_eval=None) -> dict:
    """Train as `tinygpt train <overrides>` would, in this process; returns the run's summary
    (status, best and final val loss, steps, tokens/s, run_dir). Without paths.output_dir the
    run gets a new directory under paths.runs_dir/runs. Mistakes raise gpt.errors.TinyGPTError."""
    from gpt.apps.common import compose
    from gpt.training import train as run

    return run(compose("config", list(overrides)), on_step, on_eval, overrides)


def sample(overrides: list[str] | tuple[str, ...] = (), prompt: str | None = None) -> list[list[str]]:
    """Generate as `tinygpt sample <overrides>` would; returns result[i][j], sample j of prompt i.
    `prompt` is taken verbatim (no override quoting); nothing is printed."""
    from gpt.apps.common import compose
    from gpt.apps.sample import sample as run

    settings = compose("sample", list(overrides), "tinygpt sample")
    if prompt is not None:
        settings.prompt = prompt
    return run(settings)
