"""gpt/generation/__init__.py: KV cache equivalence, sampling controls, stop strings, streaming, batching.
Run: pytest tests/test_generation.py"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from gpt.config import SamplingSettings
from gpt.errors import TinyGPTError
from gpt.generation import (
    Decoder,
    TextStream,
    decode_safe,
    filter_logits,
    generate,
    keep_typical,
    next_tokens,
    penalize_repeats,
    stream,
)
from gpt.model import GPT, GPTConfig
from gpt.tokenizers import ByteTokenizer, CharTokenizer

ALPHABET = "\n !',.:;?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _model(attention="sdpa", block_size=16, vocab=len(ALPHABET), **kw) -> GPT:
    """A random model with weights large enough that its outputs depend on the context (at
    GPT-2's init scale an untrained model repeats one token, and any cache bug would hide)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=vocab, block_size=block_size, n_layer=2, n_head=2, n_embd=32, attention=attention, **kw)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10)
    return model


def _tokens(model, prompts, use_cache, n=40, **kw):
    cfg = SamplingSettings(max_new_tokens=n, kv_cache=use_cache, **{"temperature": 0.0, **kw})
    dec = Decoder(model, prompts, cfg, seeds=[cfg.seed] * len(prompts))
    return torch.stack([dec.step() for _ in range(n)], dim=1)


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
@pytest.mark.parametrize("prompt_len", [3, 16])  # shorter than and as long as the context
def test_greedy_with_cache_equals_without(attention, prompt_len):
    model = _model(attention)
    prompt = torch.randint(0, len(ALPHABET), (prompt_len,)).tolist()
    # 40 new tokens run far past block_size 16, through the sliding window.
    cached = _tokens(model, [prompt], True)
    assert torch.equal(cached, _tokens(model, [prompt], False))
    assert len(set(cached[0].tolist())) >= 8  # a varied sequence, so the comparison means something


@pytest.mark.parametrize(
    "kw",
    [
        dict(pos_encoding="rope"),
        dict(pos_encoding="sinusoidal"),
        dict(n_kv_head=1),
        dict(pos_encoding="rope", n_kv_head=1, attention="manual"),
    ],
)
def test_cache_logits_match_full_recompute_for_every_variant(kw):
    """Step by step, the cached logits equal those of the plain forward pass over each row's
    window (kv_cache=false), also across the slide past block_size and for padded rows. In
    float64 the two agree exactly here (in float32 they differ by 1.6e-5 relative: rounding)."""
    model = _model(**kw).double()
    prompts = [[5, 9, 2, 7, 1], [3]]
    cfg_c = SamplingSettings(max_new_tokens=30, temperature=0.0, kv_cache=True)
    cfg_n = SamplingSettings(max_new_tokens=30, temperature=0.0, kv_cache=False)
    a, b = Decoder(model, prompts, cfg_c, [0, 0]), Decoder(model, prompts, cfg_n, [0, 0])
    for _ in range(30):
        with torch.no_grad():
            la, lb = a._next_logits(), b._next_logits()
        assert (la - lb).abs().max().item() < 1e-12 * (1 + lb.abs().max().item())
        nxt = la.argmax(-1)  # advance both with the same tokens
        for d in (a, b):
            d.tokens = torch.cat([d.tokens, nxt[:, None]], dim=1)


def test_prompt_longer_than_context_keeps_its_tail(caplog):
    model = _model()
    tok = CharTokenizer(list(ALPHABET))
    long_prompt = "to be or not to be, that is the question"
    cfg = SamplingSettings(max_new_tokens=10, temperature=0.0)
    with caplog.at_level(logging.WARNING, logger="tinygpt"):
        out = generate(model, tok, [long_prompt], cfg)[0][0]
    assert "sees only the last 16" in caplog.text
    assert out == generate(model, tok, [long_prompt[-16:]], cfg)[0][0]


def test_seeded_sampling_same_with_and_without_cache():
    model = _model()
    prompt = [1, 2, 3]
    a = _tokens(model, [prompt], True, temperature=1.0, top_k=20, seed=5)
    b = _tokens(model, [prompt], False, temperature=1.0, top_k=20, seed=5)
    c = _tokens(model, [prompt], True, temperature=1.0, top_k=20, seed=6)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_top_k_one_is_greedy():
    model = _model()
    greedy = _tokens(model, [[4, 5]], True)
    assert torch.equal(_tokens(model, [[4, 5]], True, temperature=1.3, top_k=1), greedy)


def test_top_p_and_min_p_keep_exactly_the_right_tokens():
    # Powers of two: exact in binary, so the boundaries below are exact too.
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]], dtype=torch.float64)
    logits = probs.log()
    kept = lambda out: torch.isfinite(out[0]).nonzero().flatten().tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_p=0.5)) == [0]  # 0.5 alone reaches 0.5
    assert kept(filter_logits(logits, top_p=0.6)) == [0, 1]
    assert kept(filter_logits(logits, top_p=0.75)) == [0, 1]  # 0.5 + 0.25 reaches 0.75
    assert kept(filter_logits(logits, top_p=0.76)) == [0, 1, 2]
    assert kept(filter_logits(logits, top_p=1.0)) == [0, 1, 2, 3, 4]
    assert kept(filter_logits(logits, min_p=0.25)) == [0, 1, 2]  # >= 0.125 = 0.25 * 0.5
    assert kept(filter_logits(logits, min_p=0.26)) == [0, 1]
    assert kept(filter_logits(logits, min_p=0.125)) == [0, 1, 2, 3, 4]
    assert kept(filter_logits(logits, top_k=2)) == [0, 1]
    shuffled = logits[:, [3, 0, 4, 2, 1]]  # order in the vocabulary must not matter
    assert kept(filter_logits(shuffled, top_p=0.75)) == [1, 4]


