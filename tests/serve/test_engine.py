"""gpt/serve/engine.py: continuous batching gives each row what gpt.generation gives it alone
(jobs joining mid-flight, rows leaving, text past the context, stop strings, per-request
controls), and a cancelled job leaves the batch. Run: pytest tests/serve/test_engine.py"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

pytest.importorskip("fastapi")  # the serve extra; the engine itself needs only torch

from gpt.config import SamplingSettings  # noqa: E402
from gpt.errors import TinyGPTError  # noqa: E402
from gpt.generation import generate  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.serve.engine import Engine, Job  # noqa: E402
from gpt.tokenizers import CharTokenizer  # noqa: E402
from helpers import weight_cast_counter  # noqa: E402

ALPHABET = "\n !',.:;?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _model(block_size=16, **kw) -> GPT:
    """Random weights scaled up so outputs depend on the context (as in tests/test_generation.py)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(ALPHABET), block_size=block_size, n_layer=2, n_head=2, n_embd=32, **kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10)
    return model


class Collector:
    """A job's emit: the text of each choice, how each ended, and a flag when all have."""

    def __init__(self, rows: int):
        self.texts, self.reasons, self.done = [""] * rows, [None] * rows, threading.Event()
        self.first_text = threading.Event()

    def __call__(self, events):
        for e in events:
            if e[0] == "text":
                self.texts[e[1]] += e[2]
                self.first_text.set()
            elif e[0] == "end":
                self.reasons[e[1]] = e[2]
            else:
                raise AssertionError(e)
        if all(r is not None for r in self.reasons):
            self.done.set()


def _job(tok, prompts, n=1, **kw):
    cfg = SamplingSettings(**{"max_new_tokens": 40, "temperature": 0.9, "top_k": None, **kw})
    collector = Collector(len(prompts) * n)
    return Job([tok.encode(p) for p in prompts], cfg, n, emit=collector), collector


MIXED = [
    (["ROMEO:"], 2, dict(seed=3)),
    (["ROMEO:"], 2, dict(seed=3, typical_p=0.2)),  # the rows above but one control: filtered apart
    (["JULIET: O", "a"], 1, dict(temperature=0.0)),
    (["KING:"], 1, dict(seed=5, top_p=0.8, repetition_penalty=1.3, max_new_tokens=25)),
    (["the quick brown fox"], 3, dict(seed=11, top_k=5, min_p=0.05)),
]


def _serve_and_compare(engine, model, tok, specs) -> None:
    """Submit the jobs, each joining while the earlier ones decode; each row's text must be what
    gpt.generation gives it alone."""
    jobs = []
    for prompts, n, kw in specs:
        job, got = _job(tok, prompts, n, **kw)
        assert engine.submit(job)
        jobs.append((prompts, n, kw, got))
        got.first_text.wait(10)
    for prompts, n, kw, got in jobs:
        assert got.done.wait(30)
        cfg = SamplingSettings(**{"max_new_tokens": 40, "temperature": 0.9, "top_k": None, **kw})
        want = [t for texts in generate(model, tok, prompts, cfg, num_samples=n) for t in texts]
        assert got.texts == want
        assert got.reasons == ["length"] * len(want)
    assert engine.load()["active_rows"] == 0


@pytest.mark.parametrize("block_size", [16, 64])  # 40 new tokens run past a 16-token context
def test_jobs_batched_and_joining_mid_flight_equal_generation_alone(block_size):
    model, tok = _model(block_size), CharTokenizer(list(ALPHABET))
    engine = Engine(model, tok, max_batch=8)
    try:
        _serve_and_compare(engine, model, tok, MIXED)
    finally:
        engine.close()


def _compiled_engine(block_size: int, rt=None, **kw) -> tuple[Engine, list]:
    """An engine over a model compiled for decoding with a counting backend in place of
    inductor, and the list of graphs it compiles; `rt`: the runtime that places the model, as
    `tinygpt serve` does."""
    from gpt.generation import compile_for_generation

    graphs: list = []
    torch.compiler.reset()
    model = _model(block_size, pos_encoding="rope", norm="rmsnorm", qk_norm=True)
    if rt is not None:
        rt.place(model)
    compile_for_generation(model, backend=lambda gm, _: graphs.append(gm) or gm.forward, graphs=16)
    return Engine(model, CharTokenizer(list(ALPHABET)), max_batch=8, **kw), graphs


