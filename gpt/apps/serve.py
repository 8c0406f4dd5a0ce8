"""Serve models over HTTP: `tinygpt serve [key=value ...]` (or `python serve.py`).

    tinygpt serve                                    # the newest run, on http://127.0.0.1:8000
    tinygpt serve run_dir=outputs/runs/<stamp> port=8080
    tinygpt serve 'models=[outputs/runs/a,outputs/runs/b,gpt2]'   # several, picked per request
    tinygpt serve models=all                         # every run under paths.runs_dir
    TINYGPT_API_KEY=secret tinygpt serve host=0.0.0.0   # other machines too, with a key

Then open http://127.0.0.1:8000/ (the playground), or call the OpenAI-compatible API:
POST /v1/completions, GET /v1/models, GET /health. Requests name a model by the id
/v1/models lists; the server only opens the models it was started with. Settings, limits and
defaults: gpt/config/commands.py (ServeConfig). Needs the serve extra (pip install 'tinygpt[serve]').
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
from pathlib import Path

from gpt.apps import common
from gpt.checkpoints import runs
from gpt.config import ServeConfig
from gpt.errors import TinyGPTError

_COMMAND = "tinygpt serve"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    common.run_command(argv, "serve", _COMMAND, __doc__, serve, ("run_dir", "ckpt", "init_from", "api_key"))


def model_sources(s: ServeConfig) -> list[tuple[str, str]]:
    """(id, source) of each model to serve: `models` (or every run with models=all), else the
    one model run_dir / ckpt / init_from / the newest run names. Ids are short names: a run's
    folder (relative to paths.runs_dir when under it), a checkpoint's run/file, a GPT-2 name."""
    from gpt import interop
    from gpt.checkpoints import loading

    runs_root = Path(s.paths.runs_dir).expanduser()
    if s.models == ["all"]:
        found = sorted(runs.runs_under(runs_root))
        if not found:
            raise TinyGPTError(f"models=all: no trained run under {runs_root.resolve()}; train one first or name models=[...]")
        sources = [str(r) for r in found]
    elif s.models:
        sources = list(s.models)
        for source in sources:
            loading.check(source, "models")
    else:
        sources = [loading.choose(s.ckpt, s.run_dir, s.init_from, s.paths.runs_dir)]
    named: list[tuple[str, str]] = []
    for source in sources:
        path = Path(source).expanduser()
        if interop.is_hf_source(source) and not path.exists():
            name = source
        elif path.is_dir():
            try:
                name = str(path.resolve().relative_to(runs_root.resolve()))
            except ValueError:
                name = path.name
            name = name.removeprefix("runs/")
        else:
            name = f"{path.parent.parent.name}/{path.stem}" if path.parent.name == runs.CKPT_DIR else path.stem
        taken = {n for n, _ in named}
        unique, k = name, 2
        while unique in taken:
            unique, k = f"{name}-{k}", k + 1
        named.append((unique, source))
    return named


def serve(s: ServeConfig) -> None:
    try:
        import uvicorn

        from gpt.serve.app import ServedModel, create_app
        from gpt.serve.engine import COMPILED_SHAPES, Engine
    except ImportError as e:
        raise TinyGPTError(f"tinygpt serve needs the serve extra ({e.name} is missing): pip install 'tinygpt[serve]'") from None
    from gpt.checkpoints import loading
    from gpt.generation import ready_to_decode
    from gpt.runtime import devices

    api_key = s.api_key or os.environ.get("TINYGPT_API_KEY") or None
    _check_port(s.host, s.port)
    if not _is_loopback(s.host) and api_key is None:
        print(
            f"warning: serving on {s.host} without an API key: anyone who can reach it may use it (set api_key=...)",
            file=sys.stderr,
        )
    rt = devices.setup(s.device, s.dtype, s.compile, threads=s.threads)
    served = []
    for model_id, source in model_sources(s):
        loaded = loading.load(source)
        if getattr(loaded.model, "recurrent", False):
            raise TinyGPTError(f"{source} is a recurrent model; tinygpt serve batches transformers only (use tinygpt sample)")
        model = rt.place(loaded.model)
        ready_to_decode(model, rt.compile, graphs=2 * COMPILED_SHAPES)  # room to spare for its shapes (Engine.warm_up)
        engine = Engine(model, loaded.tokenizer(), s.max_batch, s.max_queue, autocast=rt.autocast, observe=rt.threads.observe)
        served.append(ServedModel(model_id, engine, engine.tokenizer, model.config.block_size, loaded.source))
        print(f"model {model_id}: {loaded.source} (context {model.config.block_size})", file=sys.stderr, flush=True)
        if rt.compile:
            print(f"model {model_id}: compiling for decoding (minutes on a CPU)", file=sys.stderr, flush=True)
            print(f"model {model_id}: compiled in {engine.warm_up():.0f} s", file=sys.stderr, flush=True)
    notice = rt.threads.load_notice()  # other work on our cores: said once, the count kept
    if notice:
        print(notice, file=sys.stderr)
    app = create_app(served, s, api_key)
    host = f"[{s.host}]" if ":" in s.host else s.host
    print(
        f"{rt.describe()}\nserving on http://{host}:{s.port}/ (playground; API at /v1, key {'required' if api_key else 'off'})",
        file=sys.stderr,
        flush=True,
    )
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        uvicorn.run(app, host=s.host, port=s.port, log_level="warning", access_log=False)
    except _Terminated:
        print("stopped (SIGTERM): requests in flight were answered first", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for m in served:
            m.engine.close()


class _Terminated(Exception):
    """SIGTERM asked the server to stop, and it has (see _stop_on_sigterm)."""


def _stop_on_sigterm(signum, frame) -> None:
    """The SIGTERM handler around uvicorn.run. uvicorn catches SIGTERM itself and shuts down
    gracefully (requests in flight are answered), then restores the handler it found and raises
    the signal again, so that the process ends as the signal's default would: killed by SIGTERM,
    status 143, which systemd, docker and Kubernetes read as a failed service. Found instead, this
    handler ends `serve` normally, exit 0 (also when the signal comes before uvicorn has taken it
    over: nothing is being answered yet, stopping is as clean). SIGINT is left as it is: the
    handler uvicorn finds and raises it to is asyncio's runner's, and a Ctrl-C that shut down
    cleanly already exits 0 (tested beside SIGTERM). A SIGTERM while the models load is not
    caught: its 143 says the server never served."""
    raise _Terminated


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _check_port(host: str, port: int) -> None:
    """Refuse, before loading any model, an address that cannot be served on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            raise TinyGPTError(f"cannot serve on {host}:{port} ({e.strerror or e}); pass another port=... or host=...") from None


if __name__ == "__main__":  # python -m gpt.apps.serve, as `tinygpt serve`
    main()