def test_typical_p_keeps_the_tokens_nearest_the_expected_surprise():
    """p = (0.5, 0.3, 0.2): entropy H = 1.0297 nats; |-log p - H| = 0.337, 0.174, 0.580, so the
    ranking is token 1, token 0, token 2 (not the probability order)."""
    logits = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64).log()
    kept = lambda out: torch.isfinite(out[0]).nonzero().flatten().tolist()  # noqa: E731
    assert kept(keep_typical(logits, 0.3)) == [1]  # token 1 alone holds 0.3
    assert kept(keep_typical(logits, 0.31)) == [0, 1]
    assert kept(keep_typical(logits, 0.8)) == [0, 1]
    assert kept(keep_typical(logits, 0.81)) == [0, 1, 2]
    assert kept(keep_typical(logits, 0.01)) == [1]  # the nearest always stays
    assert kept(keep_typical(logits[:, [2, 0, 1]], 0.8)) == [1, 2]  # order in the vocabulary does not matter
    after_top_k = filter_logits(logits, top_k=2)  # tokens filtered before stay out, and count as 0
    assert kept(keep_typical(after_top_k, 1.0)) == [0, 1]
    settings = SamplingSettings(temperature=1.0, typical_p=0.25)
    draws = [next_tokens(logits.float(), settings, None, [torch.Generator().manual_seed(s)]).item() for s in range(20)]
    assert draws == [1] * 20  # every control is applied where tokens are drawn
    with pytest.raises(TinyGPTError, match=r"typical_p must be in \(0, 1\]"):
        SamplingSettings(typical_p=0.0)


def test_typical_p_equals_transformers_typical_warper():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    for mass in (0.2, 0.5, 0.9, 0.95):
        theirs = transformers.TypicalLogitsWarper(mass)(None, logits.clone())
        assert torch.equal(torch.isfinite(keep_typical(logits, mass)), torch.isfinite(theirs)), mass


def test_stop_strings_cut_output_and_streaming_matches():
    model = _model()
    tok = CharTokenizer(list(ALPHABET))
    base = SamplingSettings(max_new_tokens=60, temperature=1.0, seed=3)
    full = generate(model, tok, ["the "], base)[0][0]
    stop = full[20:22]  # a string the unconstrained sample contains
    cut = generate(model, tok, ["the "], replace(base, stop=(stop,)))[0][0]
    assert cut == full[: full.index(stop)]
    pieces = list(stream(model, tok, "the ", replace(base, stop=(stop,))))
    assert "".join(pieces) == cut and len(pieces) > 1


