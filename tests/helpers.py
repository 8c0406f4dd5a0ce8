"""What tests share besides fixtures (those live in conftest.py): paths, running the commands
as a user types them, composing the real configs, and the one-line error check."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The project's shared test material beside the checkout (the real Tiny Shakespeare, GPT-2's BPE
# ranks); TINYGPT_TEST_SHARED points elsewhere, e.g. at nothing, to run as a fresh clone would.
SHARED = Path(os.environ.get("TINYGPT_TEST_SHARED") or REPO.parent / "shared")
SHARED_TEXT = SHARED / "data" / "tinyshakespeare" / "input.txt"
SHARED_RANKS = SHARED / "data" / "tiktoken" / "r50k_base.tiktoken"
R50K_CACHE_NAME = "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4"  # sha1 of tiktoken's r50k_base URL


def run_script(
    script: str, args: list[str], cwd: Path, data_dir: Path, timeout: float = 300, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """`python train.py ...` / `python sample.py ...` (the checkout's shims), or for any other
    name `python -m gpt <name> ...` (the `tinygpt` console command)."""
    # PYTHONPATH: `python -m gpt` run outside the checkout must import the checkout's gpt, not an installed one.
    env = {**os.environ, "TINYGPT_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    env.pop("HYDRA_FULL_ERROR", None)
    command = [sys.executable, str(REPO / script)] if script.endswith(".py") else [sys.executable, "-m", "gpt", script]
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=stdin)


def train_recording_losses(cfg, stop_after: int | None = None) -> dict[int, float]:
    """Train `cfg` in this process and return its loss at every step; with `stop_after`, SIGTERM
    this process after that step (the real preemption path) and expect the clean stop."""
    import signal

    import pytest

    from gpt.runtime.preemption import Preempted
    from gpt.training import train

    losses: dict[int, float] = {}

    def on_step(step: int, loss: float) -> None:
        losses[step] = loss
        if step == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)

    if stop_after is None:
        train(cfg, on_step=on_step)
    else:
        with pytest.raises(Preempted):
            train(cfg, on_step=on_step)
    return losses


def sigterm_after_step_5(cmd: list[str], cwd: Path, env: dict) -> tuple[int, str, str]:
    """Start a training command, SIGTERM it once it has logged step 5, and wait for it to end.
    Returns (exit status, stdout, stderr)."""
    import signal

    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("step 5/"):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


# A sitecustomize for processes that run collectives on gloo (the CPU) in tests: what NCCL refuses
# and gloo lets through is refused here too, so a GPU run's first step cannot be the first to
# meet it. NCCL (ProcessGroupNCCL's check_gpu_single_tensor) refuses a non-contiguous tensor,
# which gloo copies; checked for the tensors a collective is given directly (in lists, NCCL
# copies the outputs of some collectives itself); and tensors of two dtypes in one collective.
NCCL_RULES = """
import torch
import torch.distributed as dist


def _as_nccl_would(name, call):
    def checked(*args, **kwargs):
        given = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        if not all(t.is_contiguous() for t in given):
            raise ValueError(f"{name}: Tensors must be contiguous (NCCL refuses what gloo copies)")
        if len({t.dtype for t in given}) > 1:
            raise TypeError(f"{name}: tensors of two dtypes (NCCL takes one)")
        return call(*args, **kwargs)

    return checked


for name in ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "all_gather_single",
             "reduce_scatter_tensor", "scatter", "gather", "all_to_all_single"):
    if hasattr(dist, name):
        setattr(dist, name, _as_nccl_would(name, getattr(dist, name)))
"""


# A sitecustomize that counts, for every training step of Trainer.step, the tensors read on the
# host (bool(t), t.item(), t.tolist(), float(t), ...: on a GPU each waits for the device) and the
# collectives the optimizer's step issues (c10d ops, DTensor's included), one JSON line a step in
# $STEP_COUNTS<rank>. The data pipeline's reads are not counted: it draws and slices host tensors
# (CPU tensors on a GPU too), which no device computes.
STEP_COUNTER = """
import json, os, sys
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from gpt.training import loop, optim

READS = {"__bool__", "item", "tolist", "__float__", "__int__", "__index__", "numpy", "__repr__", "__format__"}


class Reads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        host_data = "/gpt/data/" in sys._getframe(1).f_code.co_filename.replace(os.sep, "/")
        self.n += getattr(func, "__name__", "") in READS and not host_data
        return func(*args, **(kwargs or {}))


