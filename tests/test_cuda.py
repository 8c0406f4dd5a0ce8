"""What only a CUDA GPU can show of the GPU path: the kernels and dtypes CUDA picks (flash
attention in bf16, cuDNN's RNNs under autocast), the serving engine and generation on the
device, and how often generation makes the host wait for it. Each test skips, saying why,
where no CUDA GPU is visible; what a CPU can prove of the same code is tested beside it
(tests/test_rnn.py, tests/test_generation.py, tests/serve/test_engine.py, tests/test_compile.py).

Run on a machine with a GPU:  pytest -m cuda tests/test_cuda.py
(the `cuda` marker selects these tests from the whole suite: pytest -m cuda)

Keep it tidy for the next test: tiny models built by the helpers below (on the GPU), one
section per part of the code, one GPU; a test of more than a few seconds also carries `slow`."""

from __future__ import annotations

import contextlib
import threading
import warnings

import pytest
import torch

from gpt.config import SamplingSettings
from gpt.generation import Decoder, draw, generate
from gpt.model import GPT, GPTConfig
from gpt.model.rnn import RecurrentLM, RNNConfig, RNNState
from gpt.tokenizers import CharTokenizer
from helpers import weight_cast_counter

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False here)"),
]

CUDA = torch.device("cuda")
ALPHABET = "\n !',.:;?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def tiny_gpt(block_size: int = 32, scale: float = 10.0, **kw) -> GPT:
    """A random 2-layer GPT on the GPU, over ALPHABET's characters, in fp32. `scale` multiplies
    the weights so that outputs depend on the context (at GPT-2's init scale an untrained model
    repeats one token, and a cache bug would hide; as in tests/test_generation.py)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(ALPHABET), block_size=block_size, n_layer=2, n_head=2, n_embd=32, **kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model.to(CUDA)


def char_tokenizer() -> CharTokenizer:
    return CharTokenizer(list(ALPHABET))


def bf16_autocast():
    return torch.autocast("cuda", dtype=torch.bfloat16)


# --- attention: the flash kernel in bf16 ---------------------------------------------------------


def test_the_default_models_attention_runs_on_flash_attention_in_bf16():
    """The default model (configs/config.yaml's, gpt-micro-modern: RoPE, QK-norm) under bf16
    autocast, with SDPA restricted to the flash kernel: the training forward and backward run
    (SDPA raises "No available kernel" when flash cannot take its inputs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gpt.apps.common import compose
    from gpt.model import registry

    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("flash attention needs SM 80 or newer")
    torch.manual_seed(0)
    model = GPT(registry.with_vocab(compose("config", []).model, 257)).to(CUDA).train()
    idx = torch.randint(0, 257, (4, model.config.block_size), device=CUDA)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), bf16_autocast():
        _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]), bf16_autocast():
        logits, _ = model.eval()(idx)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


# --- recurrent models under autocast -------------------------------------------------------------