def test_text_that_may_start_a_stop_string_is_held_back():
    """One row's text, token by token (char tokens here): what could begin a stop string waits
    until it is decided; a completed stop string ends the row unshown; a stop token ends it and
    releases what was held; `flush` releases it at the end."""
    tok = CharTokenizer(list("helowrdax !"))

    def pushed(row, text):
        return [row.push(i) for i in tok.encode(text)]

    row = TextStream(tok, ("world",))
    assert "".join(pushed(row, "hello wo")) == "hello "  # "wo" might begin "world"
    assert "".join(pushed(row, "x")) == "wox" and not row.done
    row = TextStream(tok, ("world",))
    assert "".join(pushed(row, "a wor")) == "a "
    assert "".join(pushed(row, "ld!")) == "" and row.done and row.emitted == "a "
    row = TextStream(tok, ("world",))
    assert "".join(pushed(row, "a wo")) == "a " and row.flush() == "wo" and not row.done
    eot = TextStream(ByteTokenizer(), ("world",))
    assert [eot.push(i) for i in b"hi wo"] == ["h", "i", " ", "", ""]
    assert eot.push(256) == "wo" and eot.done  # end-of-text: the held-back text is the row's end
    assert TextStream(ByteTokenizer(), stop_at_eot=False).push(256) == "" and not TextStream(ByteTokenizer()).done


def test_partial_utf8_is_held_back():
    class Bytes:
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    e_acute = list("é".encode())
    assert decode_safe(Bytes(), [104, e_acute[0]]) == "h"
    assert decode_safe(Bytes(), [104, *e_acute]) == "hé"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batch_of_prompts_equals_one_at_a_time(temperature):
    model = _model()
    tok = CharTokenizer(list(ALPHABET))
    prompts = ["a", "what light through yonder", "to be or not"]
    cfg = SamplingSettings(max_new_tokens=25, temperature=temperature, top_k=10, seed=11)
    together = generate(model, tok, prompts, cfg, num_samples=2)
    alone = [generate(model, tok, [p], cfg, num_samples=2)[0] for p in prompts]
    assert together == alone
    assert together[0][0] != together[0][1] or temperature == 0.0


def test_empty_prompt_starts_from_newline():
    model = _model()
    tok = CharTokenizer(list(ALPHABET))
    cfg = SamplingSettings(max_new_tokens=8, temperature=0.0)
    assert generate(model, tok, [""], cfg) == generate(model, tok, ["\n"], cfg)


def test_padded_vocabulary_ids_are_never_sampled():
    model = _model(vocab=len(ALPHABET) + 30)
    with torch.no_grad():  # make the unused ids the most likely ones
        model.lm_head.weight[len(ALPHABET) :] *= 50
    tok = CharTokenizer(list(ALPHABET))
    text = generate(model, tok, ["abc"], SamplingSettings(max_new_tokens=30, temperature=1.0, top_k=None))[0][0]
    assert len(text) == 30


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(temperature=-0.1), "temperature"),
        (dict(min_p=2.0), "min_p"),
        (dict(stop=("",)), "stop"),
        (dict(repetition_penalty=0), "repetition"),
    ],
)
def test_invalid_sampling_settings(kw, match):
    with pytest.raises(TinyGPTError, match=match):
        SamplingSettings(**kw)


def test_repetition_penalty_changes_greedy_choice():
    model = _model()
    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5]])
    seen = torch.tensor([[True, False, True, False]])
    out = penalize_repeats(logits, seen, 2.0)
    assert out.tolist() == [[1.0, 1.0, -2.0, 0.5]]  # seen: positive halved, negative doubled
    plain = _tokens(model, [[1, 2, 3]], True, n=30)
    penalised = _tokens(model, [[1, 2, 3]], True, n=30, repetition_penalty=50.0)
    assert not torch.equal(plain, penalised)
    assert len(set(penalised[0, :12].tolist())) == 12  # a huge penalty: no token twice for a while


def test_stop_strings_from_python_are_taken_as_given():
    """Escapes are a command line's matter (gpt.apps.sample); a settings object, and a copy of
    it (stream() makes one per sample), keeps its strings as they are."""
    settings = SamplingSettings(stop=["\\n", "a\nb"])
    assert settings.stop == ("\\n", "a\nb") and replace(settings, seed=2).stop == settings.stop
    assert SamplingSettings(stop="END").stop == ("END",) and SamplingSettings().stop == ()


