"""The model's GPU-facing shape, proven on the CPU: the padded vocabulary, the training forward
that keeps no (B, T, V) logits, activation checkpointing, and grouped-query attention without
copies. Run: `pytest tests/test_model_gpu_shape.py`."""

import pytest
import torch

from gpt.model import GPT, GPTConfig


def tiny(**kw) -> GPTConfig:
    base = dict(vocab_size=61, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
    return GPTConfig(**{**base, **kw})


def test_the_tables_are_padded_and_the_logits_are_not():
    config = tiny(vocab_multiple=64)
    model = GPT(config)
    assert config.padded_vocab_size == 64 and tiny().padded_vocab_size == 61
    assert model.transformer.wte.weight.shape[0] == 64 and model.lm_head.weight.shape[0] == 64
    logits, _ = model(torch.randint(0, 61, (2, 5)))
    assert logits.shape == (2, 5, 61)  # a padded id has no logit: it can never be sampled or scored


def test_padding_rows_take_no_probability_in_the_loss():
    """Padded rows with huge logits change nothing: the loss is the softmax over the true
    vocabulary only."""
    torch.manual_seed(0)
    model = GPT(tiny(vocab_multiple=64, tie_embeddings=False)).eval()
    x = torch.randint(0, 61, (2, 8))
    _, before = model(x, x)
    with torch.no_grad():
        model.lm_head.weight[61:] = 100.0
    _, after = model(x, x)
    assert torch.equal(before, after)


@pytest.mark.parametrize("softcap", [None, 15.0])
@pytest.mark.parametrize("multiple", [1, 64])
def test_the_chunked_head_loss_equals_the_plain_one(monkeypatch, softcap, multiple):
    torch.manual_seed(0)
    model = GPT(tiny(vocab_multiple=multiple, logit_softcap=softcap))
    x = torch.randint(0, 61, (3, 16))
    y = x.roll(-1, dims=1)
    y[0, :5] = -1  # untrained positions (a chat's prompt) count in neither path
    _, plain = model(x, y)
    plain.backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    monkeypatch.setattr(GPT, "LOSS_CHUNK_ELEMENTS", 7 * model.config.padded_vocab_size)  # 7 rows a chunk
    _, chunked = model(x, y)
    chunked.backward()
    assert torch.allclose(plain, chunked, atol=1e-6, rtol=1e-6)
    for a, p in zip(plain_grads, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-6, rtol=1e-5)


def test_the_training_forward_keeps_no_full_logits(monkeypatch):
    """Above LOSS_CHUNK_ELEMENTS no tensor as large as (B*T, V) is saved for the backward pass."""
    model = GPT(tiny(vocab_size=250, vocab_multiple=64))
    monkeypatch.setattr(GPT, "LOSS_CHUNK_ELEMENTS", 8 * 256)
    x = torch.randint(0, 250, (4, 16))
    largest = []

    def pack(t):
        largest.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits, loss = model(x, x)
    assert logits is None and loss.ndim == 0
    assert max(largest) < 4 * 16 * 250  # the logits of all rows were never kept


def test_activation_checkpointing_changes_memory_not_results():
    torch.manual_seed(0)
    plain = GPT(tiny())
    recomputed = GPT(tiny(activation_checkpointing=True))
    recomputed.load_state_dict(plain.state_dict())
    x = torch.randint(0, 61, (2, 16))
    saved = {}
    for name, model in (("plain", plain), ("recomputed", recomputed)):
        count: list[int] = []

        def pack(t, count=count):
            count.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _, loss = model(x, x)
        loss.backward()
        saved[name] = (sum(count), loss.detach())
    assert torch.allclose(saved["plain"][1], saved["recomputed"][1])
    for a, b in zip(plain.parameters(), recomputed.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)
    assert saved["recomputed"][0] < saved["plain"][0] / 2  # the blocks' activations are not kept


def test_grouped_query_attention_does_not_copy_keys_and_values(monkeypatch):
    """SDPA's enable_gqa reads each K/V head for its group of query heads in place."""
    model = GPT(tiny(n_head=4, n_kv_head=2, n_embd=32)).eval()

    def refuse(*a, **k):
        raise AssertionError("repeat_interleave copies the K/V heads")

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", refuse)
    logits, _ = model(torch.randint(0, 61, (1, 8)))
    assert torch.isfinite(logits).all()


def test_qk_norm_keeps_the_compute_dtype_for_the_cache():
    """Under bf16 autocast the normalised queries and keys go back to bf16: the K cache is not
    fp32 and nothing is re-cast at every generated token."""
    from gpt.model import KVCache

    model = GPT(tiny(qk_norm=True, norm="rmsnorm", pos_encoding="rope")).eval()
    cache = KVCache(2, 16, torch.zeros(1, dtype=torch.long))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randint(0, 61, (1, 4)), cache=cache)
    assert cache.k[0].dtype == torch.bfloat16 and cache.v[0].dtype == torch.bfloat16


