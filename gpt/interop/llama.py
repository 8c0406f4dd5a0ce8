"""The Llama block in Hugging Face's format, in and out: LlamaForCausalLM (SmolLM2, TinyLlama,
the Llama 3.2 shapes without their RoPE scaling) and its two close relatives, Qwen2 (biases on
q, k and v) and Qwen3 (QK-norm, an explicit head_dim).

The mapping: embed_tokens -> wte; per layer input_layernorm -> ln_1, q/k/v_proj stacked into
c_attn, o_proj -> c_proj, q_norm / k_norm -> the same, post_attention_layernorm -> ln_2,
gate/up/down_proj -> c_gate / c_fc / c_proj; norm -> ln_f; lm_head (absent when tied).
transformers' Llama rotates the two halves of each head (rotate_half), as gpt.model does:
no permutation of q and k is needed (that is only for Meta's original interleaved checkpoints).
"""

from __future__ import annotations

from pathlib import Path

import torch

from gpt.errors import TinyGPTError
from gpt.interop import hf
from gpt.model import GPT, GPTConfig
from gpt.runtime import io

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# What loading does with every field of transformers' LlamaConfig, Qwen2Config and Qwen3Config
# (a test keeps this complete for the installed transformers), so that no folder loads into a
# model that computes something else than transformers would:
# - read into the model (the shape, the norm, RoPE's base, biases, tying);
READ = (
    *("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"),
    *("num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_parameters"),
    *("rope_scaling", "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act"),
)
# - read and refused unless they leave the math as it is: what each would change;
REFUSED = {
    "pretraining_tp": (1, "a sliced linear layer computation of Meta's pretraining, not the weights'"),
    "use_sliding_window": (False, "sliding-window attention"),
    "layer_types": (None, "layers of other attention types than full attention"),
}
# - no effect on the logits in eval: dropout (training only; `dropout` replaces it), the sliding
#   window's size and layers when use_sliding_window is off, initialisation, token ids,
#   generation and output options, bookkeeping.
NO_EFFECT = (
    *("attention_dropout", "sliding_window", "max_window_layers", "initializer_range", "use_cache"),
    *("bos_token_id", "eos_token_id", "pad_token_id", "output_hidden_states", "output_attentions", "return_dict"),
    *("id2label", "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder"),
    *("dtype", "torch_dtype", "architectures", "transformers_version", "_name_or_path"),
)


def _rope(folder: Path, config: dict) -> float:
    """RoPE's base. transformers 5 writes rope_parameters, earlier versions rope_theta and
    rope_scaling; any scaling (llama3, linear, dynamic, yarn, ...) changes the angles and is
    refused by name."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling")
    kind = params.get("rope_type", "default") if isinstance(params, dict) else params
    if scaling not in (None, {}) or kind != "default":
        shown = scaling if scaling not in (None, {}) else params
        raise TinyGPTError(
            f"{folder}: config.json has rope scaling {shown!r}; tinygpt's RoPE has no scaled frequencies, "
            f"so it cannot load this model"
        )
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0)) if isinstance(params, dict) else 10000.0)


def _config(folder: Path, config: dict, dropout: float) -> GPTConfig:
    family = config.get("model_type")

    def refuse(field: str, what: str) -> None:
        raise TinyGPTError(
            f"{folder}: config.json has {field}={config.get(field)!r} ({what}); tinygpt's GPT has no equivalent, "
            f"so it cannot load this model"
        )

    if config.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", "a gated MLP with another activation than SiLU")
    for field, (same, what) in REFUSED.items():
        value = config.get(field, same)
        if field == "layer_types" and value is not None and all(t == "full_attention" for t in value):
            continue
        if value != same:
            refuse(field, what)
    # Biases: Qwen2 has them on q, k and v only; Llama and Qwen3 on attention (q, k, v and o)
    # and on the MLP as two flags, which tinygpt's one `bias` covers only when they agree.
    attention_bias, mlp_bias = bool(config.get("attention_bias", False)), bool(config.get("mlp_bias", False))
    if family != "qwen2" and attention_bias != mlp_bias:
        refuse("attention_bias", f"biases in attention but not the MLP, or the reverse (mlp_bias={mlp_bias})")
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return GPTConfig(
        vocab_size=config["vocab_size"],
        vocab_multiple=1,  # the folder's tables, row for row
        block_size=config.get("max_position_embeddings", 2048),
        n_layer=config["num_hidden_layers"],
        n_head=heads,
        n_embd=hidden,
        dropout=dropout,
        bias=attention_bias if family != "qwen2" else False,
        qkv_bias=True if family == "qwen2" else None,
        pos_encoding="rope",
        n_kv_head=kv_heads if kv_heads != heads else None,
        rope_theta=_rope(folder, config),
        norm="rmsnorm",
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        mlp="swiglu",
        mlp_hidden=config["intermediate_size"],
        qk_norm=family == "qwen3",
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        head_dim=head_dim if head_dim * heads != hidden else None,
    )


def check(folder: Path, config: dict) -> None:
    """Refuse what tinygpt's GPT does not compute (see _config), weights unread."""
    _config(folder, config, 0.0)