def test_the_batched_draw_is_the_per_row_multinomial_draw():
    """One draw for all rows, each row from its own generator, takes the tokens that
    torch.multinomial would take row by row and leaves each generator where multinomial would:
    a seed samples the same text as before, and rows stay independent of their batch."""
    from gpt.generation import draw

    torch.manual_seed(0)
    for vocab in (7, 65, 50304):
        logits = torch.randn(4, vocab) * 3
        logits[1, vocab // 2 :] = float("-inf")  # filtered tokens have probability 0
        probs = torch.softmax(logits, dim=-1)
        ours, theirs = ([torch.Generator().manual_seed(s) for s in range(4)] for _ in range(2))
        for _ in range(5):
            expected = torch.cat([torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(theirs)])
            assert torch.equal(draw(probs, ours), expected)
        assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs))


def test_sampling_never_calls_multinomial(monkeypatch):
    """torch.multinomial reads two checks of its input back to the host, per row and token."""

    def refuse(*args, **kwargs):
        raise AssertionError("torch.multinomial called")

    monkeypatch.setattr(torch, "multinomial", refuse)
    text = generate(_model(), CharTokenizer(list(ALPHABET)), ["the ", "a"], SamplingSettings(max_new_tokens=10, top_k=None))
    assert all(len(t[0]) == 10 for t in text)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reading_tokens_every_few_steps_gives_the_same_text(monkeypatch, temperature):
    """On a GPU the tokens are read back every 8 steps (gpt.generation.read_every): stops
    inside a chunk, rows ending at different steps and the end of the loop give the text that
    reading every step gives, with one read per chunk."""
    import gpt.generation as generation

    model, tok = _model(), CharTokenizer(list(ALPHABET))
    cfg = SamplingSettings(max_new_tokens=30, temperature=temperature, top_k=10, seed=4)
    free = generate(model, tok, ["the ", "what light"], cfg)
    stop = free[0][0][13:15]  # ends row 0 inside a chunk; row 1 may run to max_new_tokens
    every_step = generate(model, tok, ["the ", "what light"], replace(cfg, stop=(stop,)))
    reads = []
    real = Decoder.steps
    monkeypatch.setattr(Decoder, "steps", lambda self, n, **kw: reads.append(n) or real(self, n, **kw))
    monkeypatch.setattr(generation, "read_every", lambda device: 8)
    assert generate(model, tok, ["the ", "what light"], cfg) == free and reads == [8, 8, 8, 6]
    assert generate(model, tok, ["the ", "what light"], replace(cfg, stop=(stop,))) == every_step
    assert "".join(stream(model, tok, "the ", replace(cfg, stop=(stop,)))) == every_step[0][0]


def test_a_diverged_model_is_a_one_line_error_also_when_read_every_few_steps(monkeypatch):
    import gpt.generation as generation

    model, tok = _model(), CharTokenizer(list(ALPHABET))
    with torch.no_grad():
        model.lm_head.weight[3, 0] = float("nan")
    for every in (1, 8):
        monkeypatch.setattr(generation, "read_every", lambda device, every=every: every)
        with pytest.raises(TinyGPTError, match="not finite numbers"):
            generate(model, tok, ["the "], SamplingSettings(max_new_tokens=20, temperature=1.0))
    with pytest.raises(TinyGPTError, match="not finite numbers"):
        Decoder(model, [[1, 2]], SamplingSettings(temperature=1.0), [0]).step()


