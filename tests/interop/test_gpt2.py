"""gpt/interop/gpt2.py: GPT-2 weights in and out in Hugging Face's format, checked against
transformers' own GPT2LMHeadModel. Run: pytest tests/interop/test_gpt2.py"""

from __future__ import annotations

import functools
import re

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from gpt import interop  # noqa: E402
from gpt.errors import TinyGPTError  # noqa: E402
from gpt.interop import gpt2  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.tokenizers import CharTokenizer, TiktokenTokenizer  # noqa: E402


def export_hf(model, tokenizer, out):
    return interop.export(model, tokenizer, out)[0]


def load_hf_gpt2(source):
    return interop.load(source)


def _random_hf(vocab=64, **config) -> GPT2LMHeadModel:
    """A small GPT-2 with weights far from the default 0.02 init (weights and biases ~0.3, LayerNorm
    gains ~1 +- 0.3), so a wrong activation, a missing transpose or a lost scale moves the logits by
    far more than the comparisons' tolerance (at 0.02 a wrong GELU moved them by 1.5e-8)."""
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=vocab,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=4,
        initializer_range=0.3,
        bos_token_id=0,
        eos_token_id=0,
        **{"activation_function": "gelu_new", **config},
    )
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" in name and name.endswith("weight"):
                p.normal_(1.0, 0.3)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.3)
    return model


def _logits_diff(ours, hf, idx) -> float:
    with torch.no_grad():
        return (ours.eval()(idx)[0] - hf(idx).logits).abs().max().item()


TOL = 1e-5  # the right loader is within 1.4e-6 on these logits (magnitude ~10)


@pytest.mark.parametrize("safetensors", [True, False])
def test_hf_gpt2_loads_with_identical_logits(tmp_path, safetensors):
    hf = _random_hf()
    hf.save_pretrained(tmp_path, safe_serialization=safetensors)
    ours, tokenizer = load_hf_gpt2(str(tmp_path))
    assert tokenizer is None  # a 64-token vocabulary is not GPT-2's
    assert ours.config.activation == "gelu_tanh" and ours.config.n_head == 4
    assert _logits_diff(ours, hf, torch.randint(0, 64, (3, 16))) <= TOL


def _random_ours(activation="gelu_tanh") -> GPT:
    """Our GPT with the same far-from-init weights as `_random_hf`."""
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32, activation=activation)).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "ln_" in name and name.endswith("weight"):
                p.normal_(1.0, 0.3)
            else:
                p.normal_(0.0, 0.3)
    return ours


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_export_loads_in_transformers_with_identical_logits(tmp_path, activation):
    ours = _random_ours(activation)
    export_hf(ours, CharTokenizer([chr(32 + i) for i in range(65)]), tmp_path)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path).eval()  # transformers' own forward pass, not a round trip
    idx = torch.randint(0, 65, (3, 16))
    assert _logits_diff(ours, hf, idx) <= TOL
    back, tokenizer = load_hf_gpt2(str(tmp_path))  # our own export comes back with its tokenizer
    assert tokenizer["kind"] == "char" and torch.equal(back(idx)[0], ours(idx)[0])


def test_gpt2_tokenizer_files_match_tiktoken(tmp_path, gpt2_ranks):
    """Same ids both ways, "<|endoftext|>" spelt out in the text included: ordinary text for
    tinygpt and, through the exported tokenizer_config.json, for transformers too."""
    from transformers import AutoTokenizer, GPT2Tokenizer

    tok = TiktokenTokenizer("gpt2")
    export_hf(GPT(GPTConfig(vocab_size=50257, block_size=8, n_layer=1, n_head=1, n_embd=8)), tok, tmp_path)
    text = "Hello world! To be, or not to be: that is the question.\n  Ünïcödé 日本語 🦜 1234 <|endoftext|>The end"
    ours = tok.encode(text)
    assert tok.eot_id not in ours and len(tok.encode("<|endoftext|>")) == 7
    for hf_tok in (GPT2Tokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)):
        assert hf_tok.encode(text) == ours
        assert hf_tok.decode(ours) == text and tok.decode(hf_tok.encode(text)) == text
        assert hf_tok.eos_token_id == tok.eot_id == 50256  # generation still stops on the id
        assert hf_tok.decode([50256]) == tok.decode([50256]) == "<|endoftext|>"


