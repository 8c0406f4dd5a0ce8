"""gpt/interop/llama.py: Llama-format models (LlamaForCausalLM, Qwen2, Qwen3) in and out, against
transformers' own classes in float32: logits, greedy generation with and without the cache,
an import -> export round trip bitwise, the exported folder in AutoModelForCausalLM; each
plausible mistake (RMSNorm's eps, SwiGLU's gate, RoPE's base and pairing, QK-norm's place)
planted and seen to move the logits; every config field accounted for; refusals in one line.
Run: pytest tests/interop/test_llama.py"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config  # noqa: E402

from gpt import interop  # noqa: E402
from gpt.checkpoints import loading  # noqa: E402
from gpt.config import SamplingSettings  # noqa: E402
from gpt.errors import TinyGPTError  # noqa: E402
from gpt.generation import Decoder  # noqa: E402
from gpt.interop import llama  # noqa: E402
from gpt.model import layers  # noqa: E402

TOL = 1e-5
SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    rope_theta=500.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
# SmolLM2-135M's shape (its context cut to 64 positions: the tables' length changes nothing else)
SMOLLM2 = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=64,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
FAMILIES = {
    "llama": lambda **kw: LlamaConfig(**{**SMALL, **kw}),
    "llama_biased": lambda **kw: LlamaConfig(**{**SMALL, "attention_bias": True, "mlp_bias": True, **kw}),  # q, k, v, o, MLP
    "llama_tied": lambda **kw: LlamaConfig(**{**SMALL, "tie_word_embeddings": True, **kw}),
    "qwen2": lambda **kw: Qwen2Config(**{**SMALL, **kw}),  # biases on q, k, v
    "qwen3": lambda **kw: Qwen3Config(**{**SMALL, "head_dim": 16, **kw}),  # QK-norm, head_dim != hidden / heads
}


def _random(config) -> torch.nn.Module:
    """transformers' model with weights far from init (~0.3) and norm gains 1 +- 0.3: at 0.02 a
    wrong formula hides below the tolerance."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.3) if "norm" in name else p.normal_(0.0, 0.3)
    return model


def _saved(tmp_path, config, name="hf"):
    hf = _random(config)
    hf.save_pretrained(tmp_path / name)
    return hf, tmp_path / name


def _diff(ours, hf, idx) -> float:
    with torch.no_grad():
        return (ours.eval()(idx)[0] - hf(idx).logits).abs().max().item()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_llama_family_model_loads_with_transformers_logits(tmp_path, family):
    hf, folder = _saved(tmp_path, FAMILIES[family]())
    ours, tokenizer = interop.load(str(folder))
    assert tokenizer is None  # no tokenizer files in this folder
    c = ours.config
    assert (c.norm, c.mlp, c.pos_encoding, c.rope_theta, c.n_kv_head) == ("rmsnorm", "swiglu", "rope", 500.0, 2)
    assert c.tie_embeddings == (family == "llama_tied") and c.qk_norm == (family == "qwen3")
    assert c.qkv_bias == (family in ("qwen2", "llama_biased")) and c.bias == (family == "llama_biased")
    assert _diff(ours, hf, torch.randint(0, 64, (3, 32))) <= TOL


def test_smollm2_135m_shape_loads_with_transformers_logits(tmp_path):
    hf, folder = _saved(tmp_path, LlamaConfig(**SMOLLM2))
    ours, _ = interop.load(str(folder))
    idx = torch.randint(0, 49152, (2, 24))
    assert ours.num_params() == sum(p.numel() for p in hf.parameters()) == 134_515_008
    assert _diff(ours, hf, idx) <= TOL
    _same_greedy(ours, hf, [[5, 17, 2003], [44]], 8)