class Collectives(TorchDispatchMode):
    n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Collectives.n += str(func).split(".")[0] in ("c10d", "_c10d_functional")
        return func(*args, **(kwargs or {}))


real_step, real_opt_step = loop.Trainer.step, optim.Optimizers.step


def opt_step(self, *args, **kwargs):
    with Collectives():
        return real_opt_step(self, *args, **kwargs)


def step(self):
    Collectives.n = 0
    with Reads() as reads:
        out = real_step(self)
    groups = len(self.run.optimizer.param_groups)
    with open(os.environ["STEP_COUNTS"] + os.environ.get("RANK", "0"), "a") as f:
        f.write(json.dumps({"reads": reads.n, "collectives": Collectives.n, "groups": groups}) + "\\n")
    return out


loop.Trainer.step = step
optim.Optimizers.step = opt_step
"""


def hooked_pythonpath(folder: Path, source: str) -> str:
    """A PYTHONPATH for a subprocess that runs `source` as its sitecustomize module before
    anything else (to make a library fail the way a test needs), with the checkout's gpt."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(source)
    return f"{folder}{os.pathsep}{REPO}"


def compose(overrides: list[str], output_dir: Path | None = None, config_name: str = "config"):
    """The settings train.py would build from these overrides (the compose API sets no run
    directory: `output_dir` is the run's)."""
    from gpt.apps.common import compose as compose_settings

    extra = [f"paths.output_dir={output_dir}"] if output_dir is not None else []
    return compose_settings(config_name, [*extra, *overrides])


def assert_one_line_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# --- corpora and tokenizers the tests write themselves ------------------------------------------

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 50
DOCS = [f"Document {i}: the quick brown fox jumps over the lazy dog {i * 7}.\nSecond line of {i}." for i in range(12)]


def write_ranks(path: Path, extra_pairs: int = 40, big: bool = False) -> Path:
    """A tiny BPE ranks file in tiktoken's format: every single byte, then some merges."""
    import base64

    tokens = [bytes([b]) for b in range(256)]
    if big:  # every 2-byte pair and then some: a vocabulary beyond uint16
        tokens += [bytes([a, b]) for a in range(256) for b in range(256)] + [b"the", b"and", b" of"]
    else:
        tokens += [b"th", b"he", b"the", b" t", b"an", b"nd", b"and", b"in", b"er", b" a"][:extra_pairs]
    path.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens)))
    return path


def write_corpus(folder: Path, kind: str) -> Path:
    """DOCS as .txt/.md files (one per document) or as .jsonl/.parquet records (field `body`)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    if kind in ("txt", "md"):
        for i, doc in enumerate(DOCS):
            (folder / f"doc{i:02d}.{kind}").write_text(doc)
    elif kind == "jsonl":
        (folder / "part.jsonl").write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(DOCS)))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": list(range(len(DOCS))), "body": DOCS}), folder / "part.parquet")
    return folder


def data_settings(name: str, source: dict, tokenizer: dict, **kw):
    """DataSettings for a test corpus: documents split 25% to val, seed 3, one process."""
    from gpt.config import DataSettings, from_dict

    values = {
        "name": name,
        "tokenizer": tokenizer,
        "source": source,
        "val_fraction": 0.25,
        "split_by": "documents",
        "seed": 3,
        "num_proc": 1,
        **kw,
    }
    return from_dict(DataSettings, values, "data")


def load(settings, root: Path):
    """gpt.data.load_data, quietly."""
    from gpt.data import load_data

    return load_data(settings, root, log=lambda *a: None)


def corrupted_variants(data: bytes, n: int, seed: int = 0):
    """n damaged copies of a file: cut short at any byte, bytes flipped anywhere (1, 4 or 32 of
    them), a block zeroed (a bad sector, a copy that wrote holes)."""
    import random

    rng = random.Random(seed)
    for i in range(n):
        kind = ("cut", "flip", "zero")[i % 3]
        b = bytearray(data)
        if kind == "cut":
            b = b[: rng.randrange(len(b))]
        elif kind == "flip":
            for _ in range(rng.choice([1, 4, 32])):
                b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
        else:
            start, size = rng.randrange(len(b)), rng.randrange(1, 4096)
            b[start : start + size] = bytes(len(b[start : start + size]))
        yield kind, bytes(b)


# A 30-step training run with evals every 10 and a loss logged at every step
ENGINE_RUN = [
    "debug=tiny",
    "train.max_iters=30",
    "train.eval_interval=10",
    "train.log_interval=1",
    "optim.warmup_iters=5",
    "train.sample_tokens=0",
    "threads=1",  # bitwise comparisons: the thread count must not follow other work mid-run
]


def poison_forward(monkeypatch, bad_calls):
    """Make the training forward pass return NaN on the given (1-based) training calls."""
    from gpt.model import GPT

    real = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kw):
        logits, loss = real(self, idx, targets, **kw)
        if self.training and targets is not None:
            calls["n"] += 1
            if calls["n"] in bad_calls:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)


def export_hf(model, tokenizer, out: Path) -> Path:
    """`tinygpt export`'s step: the model as a Hugging Face folder (GPT-2's or Llama's format)."""
    from gpt import interop

    return interop.export(model, tokenizer, out)[0]