@pytest.mark.parametrize(
    "config, cause",
    [
        ({"pos_encoding": "rope"}, "model.pos_encoding=rope"),
        ({"pos_encoding": "sinusoidal"}, "model.pos_encoding=sinusoidal"),
        ({"pos_encoding": "none"}, "model.pos_encoding=none"),
        ({"n_kv_head": 1}, "model.n_kv_head=1 (grouped-query attention"),
        ({"bias": False}, "model.bias=false"),
    ],
)
def test_what_gpt2s_format_lacks_is_named(config, cause):
    """A block GPT-2's format cannot hold is named by its setting (the export then takes another
    family's form: tests/interop/test_tinygpt.py)."""
    c = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8, **config)
    assert cause in gpt2.cannot_export(c)


@pytest.mark.parametrize("arch", ["lstm", "gru"])
def test_a_recurrent_model_is_refused_at_export(tmp_path, arch):
    from gpt.model import registry

    settings = {"arch": arch, "vocab_size": 16, "block_size": 8, "n_layer": 1, "n_embd": 8, "n_hidden": 8}
    model = registry.build(registry.config_from_dict(settings))
    with pytest.raises(TinyGPTError, match=re.escape(f"recurrent model ({arch})")):
        export_hf(model, CharTokenizer(list("abcdefghijklmnop")), tmp_path)
    assert not any(tmp_path.iterdir())  # refused before writing


def test_offline_gpt2_download_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(TinyGPTError, match="cannot download gpt2.*config.json"):
        load_hf_gpt2("gpt2")


def test_hub_layout_with_unprefixed_keys_and_mask_buffers(tmp_path):
    """The files on the Hub for gpt2 predate transformers' current layout: keys without the
    `transformer.` prefix, attention-mask buffers, pytorch_model.bin."""
    hf = _random_hf()
    state = {}
    for key, value in hf.state_dict().items():
        if key == "lm_head.weight":
            continue
        state[key.removeprefix("transformer.")] = value
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 16, 16))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    hf.config.to_json_file(tmp_path / "config.json")
    ours, _ = load_hf_gpt2(str(tmp_path))
    assert _logits_diff(ours, hf, torch.randint(0, 64, (2, 16))) <= TOL


def test_every_gpt2_config_field_is_read_refused_or_without_effect():
    """A field transformers honours that loading ignored would load a model that computes
    something else; a new transformers version that adds one fails here."""
    known = {*gpt2._READ, *gpt2._GPT2_ONLY, *gpt2._NO_EFFECT}
    assert set(GPT2Config().to_dict()) - known == set()