def _same_greedy(ours, hf, prompts, n) -> None:
    """Our decoder (with and without the KV cache) and transformers' generate (with and without
    its cache) pick the same greedy tokens."""
    runs = []
    for kv_cache in (True, False):
        settings = SamplingSettings(max_new_tokens=n, temperature=0.0, kv_cache=kv_cache)
        decoder = Decoder(ours.eval(), prompts, settings, [0] * len(prompts))
        runs.append(torch.stack([decoder.step() for _ in range(n)], dim=1).tolist())
    assert runs[0] == runs[1]
    for i, prompt in enumerate(prompts):
        for use_cache in (True, False):
            out = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=n,
                do_sample=False,
                use_cache=use_cache,
                eos_token_id=None,
                pad_token_id=0,
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            )
            assert out[0, len(prompt) :].tolist() == runs[0][i], (prompt, use_cache)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_generation_equals_transformers_generate(tmp_path, family):
    hf, folder = _saved(tmp_path, FAMILIES[family]())
    ours, _ = interop.load(str(folder))
    _same_greedy(ours, hf, [[1, 2, 3, 4, 5], [9], [60, 61]], 20)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_import_then_export_is_bitwise_and_loads_in_transformers(tmp_path, family):
    hf, folder = _saved(tmp_path, FAMILIES[family]())
    ours, _ = interop.load(str(folder))
    from gpt.tokenizers import ByteTokenizer

    out, cls = interop.export(ours, ByteTokenizer(), tmp_path / "out")
    assert cls == llama.ARCHITECTURES[family.split("_")[0]]
    from safetensors.torch import load_file

    original, written = load_file(str(folder / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(original) == set(written) and all(torch.equal(original[k], written[k]) for k in original)
    again = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(again).__name__ == cls
    idx = torch.randint(0, 64, (2, 32))
    with torch.no_grad():
        assert torch.equal(again(idx).logits, hf(idx).logits)
    back, tokenizer = interop.load(str(out))
    assert tokenizer == ByteTokenizer().to_dict()  # tinygpt_tokenizer.json travels with the model
    with torch.no_grad():
        assert torch.equal(back(idx)[0], ours(idx)[0])


def test_a_model_trained_with_the_llama_block_exports_to_llama(tmp_path):
    """A tinygpt model of Llama's block (not imported): AutoModelForCausalLM computes its logits."""
    from gpt.model import GPT, GPTConfig
    from gpt.tokenizers import CharTokenizer

    torch.manual_seed(0)
    shape = dict(vocab_size=20, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, mlp_hidden=40)
    block = dict(norm="rmsnorm", mlp="swiglu", pos_encoding="rope", bias=False, tie_embeddings=False)
    ours = GPT(GPTConfig(**shape, **block)).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.normal_(1.0, 0.3) if "ln_" in name else p.normal_(0.0, 0.3)
    out, cls = interop.export(ours, CharTokenizer(list("abcdefghijklmnopqrst")), tmp_path / "out")
    assert cls == "LlamaForCausalLM" and json.loads((out / "config.json").read_text())["intermediate_size"] == 40
    idx = torch.randint(0, 20, (2, 16))
    assert _diff(ours, AutoModelForCausalLM.from_pretrained(out).eval(), idx) <= TOL


def test_every_config_field_is_read_refused_or_without_effect():
    """A field transformers honours that loading ignored would load a model that computes
    something else; a new transformers version that adds one fails here."""
    known = {*llama.READ, *llama.REFUSED, *llama.NO_EFFECT}
    for config in (LlamaConfig(), Qwen2Config(), Qwen3Config()):
        assert set(config.to_dict()) - known == set(), type(config).__name__


def test_a_tokenizer_json_beside_the_model_is_its_tokenizer(tmp_path):
    """A Hub folder's tokenizer.json becomes an `hf` tokenizer; sample and eval can then use it."""
    from gpt.tokenizers.bpe import train_bpe

    bpe = train_bpe(["hello world, the world says hello " * 20], 300)
    hf, folder = _saved(tmp_path, LlamaConfig(**{**SMALL, "vocab_size": 320}))
    (folder / "tokenizer.json").write_text(bpe.json_text)
    loaded = loading.load(str(folder))
    assert loaded.tokenizer_spec["kind"] == "hf" and loaded.tokenizer().encode("hello world") == bpe.encode("hello world")


# --- planted mistakes: each must move the logits far beyond the tolerance ---------------------


def _eps_outside_the_root(monkeypatch):
    def forward(self, x):
        h = x.float()
        return self.weight * (h / (torch.sqrt(h.pow(2).mean(-1, keepdim=True)) + self.eps)).to(x.dtype)

    monkeypatch.setattr(layers.RMSNorm, "forward", forward)


def _gate_and_up_swapped(monkeypatch):
    real = llama._names

    def names(i):
        out = real(i)
        gate, up = f"model.layers.{i}.mlp.gate_proj.weight", f"model.layers.{i}.mlp.up_proj.weight"
        out[gate], out[up] = out[up], out[gate]
        return out

    monkeypatch.setattr(llama, "_names", names)


def _interleaved_pairs(monkeypatch):
    """Meta's original RoPE: neighbouring channels (x_2i, x_2i+1) rotate together."""

    def apply_rope(x, cos, sin):
        pairs = x.unflatten(-1, (-1, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)

    monkeypatch.setattr("gpt.model.attention.apply_rope", apply_rope)


def _qk_norm_after_rope(monkeypatch):
    from gpt.model import attention

    real_forward, real_rope = attention.CausalSelfAttention.forward, attention.apply_rope

    def forward(self, x, *args, **kwargs):
        norms, calls = (self.q_norm, self.k_norm), []

        def rope_then_norm(t, cos, sin):
            calls.append(1)
            return norms[len(calls) - 1](real_rope(t, cos, sin))

        self.q_norm, self.k_norm = None, None
        monkeypatch.setattr(attention, "apply_rope", rope_then_norm)
        try:
            return real_forward(self, x, *args, **kwargs)
        finally:
            self.q_norm, self.k_norm = norms
            monkeypatch.setattr(attention, "apply_rope", real_rope)

    monkeypatch.setattr(attention.CausalSelfAttention, "forward", forward)


MUTATIONS = {
    "RMSNorm's eps outside the square root": ("llama", _eps_outside_the_root),
    "SwiGLU's gate and up swapped": ("llama", _gate_and_up_swapped),
    "RoPE's theta doubled": ("llama", lambda mp: mp.setattr(llama, "_rope", lambda folder, config: 1000.0)),
    "RoPE's pairs interleaved, not halves": ("llama", _interleaved_pairs),
    "QK-norm after RoPE instead of before": ("qwen3", _qk_norm_after_rope),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_logit_comparison_catches_planted_mistakes(tmp_path, monkeypatch, mutation):
    family, plant = MUTATIONS[mutation]
    hf, folder = _saved(tmp_path, FAMILIES[family](rms_norm_eps=0.1))  # an eps that matters
    idx = torch.randint(0, 64, (3, 32))
    with torch.no_grad():
        expected = hf(idx).logits  # before any patch: transformers must stay right
    ours, _ = interop.load(str(folder))
    assert _diff(ours, hf, idx) <= TOL  # right before the plant
    plant(monkeypatch)
    ours, _ = interop.load(str(folder))
    with torch.no_grad():
        moved = (ours.eval()(idx)[0] - expected).abs().max().item()
    assert moved > 10 * TOL, f"{mutation} moved the logits by {moved:.2e} only"


# --- refusals: one line each, nothing written ------------------------------------------------


@pytest.mark.parametrize(
    "field, value, named",
    [
        (
            "rope_scaling",
            {
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "rope scaling",
        ),
        ("rope_parameters", {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}, "rope scaling"),
        ("hidden_act", "gelu", "hidden_act='gelu'"),
        ("pretraining_tp", 2, "pretraining_tp=2"),
        ("attention_bias", True, "attention_bias=True"),
        ("use_sliding_window", True, "use_sliding_window=True"),
        ("model_type", "mistral", "'mistral' model"),
    ],
)
def test_what_tinygpt_does_not_compute_is_refused_by_name(tmp_path, field, value, named):
    _, folder = _saved(tmp_path, LlamaConfig(**SMALL))
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(TinyGPTError, match=named.replace("(", r"\(").replace("[", r"\[")) as e:
        interop.load(str(folder))
    assert "\n" not in str(e.value)


def test_a_folder_with_a_missing_shard_is_one_line(tmp_path):
    hf = _random(LlamaConfig(**SMALL))
    hf.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    shards = sorted((tmp_path / "hf").glob("model-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    ours, _ = interop.load(str(tmp_path / "hf"))  # sharded, all there: loads
    assert _diff(ours, hf, torch.randint(0, 64, (1, 8))) <= TOL
    shards[1].unlink()
    with pytest.raises(TinyGPTError, match=f"lacks {shards[1].name}, a shard its model.safetensors.index.json lists") as e:
        loading.load(str(tmp_path / "hf"))
    assert "\n" not in str(e.value)


def test_what_llamas_format_lacks_is_named_and_the_export_takes_tinygpts_own(tmp_path):
    """Blocks no transformers class computes: Llama's family names the setting it lacks, and the
    export is tinygpt's own form instead (tests/interop/test_tinygpt.py checks its logits)."""
    from gpt.interop import llama
    from gpt.model import GPT, GPTConfig
    from gpt.tokenizers import ByteTokenizer

    for n, (options, named) in enumerate(
        (
            (dict(norm="rmsnorm", mlp="relu2", pos_encoding="rope"), "Llama's block has mlp=swiglu"),
            (dict(norm="rmsnorm", pos_encoding="rope", mlp="swiglu", logit_softcap=30.0), "logit_softcap"),
            (
                dict(norm="rmsnorm", mlp="swiglu", pos_encoding="rope", qk_norm=True),
                "model.bias or model.qkv_bias with model.qk_norm",
            ),
        )
    ):
        model = GPT(GPTConfig(vocab_size=256, block_size=8, n_layer=1, n_head=2, n_embd=8, **options))
        assert named in llama.cannot_export(model.config)
        _, cls = interop.export(model, ByteTokenizer(), tmp_path / f"out{n}")
        assert cls.startswith("TinyGPTForCausalLM")