@pytest.mark.parametrize("arch", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("impl", ["fused", "explicit"])
def test_recurrent_models_train_under_bf16_autocast_with_the_recurrence_in_fp32(arch, impl):
    """cuDNN's RNNs under CUDA autocast run in fp16 whatever the autocast dtype (with no loss
    scaling under bf16); gpt/model/rnn.py keeps the recurrence in fp32: the state and the
    outputs handed to the LM head are fp32 and equal those computed without autocast, and a few
    training steps give finite, falling losses."""
    torch.manual_seed(0)
    model = RecurrentLM(RNNConfig(arch=arch, vocab_size=32, n_layer=2, n_embd=32, n_hidden=64, impl=impl)).to(CUDA)
    idx = torch.randint(0, 32, (8, 24), device=CUDA)
    seen = []
    hook = model.lm_head.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    plain, mixed = RNNState(), RNNState()
    with torch.no_grad():
        model.eval()(idx, cache=plain)
        with bf16_autocast():
            model(idx, cache=mixed)
    hook.remove()
    assert seen[1].dtype == mixed.h.dtype == torch.float32
    assert torch.allclose(seen[1], seen[0], atol=1e-5) and torch.allclose(mixed.h, plain.h, atol=1e-5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for _ in range(20):
        with bf16_autocast():
            _, loss = model(idx[:, :-1], idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


# --- generation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(), dict(pos_encoding="rope", n_kv_head=1), dict(attention="manual")])
def test_generation_with_and_without_the_cache_agree_on_cuda(kw):
    """Greedy and seeded sampling, through the KV cache and without it, past the context
    (40 new tokens, block_size 16), for padded rows of a batch."""
    model = tiny_gpt(block_size=16, **kw)
    for controls in (dict(temperature=0.0), dict(temperature=1.0, top_k=20, seed=5)):
        runs = []
        for kv_cache in (True, False):
            cfg = SamplingSettings(max_new_tokens=40, kv_cache=kv_cache, **controls)
            decoder = Decoder(model, [[5, 9, 2, 7, 1], [3]], cfg, seeds=[cfg.seed, cfg.seed + 1])
            runs.append(torch.stack([decoder.step() for _ in range(40)], dim=1))
        assert torch.equal(*runs), controls
        assert len(set(runs[0][0].tolist())) >= 8  # a varied sequence, so the comparison means something


def test_the_batched_draw_is_the_per_row_multinomial_draw_on_cuda():
    """gpt.generation.draw takes the token torch.multinomial would, from each row's own CUDA
    generator (the same ATen algorithm as on the CPU), so a seed samples the same text as
    before the batched draw."""
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(4, 50304, device=CUDA) * 3, dim=-1)
    ours, theirs = ([torch.Generator(device=CUDA).manual_seed(s) for s in range(4)] for _ in range(2))
    for _ in range(5):
        expected = torch.cat([torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(theirs)])
        assert torch.equal(draw(probs, ours), expected)


@pytest.mark.parametrize("penalty", [1.0, 1.3])  # with a penalty the seen-table is updated every token too
def test_generation_reads_back_from_the_gpu_once_every_few_tokens(penalty):
    """With CUDA's sync debug mode on, each operation that makes the host wait for the GPU
    warns: 64 sampled tokens for 3 rows make a few such waits (the set-up, one read every 8
    tokens: gpt.generation.read_every), not several per row and token."""
    model, tok = tiny_gpt(block_size=128), char_tokenizer()
    cfg = SamplingSettings(max_new_tokens=64, temperature=1.0, top_k=20, stop_at_eot=False, repetition_penalty=penalty)
    generate(model, tok, ["ROMEO:"], cfg)  # warm-up: CUDA context, kernels, allocator
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            texts = generate(model, tok, ["ROMEO:"], cfg, num_samples=3)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    waits = [w for w in caught if "synchronizing" in str(w.message)]
    assert all(len(t) == 64 for t in texts[0])
    assert len(waits) <= 64 // 8 + 8, [str(w.message) for w in waits[:20]]


@pytest.mark.slow  # inductor compiles a few graphs: tens of seconds
def test_a_compiled_model_generates_what_the_eager_one_does_on_cuda():
    """sample.py's compile=true with inductor on the GPU: greedy text equals eager text, and
    a longer generation after it compiles nothing new (no recompile per token)."""
    from gpt.generation import compile_for_generation

    model, tok = tiny_gpt(block_size=64), char_tokenizer()
    cfg = SamplingSettings(max_new_tokens=20, temperature=0.0)
    eager = generate(model, tok, ["ROMEO:", "a"], cfg)
    torch.compiler.reset()
    try:
        compile_for_generation(model)
        assert generate(model, tok, ["ROMEO:", "a"], cfg) == eager
        from torch._dynamo.utils import counters

        before = counters["stats"]["unique_graphs"]
        generate(model, tok, ["KING:", "b"], SamplingSettings(max_new_tokens=40, temperature=0.0))
        assert counters["stats"]["unique_graphs"] == before
    finally:
        torch.compiler.reset()


# --- serving -------------------------------------------------------------------------------------


def test_the_serving_engine_decodes_on_cuda_casting_each_weight_once():
    """The continuous-batching engine on the GPU under bf16 autocast gives each request what
    gpt.generation gives it under the same autocast, and casts each fp32 weight to bf16 once
    while it is busy, not once per token."""
    pytest.importorskip("fastapi")
    from gpt.serve.engine import Engine, Job

    model, tok = tiny_gpt(block_size=64), char_tokenizer()
    casts: dict[int, int] = {}

    def autocast():
        stack = contextlib.ExitStack()
        stack.enter_context(bf16_autocast())
        stack.enter_context(weight_cast_counter(model, casts))
        return stack

    texts, ended, finished = ["", ""], [], threading.Event()

    def emit(events):
        for e in events:
            if e[0] == "text":
                texts[e[1]] += e[2]
            elif e[0] == "end":
                ended.append(e[1])
            else:
                raise AssertionError(e)
        if len(ended) == 2:
            finished.set()

    settings = SamplingSettings(max_new_tokens=30, temperature=0.0)
    engine = Engine(model, tok, max_batch=4, autocast=autocast)
    try:
        assert engine.submit(Job([tok.encode("ROMEO:"), tok.encode("KING:")], settings, 1, emit=emit))
        assert finished.wait(60)
    finally:
        engine.close()
    assert casts and max(casts.values()) == 1, casts
    with bf16_autocast():
        want = generate(model, tok, ["ROMEO:", "KING:"], settings)
    assert texts == [want[0][0], want[1][0]]


# --- the training path: padded vocabulary, the head's chunked loss, pinned copies, the step -----


def test_the_padded_vocabulary_and_the_chunked_head_loss_on_cuda(monkeypatch):
    """GPT-2's 50257 tokens in 50304 rows: the logits are 50257 wide, and the chunked head loss
    (what 16 x 1024 rows take) equals the plain one under bf16 autocast, gradients included."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50257, vocab_multiple=64, block_size=64, n_layer=2, n_head=2, n_embd=64)
    model = GPT(config).to(CUDA)
    assert model.lm_head.weight.shape[0] == 50304
    x = torch.randint(0, 50257, (4, 64), device=CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, _ = model(x)
        assert logits.shape[-1] == 50257
        _, plain = model(x, x)
    plain.backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    monkeypatch.setattr(GPT, "LOSS_CHUNK_ELEMENTS", 64 * 50304)  # 64 rows a chunk
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, chunked = model(x, x)
    chunked.backward()
    assert torch.allclose(plain, chunked, atol=1e-3)
    for a, p in zip(plain_grads, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-3, rtol=1e-2)


def test_batches_are_copied_from_pinned_memory_without_waiting(monkeypatch):
    """Text windows and conversations reach the GPU through pinned host memory, asynchronously."""
    import numpy as np

    from gpt.chat.template import ChatTokenizer
    from gpt.data.chat import ChatSplit, ConversationBatches
    from gpt.data.loader import RandomWindows
    from gpt.tokenizers import ByteTokenizer

    pinned = []
    real = torch.Tensor.pin_memory
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, *a, **k: pinned.append(t.shape) or real(t, *a, **k))
    windows = RandomWindows(np.arange(5000, dtype=np.uint16), 64, 8, CUDA, seed=0)
    x = windows.next().x
    tok = ChatTokenizer(ByteTokenizer())
    rendered = [tok.render([{"role": "user", "content": "q" * i}, {"role": "assistant", "content": "a"}]) for i in range(1, 30)]
    split = ChatSplit(
        np.array([i for ids, _ in rendered for i in ids], dtype=np.uint16),
        np.array([m for _, ms in rendered for m in ms], dtype=np.uint8),
        np.concatenate([[0], np.cumsum([len(ids) for ids, _ in rendered])]),
    )
    conversations = ConversationBatches(split, 128, 4, CUDA, seed=0)
    cx = conversations.next().x
    assert x.is_cuda and cx.is_cuda and len(pinned) == 3  # one window tensor, then x and y of the conversations
    assert cx.size(1) % 64 == 0 or cx.size(1) == 128


def test_a_training_step_skips_a_non_finite_update_without_a_host_sync():
    """The step's verdict stays on the device: a NaN step is skipped with no sync in between."""
    from types import SimpleNamespace

    from gpt.config import MuonSettings
    from gpt.data.loader import Batch
    from gpt.runtime import devices
    from gpt.training.optim import build_optimizer
    from gpt.training.parallel import Parallel
    from gpt.training.step import Guard, apply_or_skip, train_step

    rt = devices.setup("cuda", "bfloat16", False)
    model = tiny_gpt(scale=1.0)
    optimizer = build_optimizer(model, MuonSettings(), rt.device)
    x = torch.randint(0, len(ALPHABET), (4, 32), device=CUDA)

    class Same:
        def next(self):
            return Batch(x, x, tokens=x.numel())

    scaler = torch.amp.GradScaler("cuda", enabled=False)
    run = SimpleNamespace(
        model=model,
        scaler=scaler,
        optimizer=optimizer,
        rt=rt,
        dist=SimpleNamespace(enabled=False),
        progress=SimpleNamespace(step=0),
        parallel=Parallel(),  # whole
    )
    guard = Guard()
    before = [p.detach().clone() for p in model.parameters()]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        result = train_step(model, Same(), optimizer, scaler, rt, 1, 1.0)
        result.loss = result.loss * float("nan")
        apply_or_skip(run, result, guard)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert guard.pending[0][1].item() == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _fsdp2_losses(shard: bool, offload: bool, steps: int = 6) -> tuple[list[float], set[str]]:
    """`steps` AdamW steps of a tiny GPT under bf16 autocast, as the trainer computes them, sharded
    by parallel.shard (FSDP2's bf16 mixed precision on CUDA) or whole; the losses, and the devices
    the parameters (their local shards) live on."""
    from gpt.runtime import devices
    from gpt.training import parallel

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(ALPHABET), block_size=32, n_layer=2, n_head=2, n_embd=32))
    model = model if offload else model.to(CUDA)
    if shard:
        model = parallel.shard(model, devices.Runtime(CUDA, torch.bfloat16, compile=False), offload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, len(ALPHABET), (4, 32), generator=torch.Generator().manual_seed(1)).to(CUDA)
    losses = []
    for _ in range(steps):
        with bf16_autocast():
            _, loss = model(x, x.roll(-1, dims=1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, {parallel.local(p).device.type for p in model.parameters()}


def test_fsdp2_on_one_gpu_trains_as_the_whole_model_with_and_without_cpu_offload(tmp_path):
    """gpt.training.parallel on CUDA (NCCL for the GPU's tensors, gloo for the host's, as
    distributed.init sets up for cpu_offload, at world size 1): bf16 mixed precision gathers bf16
    weights and reduces fp32 gradients, and the fp32 shards step as the whole model's weights do,
    within bf16's rounding (FSDP2 also runs the norms in bf16, autocast in fp32); with offload
    the shards live in host memory and the optimizer steps them there, as FSDP2 without it."""
    import torch.distributed as dist

    dist.init_process_group("cuda:nccl,cpu:gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        whole, on_whole = _fsdp2_losses(shard=False, offload=False)
        sharded, on_gpu = _fsdp2_losses(shard=True, offload=False)
        offloaded, on_host = _fsdp2_losses(shard=True, offload=True)
    finally:
        dist.destroy_process_group()
    assert on_whole == on_gpu == {"cuda"} and on_host == {"cpu"}
    assert whole[-1] < whole[0] - 0.2, whole  # it learns: the comparison below is not of constants
    assert max(abs(a - b) for a, b in zip(whole, sharded)) < 0.05, (whole, sharded)
    assert max(abs(a - b) for a, b in zip(sharded, offloaded)) < 1e-3, (sharded, offloaded)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="distributed Muon on NCCL needs two GPUs")
def test_distributed_muon_on_nccl(tmp_path):
    """tests/training/test_muon_ddp.py's check (each rank orthogonalises its share; the update
    equals one process's) over NCCL, one GPU a rank."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    test = Path(__file__).parent / "training" / "test_muon_ddp.py"
    env = {**os.environ, "TINYGPT_MUON_DDP_BACKEND": "nccl"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", str(test)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_training_batches_are_prefetched_on_a_stream_of_their_own():
    """gpt.data.loader.Prefetched on CUDA: the batch handed out was copied on its own stream one
    step ahead, equals the plain stream's once the compute stream has waited for it, and a
    checkpoint's loader state resumes at the batch held ahead."""
    import numpy as np

    from gpt.data.loader import Prefetched, RandomWindows

    tokens = np.arange(50_000, dtype=np.uint16)
    plain = RandomWindows(tokens, 256, 8, CUDA, seed=1)
    ahead = Prefetched(RandomWindows(tokens, 256, 8, CUDA, seed=1), CUDA)
    for _ in range(4):
        got = ahead.next().x
        assert got.is_cuda and torch.equal((got * 1).cpu(), plain.next().x.cpu())  # read through the compute stream
    resumed = RandomWindows(tokens, 256, 8, CUDA, seed=7)
    resumed.load_state_dict(ahead.state_dict())
    assert torch.equal(resumed.next().x.cpu(), plain.next().x.cpu())