@pytest.mark.parametrize(
    "field, value",
    [
        ("scale_attn_weights", False),
        ("scale_attn_by_inverse_layer_idx", True),
        ("add_cross_attention", True),
        ("activation_function", "relu"),
    ],
)
def test_variants_tinygpt_does_not_compute_are_refused_by_name(tmp_path, field, value):
    hf = _random_hf(**{field: value})
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():  # the variant does compute something else in transformers
        assert (hf(idx).logits - _random_hf()(idx).logits).abs().max().item() > 100 * TOL
    hf.save_pretrained(tmp_path)
    with pytest.raises(TinyGPTError, match=f"{field}={value!r}") as e:
        load_hf_gpt2(str(tmp_path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "config",
    [
        {"activation_function": "gelu"},
        {"activation_function": "gelu_pytorch_tanh"},
        {"activation_function": "gelu_fast"},
        {"n_inner": 128},
        {"n_inner": 48},
        {"layer_norm_epsilon": 1e-3},
        {"tie_word_embeddings": False},
        {"reorder_and_upcast_attn": True},
        {"resid_pdrop": 0.5, "embd_pdrop": 0.5, "attn_pdrop": 0.5},
    ],
)
def test_accepted_variants_load_with_identical_logits(tmp_path, config):
    hf = _random_hf(**config)
    hf.save_pretrained(tmp_path)
    ours, _ = load_hf_gpt2(str(tmp_path))
    assert _logits_diff(ours, hf, torch.randint(0, 64, (3, 16))) <= TOL


def _swap_layer_norms(model):
    for block in model.transformer.h:
        block.ln_1, block.ln_2 = block.ln_2, block.ln_1


def _swap_queries_and_keys(model):
    with torch.no_grad():
        w = model.transformer.h[0].attn.c_attn.weight
        q, k = w[:32].clone(), w[32:64].clone()
        w[:32], w[32:64] = k, q


def _shift_positions(model):
    with torch.no_grad():
        model.transformer.wpe.weight.copy_(model.transformer.wpe.weight.roll(1, dims=0))


MUTATIONS = {
    "exact GELU for GPT-2's tanh GELU": lambda mp, m: mp.setitem(gpt2._ACTIVATIONS, "gelu_new", "gelu"),
    "square attn.c_proj not transposed": lambda mp, m: mp.setattr(
        gpt2, "_TRANSPOSED", tuple(t for t in gpt2._TRANSPOSED if t != "attn.c_proj.weight")
    ),
    "no 1/sqrt(d) attention scale": lambda mp, m: mp.setattr(
        torch.nn.functional, "scaled_dot_product_attention", functools.partial(SDPA, scale=1.0)
    ),
    "ln_1 and ln_2 swapped": lambda mp, m: m.append(_swap_layer_norms),
    "queries and keys swapped": lambda mp, m: m.append(_swap_queries_and_keys),
    "positions off by one": lambda mp, m: m.append(_shift_positions),
}
SDPA = torch.nn.functional.scaled_dot_product_attention


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_logit_comparison_catches_planted_loader_bugs(tmp_path, monkeypatch, mutation):
    """The comparison above is only worth its tolerance if each plausible mistake breaks it."""
    hf = _random_hf()
    hf.save_pretrained(tmp_path)
    idx = torch.randint(0, 64, (3, 16))
    with torch.no_grad():
        expected = hf(idx).logits  # before any patch: transformers must stay right
    after_load = []
    MUTATIONS[mutation](monkeypatch, after_load)
    ours, _ = load_hf_gpt2(str(tmp_path))
    for mutate in after_load:
        mutate(ours)
    with torch.no_grad():
        diff = (ours.eval()(idx)[0] - expected).abs().max().item()
    assert diff > 10 * TOL, f"{mutation} moved logits by {diff:.2e} only"


def test_the_export_comparison_catches_a_symmetric_transpose_bug(tmp_path, monkeypatch):
    """Exporting and importing with the same wrong list of transposed matrices round-trips
    exactly; only transformers' forward pass shows it."""
    monkeypatch.setattr(gpt2, "_TRANSPOSED", tuple(t for t in gpt2._TRANSPOSED if t != "attn.c_proj.weight"))
    ours = _random_ours()
    export_hf(ours, CharTokenizer([chr(32 + i) for i in range(65)]), tmp_path)
    idx = torch.randint(0, 65, (3, 16))
    back, _ = load_hf_gpt2(str(tmp_path))
    with torch.no_grad():
        assert torch.equal(back(idx)[0], ours(idx)[0])  # the round trip cannot see it
    assert _logits_diff(ours, GPT2LMHeadModel.from_pretrained(tmp_path), idx) > 10 * TOL


class _Exploit:
    def __reduce__(self):
        import os

        return (os.system, ("touch pwned",))


def test_a_damaged_or_hostile_weights_file_is_one_line(tmp_path, monkeypatch):
    """init_from=<folder> whose model.safetensors is cut short or garbage, or whose
    pytorch_model.bin is a pickle that would run code: refused in one line that never suggests
    weights_only=False, and nothing runs."""
    import pickle

    from gpt.checkpoints import loading
    from helpers import corrupted_variants

    monkeypatch.chdir(tmp_path)
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8))
    folder = export_hf(model, CharTokenizer(list("abcdefghijklmnop")), tmp_path / "hf")
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    refused = []
    for kind, data in corrupted_variants(good, 30):
        weights.write_bytes(data)
        try:
            loading.load(str(folder))  # safetensors has no checksum: a flipped weight byte loads
        except TinyGPTError as e:
            assert "\n" not in str(e) and "weights_only" not in str(e), str(e)
            refused.append(kind)
    assert refused.count("cut") == 10
    weights.unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Exploit()}))
    with pytest.raises(TinyGPTError, match="pytorch_model.bin") as e:
        loading.load(str(folder))
    assert "weights_only" not in str(e.value) and not (tmp_path / "pwned").exists()
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(TinyGPTError, match="config.json is not a JSON object"):
        loading.load(str(folder))