@pytest.mark.parametrize("block_size", [16, 64, 300])
def test_a_compiled_engine_warmed_up_compiles_nothing_while_it_serves(block_size):
    """warm_up decodes each shape a step can take, so that a compiled model compiles all its
    graphs before serving (6 in fp32): the mixed jobs above, one-character prompts and several
    rows of them, prompts of 256 tokens and more, of the whole context, and rows past it then
    compile nothing more, and every row's text is eager generation's. Its cost does not grow
    with the context (no whole-context pass). The counters are zero after it, also once the
    engine's thread has finished its last step."""
    engine, graphs = _compiled_engine(block_size)
    model = _model(block_size, pos_encoding="rope", norm="rmsnorm", qk_norm=True)
    real = engine._sample_and_emit

    def lingering(*args):  # the engine's thread slow after a job's last event, as on a busy machine
        real(*args)
        time.sleep(0.05)

    engine._sample_and_emit = lingering
    try:
        assert engine.warm_up() > 0
        assert len(graphs) == 6
        time.sleep(0.2)
        assert engine.load() == {"active_rows": 0, "queued": 0, "jobs": 0, "cancelled": 0, "failed": 0, "tokens": 0, "steps": 0}
        single = [(["x"], 1, {}), (["x", "y"], 1, dict(seed=2)), (["z" * 40], 2, dict(temperature=0.0))]
        long = [(["w" * max(1, block_size - 20)], 1, dict(seed=4)), (["v" * block_size, "u" * block_size], 1, {})]
        _serve_and_compare(engine, model, engine.tokenizer, MIXED + single + long)
        assert len(graphs) == 6
    finally:
        engine.close()
        torch.compiler.reset()


@pytest.mark.slow
def test_a_compiled_engine_with_inductor_serves_what_eager_generation_gives():
    """The real thing (inductor's C++ backend, about a minute cold here), as `tinygpt serve
    compile=true` prepares a model: warmed up, the engine's mixed jobs, rows past the context
    and prompts as long as it give every row eager generation's text, and nothing compiles
    while it serves."""
    from gpt.generation import ready_to_decode
    from gpt.serve.engine import COMPILED_SHAPES

    torch.compiler.reset()
    compiled = _model(16, pos_encoding="rope", norm="rmsnorm", qk_norm=True)
    eager = _model(16, pos_encoding="rope", norm="rmsnorm", qk_norm=True)
    ready_to_decode(compiled, compile=True, graphs=COMPILED_SHAPES)
    engine = Engine(compiled, CharTokenizer(list(ALPHABET)), max_batch=8)
    try:
        engine.warm_up()
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        long = [(["v" * 16, "u" * 3], 1, {}), (["w" * 16], 2, dict(seed=4))]
        _serve_and_compare(engine, eager, engine.tokenizer, MIXED + long)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before > 0
    finally:
        engine.close()
        torch.compiler.reset()


def test_under_bf16_autocast_on_a_cpu_warm_up_covers_attention_over_256_positions_too():
    """On a CPU under bf16 autocast attention runs in fp32 below 256 positions and in bf16 from
    there: a branch on the prompt's length, so 8 graphs, all compiled at warm-up."""
    from gpt.runtime import devices
    from gpt.serve.engine import COMPILED_SHAPES

    rt = devices.Runtime(torch.device("cpu"), torch.bfloat16, compile=True)
    engine, graphs = _compiled_engine(300, rt, autocast=rt.autocast)
    try:
        engine.warm_up()
        assert len(graphs) == COMPILED_SHAPES == 8
        for prompts in (["a" * 100], ["b" * 270], ["c" * 270, "d" * 10], ["e" * 300]):
            job, got = _job(engine.tokenizer, prompts, max_new_tokens=5)
            assert engine.submit(job) and got.done.wait(30)
        assert len(graphs) == COMPILED_SHAPES
    finally:
        engine.close()
        torch.compiler.reset()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the engine's thread dies: planted
def test_warm_up_says_so_when_the_engine_stops_instead_of_waiting_forever():
    def observe():
        raise RuntimeError("the load reader broke")

    engine, _ = _compiled_engine(16, observe=observe)
    try:
        with pytest.raises(TinyGPTError, match="the serving engine stopped while warming up"):
            engine.warm_up()
    finally:
        engine.close()
        torch.compiler.reset()


def test_stop_strings_end_a_row_and_free_its_slot():
    model, tok = _model(), CharTokenizer(list(ALPHABET))
    cfg = SamplingSettings(max_new_tokens=40, temperature=0.0)
    free_text = generate(model, tok, ["ROMEO:"], cfg)[0][0]
    stop = free_text[12:14]
    engine = Engine(model, tok, max_batch=1)  # the second job needs the first one's slot
    try:
        first, got1 = _job(tok, ["ROMEO:"], temperature=0.0, stop=[stop])
        second, got2 = _job(tok, ["KING:"], temperature=0.0, max_new_tokens=5)
        assert engine.submit(first) and engine.submit(second)
        assert got1.done.wait(10) and got2.done.wait(10)
        assert got1.texts == [free_text[: free_text.index(stop)]] and got1.reasons == ["stop"]
        assert got2.reasons == ["length"] and len(got2.texts[0]) == 5
    finally:
        engine.close()