def test_a_bad_vocab_multiple_is_one_line():
    from gpt.errors import TinyGPTError

    with pytest.raises(TinyGPTError, match="vocab_multiple must be a positive integer"):
        tiny(vocab_multiple=0)


@pytest.mark.parametrize("tied", [True, False])
def test_the_chat_templates_tokens_grow_a_bpe_table_to_a_multiple_of_64(tied):
    """GPT-2's 50257 tokens + the template's 4 make 50261: the grown tables take 50304 rows; a
    table padded already takes the new tokens in its padding."""
    from types import SimpleNamespace

    from gpt.training.finetune import add_chat_tokens

    tokenizer = SimpleNamespace(base=SimpleNamespace(vocab_size=50257), vocab_size=50261)
    model = GPT(GPTConfig(vocab_size=50257, block_size=8, n_layer=1, n_head=1, n_embd=8, tie_embeddings=tied))
    add_chat_tokens(model, tokenizer, log=lambda *_: None)
    assert model.config.vocab_size == 50261 and model.config.padded_vocab_size == 50304
    assert model.transformer.wte.weight.size(0) == model.lm_head.weight.size(0) == 50304
    assert model(torch.tensor([[50260]]))[0].shape == (1, 1, 50261)
    padded = GPT(GPTConfig(vocab_size=50257, vocab_multiple=64, block_size=8, n_layer=1, n_head=1, n_embd=8, tie_embeddings=tied))
    table = padded.transformer.wte.weight
    add_chat_tokens(padded, tokenizer, log=lambda *_: None)
    assert padded.transformer.wte.weight is table and padded.config.vocab_size == 50261
    assert torch.allclose(table[50257:50261], table[:50257].mean(0).expand(4, -1))


def test_a_gpu_s_runtime_sizes_the_chunks_from_its_memory(monkeypatch):
    """Runtime.tune gives the loss the logits a GPU has room for (an eighth of its memory at 8
    bytes an element): GPT-2 124M's 16 x 1024 rows go whole on an 80 GB device and in chunks on a
    24 GB one; a CPU keeps GPT.LOSS_CHUNK_ELEMENTS. The model follows the value it was given."""
    from types import SimpleNamespace

    from gpt.runtime.devices import Runtime

    step = 16 * 1024 * 50304
    for gib, whole in ((80, True), (24, False)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d, gib=gib: SimpleNamespace(total_memory=gib << 30))
        with torch.device("meta"):
            model = GPT(GPTConfig(vocab_size=50257, block_size=1024, n_layer=1, n_head=1, n_embd=8))
        Runtime(torch.device("cuda"), torch.bfloat16, compile=False).tune(model)
        assert (step <= model.loss_chunk_elements) == whole, gib
    model = GPT(tiny(vocab_size=250, vocab_multiple=64))
    Runtime(torch.device("cpu"), torch.float32, compile=False).tune(model)
    assert model.loss_chunk_elements is None
    chunks = []
    monkeypatch.setattr("gpt.model.gpt.checkpoint", lambda fn, *a, **k: chunks.append(1) or fn(*a))
    x = torch.randint(0, 250, (4, 16))
    model(x, x)
    assert chunks == []  # 64 rows x 256: under the CPU's limit, whole
    model.loss_chunk_elements = 16 * 256
    model(x, x)
    assert len(chunks) == 4  # 16 rows a chunk