# --- the server, as `python serve.py` -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python serve.py ...` on a free port; stopped by `stop()`."""

    def __init__(self, args: list[str], cwd, data_dir):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "TINYGPT_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
        env.pop("TINYGPT_API_KEY", None)
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "serve.py"), f"port={self.port}", "threads=1", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited: {self.proc.stdout.read()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise AssertionError("the server did not answer /health within 120 s")

    def health(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
            return json.loads(r.read())

    def post(self, body, headers=None, path="/v1/completions", raw: bytes | None = None) -> tuple[int, dict, dict]:
        """(status, JSON body, headers) of a POST."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        payload = response.read()
        conn.close()
        return response.status, json.loads(payload), dict(response.getheaders())

    def stop(self) -> str:
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out


def chromium():
    """Headless Chromium under selenium, or a skip that says what is missing and how to get it."""
    import shutil

    import pytest

    webdriver = pytest.importorskip("selenium.webdriver", reason="the playground test needs selenium (pip install selenium)")
    chrome = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
        pytest.skip(
            "NO BROWSER: the playground test needs Chromium and its driver "
            "(Debian: apt-get install -y chromium chromium-driver); it did not run"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1200,900"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


# --- conversations for the chat tests -----------------------------------------------------------


def random_conversation(rng, words: list[str], most_words: int = 8) -> list[dict]:
    """A conversation of random text from `words`: sometimes a system message, 1-3 exchanges."""
    text = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(1, most_words)))  # noqa: E731
    messages = [{"role": "system", "content": text()}] if rng.random() < 0.3 else []
    for _ in range(rng.randint(1, 3)):
        messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
    return messages


def template_ids(encoded) -> list[int]:
    """apply_chat_template's ids, whether it returns a list or a BatchEncoding (transformers 5)."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def weight_cast_counter(model, casts: dict[int, int]):
    """A dispatch mode that counts, per weight of `model`, the bf16 copies made of it (autocast's
    casts): entered in the thread whose casts it should see (dispatch modes are per thread)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    weights = {p.data_ptr() for p in model.parameters()}

    class CountWeightCasts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
                if args[0].data_ptr() in weights:
                    casts[args[0].data_ptr()] = casts.get(args[0].data_ptr(), 0) + 1
            return func(*args, **kwargs)

    return CountWeightCasts()


def llama_folder(tmp_path: Path, data_root: Path) -> tuple[Path, Path]:
    """A small LlamaForCausalLM folder with its tokenizer.json (a BPE of 400 tokens trained on
    Tiny Shakespeare's first 200,000 characters), as a user has one on disk, and that text as a
    file to finetune on: (folder, corpus)."""
    import torch
    import transformers

    from gpt.tokenizers.bpe import train_bpe

    text = (data_root / "tinyshakespeare" / "input.txt").read_text()[:200_000]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    bpe = train_bpe([text], 400)
    config = transformers.LlamaConfig(
        vocab_size=bpe.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    folder = tmp_path / "llama"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    (folder / "tokenizer.json").write_text(bpe.json_text)
    return folder, corpus


def worker_pids(launcher: subprocess.Popen) -> dict[int, int]:
    """{rank: pid} of the workers torchrun started (its children, by their RANK; Linux's /proc)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or (proc / "stat").read_text().rsplit(")", 1)[1].split()[1] != str(launcher.pid):
                continue
            env = dict(item.split("=", 1) for item in (proc / "environ").read_text().split("\0") if "=" in item)
        except OSError:
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = int(proc.name)
    return found


def relaid(model) -> bool:
    """Whether every nn.Linear weight of `model` is stored input-major (strides (1, out)), as
    gpt.generation.input_major leaves it for decoding on a CPU."""
    import torch

    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return bool(linears) and all(w.stride() == (1, w.shape[0]) for w in linears)