@pytest.fixture
def fresh_dynamo():
    """Compiled code is cached per function, across models: start and end with none."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@pytest.mark.parametrize("block_size", [64, 16])  # 20 new tokens within the context, and past it
def test_a_compiled_model_generates_without_recompiling_per_token(fresh_dynamo, block_size):
    """sample.py's compile=true: generation traces the forward twice, for a prompt and for a
    one-token call (a one-token prompt or a step: the static cache makes them alike), never once
    per token, with no graph break, and greedy text equals the eager model's. A window re-encoded
    past the context, a prompt as long as it and caches of other lengths reuse the two graphs.
    A backend that counts what it is given stands in for inductor."""
    from torch._dynamo.utils import counters

    from gpt.generation import compile_for_generation

    model, tok = _model(block_size=block_size), CharTokenizer(list(ALPHABET))
    cfg = SamplingSettings(max_new_tokens=20, temperature=0.0)
    eager = [generate(model, tok, [p], cfg) for p in ("ROMEO:", "a")]
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compile_for_generation(model, backend=counting_backend)
    assert [generate(model, tok, [p], cfg) for p in ("ROMEO:", "a")] == eager
    assert len(graphs) == 2, len(graphs)
    longer = replace(cfg, max_new_tokens=60)
    assert generate(model, tok, ["KING:"], longer) and len(graphs) == 2  # 60 more tokens, nothing new
    whole = "ROMEO: " * block_size
    assert generate(model, tok, [whole[-block_size:]], cfg) and len(graphs) == 2
    assert not counters["graph_break"], dict(counters["graph_break"])


def _rewriting_backend(counts: list[int]):
    """What cpu_decoding_backend does minus inductor: the one-row rewrite, then the graph run
    as it is (eagerly), counting the linears replaced in each graph."""
    from gpt.generation.compiled import rows_as_reductions

    def backend(gm, example_inputs):
        counts.append(rows_as_reductions(gm))
        return gm.forward

    return backend


@pytest.mark.parametrize("kw", [{}, dict(norm="rmsnorm", pos_encoding="rope", qk_norm=True, bias=False, n_kv_head=1)])
def test_one_row_steps_run_as_reductions_and_decode_the_same(fresh_dynamo, kw):
    """On a CPU, compiled decoding replaces every linear layer of a batch-1 one-token step (4 per
    block + the head) by a multiply-and-sum; the prompt's positions and batches of several rows
    keep the matmul. Greedy tokens equal the eager model's; the logits agree within 1e-4."""
    from gpt.generation import compile_for_generation

    model = _model(**kw)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert linears == 4 * 2 + 1
    eager_one, eager_two = _tokens(model, [[1, 2, 3]], True, n=12), _tokens(model, [[1, 2, 3], [4, 5, 6]], True, n=12)
    counts: list[int] = []
    compile_for_generation(model, backend=_rewriting_backend(counts))
    assert torch.equal(_tokens(model, [[1, 2, 3]], True, n=12), eager_one)
    # the 3-token prompt: only the head, which reads the last position alone; the one-token steps: all
    assert sorted(counts) == [1, linears], counts
    counts.clear()
    assert torch.equal(_tokens(model, [[1, 2, 3], [4, 5, 6]], True, n=12), eager_two)
    assert counts and set(counts) == {0}, counts  # two rows a step: matmuls kept
    x, plain = torch.tensor([[7]]), _model(**kw)  # the same weights, not compiled
    with torch.no_grad():
        got, want = model(x, cache=_fresh_cache(model))[0], plain(x, cache=_fresh_cache(plain))[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def _fresh_cache(model):
    from gpt.model.cache import KVCache

    return KVCache(model.config.n_layer, model.config.block_size, torch.zeros(1, dtype=torch.long))


def test_the_one_row_rewrite_leaves_autocast_and_other_dtypes_alone(fresh_dynamo):
    """Under autocast the matmul's dtype is autocast's to choose (bf16 on a CPU), and a bf16 model
    reads bf16 weights: neither graph is rewritten."""
    from gpt.generation import compile_for_generation

    for dtype, autocast in ((torch.float32, True), (torch.bfloat16, False)):
        torch.compiler.reset()
        model = _model().to(dtype)
        counts: list[int] = []
        compile_for_generation(model, backend=_rewriting_backend(counts))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _tokens(model, [[1, 2, 3]], True, n=4)
        assert counts and set(counts) == {0}, (dtype, autocast, counts)


def test_autocast_inside_the_graph_keeps_its_matmuls_and_a_disabled_one_does_not():
    """A graph that enters autocast itself keeps its linears; one that enters it switched off (as
    the recurrent models do around their fp32 recurrence) still gets the rewrite."""

    def rewritten(enabled: bool) -> list[int]:
        counts: list[int] = []

        def fn(x, w):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                return torch.nn.functional.linear(x, w)

        torch.compiler.reset()
        torch.compile(fn, backend=_rewriting_backend(counts))(torch.randn(1, 8), torch.randn(4, 8))
        torch.compiler.reset()
        return counts

    assert rewritten(True) == [0] and rewritten(False) == [1]


@pytest.mark.parametrize(
    "call, expected",
    [
        (lambda x, w, b: torch.nn.functional.linear(x, w, b), 1),  # as the model calls it
        (lambda x, w, b: torch.nn.functional.linear(x, w, bias=b), 1),
        (lambda x, w, b: torch.nn.functional.linear(x, weight=w, bias=b), 0),  # an unexpected form: left alone
        (lambda x, w, b: torch.nn.functional.linear(x.to("meta"), w.to("meta"), b.to("meta")), 0),  # not a CPU tensor
        (lambda x, w, b: torch.nn.functional.linear(x.double(), w.double(), b.double()), 0),  # not fp32
        (lambda x, w, b: torch.nn.functional.linear(x, w[0]), 0),  # a 1-D weight
    ],
    ids=["positional", "bias-kwarg", "weight-kwarg", "meta", "float64", "1-d-weight"],
)
def test_the_one_row_rewrite_takes_only_cpu_fp32_matrix_calls_it_knows(fresh_dynamo, call, expected):
    counts: list[int] = []
    x, w, b = torch.randn(1, 8), torch.randn(4, 8), torch.randn(4)
    out = torch.compile(call, backend=_rewriting_backend(counts))(x, w, b)
    assert counts == [expected]
    if out.device.type == "cpu":
        assert torch.allclose(out, call(x, w, b), atol=1e-5)


def test_row_linear_is_linear():
    from gpt.generation.compiled import row_linear

    torch.manual_seed(0)
    x, w, b = torch.randn(1, 1, 48), torch.randn(80, 48), torch.randn(80)
    torch.testing.assert_close(row_linear(x, w, b), torch.nn.functional.linear(x, w, b))
    torch.testing.assert_close(row_linear(x, w), torch.nn.functional.linear(x, w))


@pytest.mark.slow
def test_compiled_cpu_decoding_with_inductor_equals_eager(fresh_dynamo, monkeypatch):
    """The real thing (inductor's C++ backend, ~30 s cold here): sample.py compile=true on a CPU
    gives the eager model's greedy tokens, batch 1 and 2."""
    import gpt.generation.compiled as compiled
    from gpt.generation import compile_for_generation

    model = _model(norm="rmsnorm", pos_encoding="rope", qk_norm=True, bias=False)
    eager = [_tokens(model, p, True, n=10) for p in ([[1, 2, 3]], [[1, 2, 3], [4, 5, 6]])]
    counts: list[int] = []
    real = compiled.rows_as_reductions
    monkeypatch.setattr(compiled, "rows_as_reductions", lambda gm: counts.append(real(gm)) or counts[-1])
    compile_for_generation(model)
    assert all(
        torch.equal(_tokens(model, p, True, n=10), e) for p, e in zip(([[1, 2, 3]], [[1, 2, 3], [4, 5, 6]]), eager, strict=True)
    )
    assert max(counts) == 4 * 2 + 1  # inductor compiled the rewritten one-token step


def test_a_decode_step_writes_no_indexed_assignment_and_tracks_seen_tokens_only_for_the_penalty():
    """An indexed assignment (aten.index_put_) makes the host wait for a CUDA device (it was one
    wait a token on an H200); the seen-table it updated is read by the repetition penalty only.
    So a decode step never calls it, and the table follows the text exactly when a penalty is set."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(str(func))
            return func(*args, **(kwargs or {}))

    model = _model()
    for penalty in (1.0, 1.3):
        cfg = SamplingSettings(max_new_tokens=6, temperature=1.0, repetition_penalty=penalty)
        dec = Decoder(model, [[1, 2, 3], [4]], cfg, seeds=[0, 1])
        calls.clear()
        with Record():
            dec.steps(6)
        assert calls and not [c for c in calls if "index_put" in c], calls
        rows = dec.tokens.tolist()
        if penalty == 1.0:
            assert not dec.seen.any()
        else:  # the prompt (padding excluded) and every token chosen since
            want = [set(rows[0]), set(rows[1][dec.pad_list[1] :])]
            assert [set(r.nonzero().flatten().tolist()) for r in dec.seen] == want


def test_decode_steps_name_their_attention_kernels_on_cuda(monkeypatch):
    """gpt.generation.decoder.DECODE_KERNELS: on CUDA a decode step runs with flash, efficient and
    math attention named (torch's own choice cost 36-52 ms at each new key length on an H200); on
    other devices nothing is changed. torch's flags are global, so this is checked without a GPU."""
    from gpt.generation import decoder as decoding

    before = (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled())
    with decoding.decode_kernels(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled()) == before
    with decoding.decode_kernels(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before[0]

    entered: list[str] = []
    real = decoding.decode_kernels
    monkeypatch.setattr(decoding, "decode_kernels", lambda device: entered.append(device.type) or real(device))
    Decoder(_model(), [[1, 2]], SamplingSettings(max_new_tokens=3), seeds=[0]).steps(3)
    assert entered == ["cpu"] * 3  # every step asks, with its device