def _names(i: int) -> dict[str, str]:
    """Hugging Face's names of layer i's tensors -> ours (q, k and v are stacked apart)."""
    ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
    return {
        f"{theirs}input_layernorm.weight": f"{ours}ln_1.weight",
        f"{theirs}post_attention_layernorm.weight": f"{ours}ln_2.weight",
        f"{theirs}self_attn.o_proj.weight": f"{ours}attn.c_proj.weight",
        f"{theirs}self_attn.o_proj.bias": f"{ours}attn.c_proj.bias",
        f"{theirs}self_attn.q_norm.weight": f"{ours}attn.q_norm.weight",
        f"{theirs}self_attn.k_norm.weight": f"{ours}attn.k_norm.weight",
        f"{theirs}mlp.gate_proj.weight": f"{ours}mlp.c_gate.weight",
        f"{theirs}mlp.up_proj.weight": f"{ours}mlp.c_fc.weight",
        f"{theirs}mlp.down_proj.weight": f"{ours}mlp.c_proj.weight",
        f"{theirs}mlp.gate_proj.bias": f"{ours}mlp.c_gate.bias",
        f"{theirs}mlp.up_proj.bias": f"{ours}mlp.c_fc.bias",
        f"{theirs}mlp.down_proj.bias": f"{ours}mlp.c_proj.bias",
    }


GLOBAL = {"model.embed_tokens.weight": "transformer.wte.weight", "model.norm.weight": "transformer.ln_f.weight"}


def load(folder: Path, config: dict, dropout: float = 0.0, mapped: bool = False) -> tuple[GPT, dict | None]:
    """Our GPT with the weights of the LlamaForCausalLM (or Qwen2/Qwen3) in `folder`, and the dict
    form of its tokenizer (gpt.interop.hf.tokenizer_for)."""
    model_config = _config(folder, config, dropout)
    theirs = hf.read_state_dict(folder)
    names = dict(GLOBAL)
    for i in range(model_config.n_layer):
        names.update(_names(i))
    state = {names[k]: v for k, v in theirs.items() if k in names}
    used = set(names) | {"lm_head.weight"}
    for i in range(model_config.n_layer):  # Q, K, V stacked into one matmul, as c_attn computes them
        for kind in ("weight", "bias"):
            keys = [f"model.layers.{i}.self_attn.{p}_proj.{kind}" for p in "qkv"]
            used.update(keys)
            if all(k in theirs for k in keys):
                state[f"transformer.h.{i}.attn.c_attn.{kind}"] = torch.cat([theirs[k] for k in keys])
    if model_config.tie_embeddings:
        head = theirs.get("lm_head.weight")
        if head is not None and not torch.equal(head, state.get("transformer.wte.weight")):
            raise TinyGPTError(f"{folder}: tie_word_embeddings=true but lm_head.weight differs from the token embedding")
        state["lm_head.weight"] = state.get("transformer.wte.weight")  # one matrix, under both names
    elif "lm_head.weight" in theirs:
        state["lm_head.weight"] = theirs["lm_head.weight"]
    # (rotary_emb.inv_freq: a buffer old transformers saved, recomputed from rope_theta here)
    unknown = sorted(k for k in theirs if k not in used and not k.endswith("rotary_emb.inv_freq"))
    if unknown:
        raise TinyGPTError(f"{folder} holds weights a {config.get('model_type')} model has no place for: {unknown[:3]}")
    model = hf.build(model_config, state, folder, ARCHITECTURES.get(config.get("model_type"), "Llama"), mapped)
    return model, hf.tokenizer_for(folder, model_config.vocab_size)