def test_a_cancelled_job_leaves_the_batch_and_a_full_queue_refuses():
    model, tok = _model(), CharTokenizer(list(ALPHABET))
    engine = Engine(model, tok, max_batch=1, max_queue=1)
    try:
        endless, got = _job(tok, ["ROMEO:"], max_new_tokens=10**9)
        assert engine.submit(endless) and got.first_text.wait(10)
        waiting, got_waiting = _job(tok, ["KING:"], max_new_tokens=5)
        assert engine.submit(waiting)  # queued behind the endless one
        refused, _ = _job(tok, ["JULIET:"], max_new_tokens=5)
        assert not engine.submit(refused)  # the queue holds one job
        endless.cancel()
        assert got_waiting.done.wait(10) and len(got_waiting.texts[0]) == 5
        deadline = time.time() + 10
        while engine.load()["active_rows"] and time.time() < deadline:
            time.sleep(0.01)
        load = engine.load()
        assert load["active_rows"] == 0 and load["queued"] == 0 and load["cancelled"] == 1
        assert got.reasons == [None]  # never finished: it was dropped
    finally:
        engine.close()


def test_controls_that_overflow_the_logits_do_not_fail_the_batch():
    """A group whose probabilities are not finite (its logits overflowed) decodes greedily; the
    other rows of the batch sample as before."""
    from gpt.serve.engine import _choose

    class Row:
        def __init__(self, temperature):
            self.job = Job([[0]], SamplingSettings(temperature=temperature, top_k=None), 1, emit=lambda e: None)
            self.generator = torch.Generator().manual_seed(0)
            self.seen = torch.zeros(len(ALPHABET), dtype=torch.bool)

    logits = torch.randn(2, len(ALPHABET))
    logits[0, 3] = float("inf")
    picks = _choose([Row(0.5), Row(0.9)], logits)
    assert picks[0] == 3
    torch.manual_seed(0)
    expected = int(torch.multinomial(torch.softmax(logits[1] / 0.9, -1), 1, generator=torch.Generator().manual_seed(0)))
    assert picks[1] == expected


def test_weights_are_cast_once_while_the_engine_is_busy_not_at_every_step():
    """Under bf16 autocast each fp32 weight is cast to bf16 once while the engine has work, not
    once per decoded token (autocast keeps its casts only while its region is open), and the
    text is what gpt.generation gives under the same autocast."""
    model, tok = _model(), CharTokenizer(list(ALPHABET))
    casts: dict[int, int] = {}  # weight -> bf16 copies made of it

    def autocast():  # what the engine enters, in its own thread (dispatch modes are per thread too)
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        stack.enter_context(weight_cast_counter(model, casts))
        return stack

    engine = Engine(model, tok, max_batch=4, autocast=autocast)
    try:
        job, got = _job(tok, ["ROMEO:", "KING:"], temperature=0.0, max_new_tokens=20)
        assert engine.submit(job) and got.done.wait(30)
    finally:
        engine.close()
    assert engine.stats["steps"] == 20
    assert casts and max(casts.values()) == 1, casts  # 20 steps, one cast of each weight
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = generate(model, tok, ["ROMEO:", "KING:"], SamplingSettings(max_new_tokens=20, temperature=0.0))
    assert got.texts == [texts[0] for texts in want]


def test_every_engine_step_runs_under_the_decoders_attention_kernels(monkeypatch):
    """The serving engine's steps (prefill and decode) ask gpt.generation's decode_kernels, as the
    Decoder's do (on CUDA, torch's own kernel choice cost 36-52 ms at each new key length)."""
    import gpt.serve.engine as engine_module
    from gpt.generation import decode_kernels

    entered: list[str] = []
    monkeypatch.setattr(engine_module, "decode_kernels", lambda device: entered.append(device.type) or decode_kernels(device))
    model, tok = _model(), CharTokenizer(list(ALPHABET))
    engine = Engine(model, tok, max_batch=2)
    try:
        job, got = _job(tok, ["ROMEO:"], max_new_tokens=5)
        assert engine.submit(job) and got.done.wait(10)
    finally:
        engine.close()
    assert len(entered) >= 5 and set(entered) == {"cpu"}  # one a step: the prompt's and each token's