def family_of(c: GPTConfig) -> str:
    """Which of transformers' classes computes this model: qwen3 with QK-norm, qwen2 with biases
    on q, k and v alone, else llama."""
    if c.qk_norm:
        return "qwen3"
    if c.qkv_bias and not c.bias:
        return "qwen2"
    return "llama"


def cannot_export(c) -> str | None:
    """What of this model's config the Llama family has no place for, in words; None if nothing."""
    if not isinstance(c, GPTConfig):
        return f"it is a recurrent model ({getattr(c, 'arch', type(c).__name__)}), and Llama is a transformer"
    needs = {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "logit_softcap": None}
    for name, value in needs.items():
        if getattr(c, name) != value:
            return f"model.{name}={getattr(c, name)} (Llama's block has {name}={value})"
    if c.bias and not c.qkv_bias:
        return "model.qkv_bias=false with model.bias=true (Llama's attention_bias puts biases on q, k, v and o alike)"
    if c.qk_norm and (c.bias or c.qkv_bias):
        return "model.bias or model.qkv_bias with model.qk_norm (Qwen3, the class with QK-norm, has no such biases here)"
    return None


def export(model: GPT, tokenizer, out: Path) -> str:
    """Write `model` (and its tokenizer's files) as a Hugging Face folder of the class that
    computes it (family_of), which AutoModelForCausalLM loads with identical logits. Returns
    the class's name."""
    c = model.config
    family = family_of(c)
    theirs_of = {ours: theirs for theirs, ours in GLOBAL.items()}
    for i in range(c.n_layer):
        theirs_of.update({ours: theirs for theirs, ours in _names(i).items()})
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    state = {}
    for key, value in hf.unpadded_state(model).items():
        if key == "lm_head.weight":
            if not c.tie_embeddings:
                state[key] = value
        elif ".attn.c_attn." in key:  # one stacked matmul -> q, k and v projections
            layer, kind = key.split(".")[2], key.rsplit(".", 1)[1]
            for name, part in zip("qkv", value.split([q_dim, kv_dim, kv_dim])):
                state[f"model.layers.{layer}.self_attn.{name}_proj.{kind}"] = part
        else:
            state[theirs_of[key]] = value
    hf.write_weights(out, state)
    eot = getattr(tokenizer, "eot_id", None)
    config = {
        "model_type": family,
        "architectures": [ARCHITECTURES[family]],
        "vocab_size": c.vocab_size,
        "hidden_size": c.n_embd,
        "intermediate_size": c.mlp_hidden,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.block_size,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,  # read by transformers 4; 5 reads rope_parameters
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "tie_word_embeddings": c.tie_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "use_cache": True,
    }
    if family != "qwen2":
        config.update(attention_bias=c.bias, mlp_bias=c.bias)
    if family in ("qwen2", "qwen3"):
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=c.n_layer)
    io.write_json(out / "config.json", config, indent=2)
    hf.write_tokenizer(tokenizer, out, c.block_size)
    return ARCHITECTURES[family]
