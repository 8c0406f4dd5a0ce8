"""GPT-2 in Hugging Face's format (config.json + weights of a GPT2LMHeadModel), in and out.

Hugging Face's GPT-2 stores its projections as `Conv1D` layers, whose weights are the transpose
of an `nn.Linear`'s; everything else maps one to one. OpenAI's GPT-2 uses the tanh
approximation of GELU, so imported models get `activation="gelu_tanh"`.
"""

from __future__ import annotations

from pathlib import Path

from gpt.errors import TinyGPTError
from gpt.interop import hf
from gpt.model import GPT, GPTConfig
from gpt.runtime import io

HUB_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# transformers' names of the two GELUs tinygpt's GPT implements (gelu_new, gelu_pytorch_tanh and
# gelu_fast are the same tanh approximation).
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu": "gelu"}

# What loading does with every field of transformers' GPT2Config (a test keeps this complete
# for the installed transformers), so that no folder loads into a model that computes something
# else than transformers would:
# - read into the model (the shape, the activation) or checked against it (the rest);
_READ = (
    *("model_type", "vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "activation_function"),
    *("n_inner", "layer_norm_epsilon", "tie_word_embeddings"),
)
# - forward-pass variants tinygpt's GPT does not implement: any value but GPT-2's is refused;
_GPT2_ONLY = {
    "scale_attn_weights": (True, "attention scores without the 1/sqrt(head_dim) scale"),
    "scale_attn_by_inverse_layer_idx": (False, "attention scores also divided by the layer index + 1"),
    "add_cross_attention": (False, "cross-attention layers over an encoder's output"),
}
# - no effect on a GPT2LMHeadModel's logits in eval: dropout (training only; `dropout` replaces
#   it), initialisation, other tasks' heads, generation and output options, bookkeeping, and
#   reorder_and_upcast_attn (the same attention, computed in fp32: tinygpt loads into fp32).
_NO_EFFECT = (
    *("resid_pdrop", "embd_pdrop", "attn_pdrop", "initializer_range", "reorder_and_upcast_attn"),
    *("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout"),
    *("id2label", "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder"),
    *("use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "output_hidden_states", "output_attentions"),
    *("return_dict", "dtype", "torch_dtype", "architectures", "transformers_version", "_name_or_path"),
)


def load(folder: Path, config: dict, dropout: float = 0.0, mapped: bool = False) -> tuple[GPT, dict | None]:
    """Our GPT with the weights of the Hugging Face GPT-2 in `folder` (its config.json read as
    `config`), and the dict form of its tokenizer (gpt.interop.hf.tokenizer_for)."""
    check(folder, config)
    model_config = GPTConfig(
        vocab_size=config["vocab_size"],
        vocab_multiple=1,  # the folder's tables, row for row
        block_size=config.get("n_positions", config.get("n_ctx", 1024)),
        n_layer=config["n_layer"],
        n_head=config["n_head"],
        n_embd=config["n_embd"],
        dropout=dropout,
        bias=True,
        activation=_ACTIVATIONS[config.get("activation_function", "gelu_new")],
        norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        mlp_hidden=config.get("n_inner") or None,  # None: GPT-2's 4 x n_embd
        tie_embeddings=bool(config.get("tie_word_embeddings", True)),
    )
    state = {}
    for key, value in hf.read_state_dict(folder).items():
        key = key if key.startswith("transformer.") or key.startswith("lm_head.") else f"transformer.{key}"
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers of old checkpoints, not weights
        state[key] = value.t() if key.endswith(_TRANSPOSED) else value
    if model_config.tie_embeddings:
        hf.tie_head(state, folder)
    model = hf.build(model_config, state, folder, "GPT-2", mapped)
    return model, hf.tokenizer_for(folder, model_config.vocab_size, gpt2_vocab=True)


def check(folder: Path, config: dict) -> None:
    """One line naming the first config field whose value tinygpt's GPT does not compute."""

    def refuse(field: str, what: str) -> None:
        raise TinyGPTError(
            f"{folder}: config.json has {field}={config[field]!r} ({what}); tinygpt's GPT has no equivalent, so it cannot load this model"
        )

    if config.get("activation_function", "gelu_new") not in _ACTIVATIONS:
        refuse("activation_function", f"tinygpt implements {', '.join(_ACTIVATIONS)}")
    for field, (gpt2_value, what) in _GPT2_ONLY.items():
        if config.get(field, gpt2_value) != gpt2_value:
            refuse(field, what)


def export(model: GPT, tokenizer, out: Path) -> None:
    """Write `model` (and its tokenizer's files) as a Hugging Face GPT-2 folder that
    `GPT2LMHeadModel.from_pretrained(out)` loads with identical logits (see `cannot_export`)."""
    c = model.config
    state = {}
    for key, value in hf.unpadded_state(model).items():
        if key == "lm_head.weight" and c.tie_embeddings:
            continue  # tied to transformer.wte.weight
        state[key] = value.t() if key.endswith(_TRANSPOSED) else value
    hf.write_weights(out, state)
    eot = getattr(tokenizer, "eot_id", None)
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_ctx": c.block_size,
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": None if c.mlp_hidden == 4 * c.n_embd else c.mlp_hidden,
        "activation_function": "gelu_new" if c.activation == "gelu_tanh" else "gelu",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": c.norm_eps,
        "initializer_range": 0.02,
        "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "scale_attn_weights": True,
        "use_cache": True,
    }
    io.write_json(out / "config.json", config, indent=2)
    hf.write_tokenizer(tokenizer, out, c.block_size)


def cannot_export(c) -> str | None:
    """What of this model's config GPT-2's format has no place for, in words; None if nothing."""
    if not isinstance(c, GPTConfig):
        return f"it is a recurrent model ({getattr(c, 'arch', type(c).__name__)}), and GPT-2 is a transformer"
    if c.pos_encoding != "learned":
        return f"model.pos_encoding={c.pos_encoding} (GPT-2 adds a learned position table; pos_encoding=learned)"
    if c.n_kv_head != c.n_head:
        return f"model.n_kv_head={c.n_kv_head} (grouped-query attention; GPT-2 has as many key/value heads as query heads)"
    if not c.bias:
        return "model.bias=false (GPT-2's linear layers and LayerNorms have biases)"
    if not c.qkv_bias:
        return "model.qkv_bias=false (GPT-2's q, k and v have biases like its other layers)"
    gpt2 = GPTConfig()
    for name in ("norm", "mlp", "qk_norm", "logit_softcap"):
        if getattr(c, name) != getattr(gpt2, name):
            return f"model.{name}={getattr(c, name)} (GPT-2's block has {name}={getattr(gpt2, name)})"
    if c.head_dim * c.n_head != c.n_embd:
        return f"model.head_dim={c.head_dim} (GPT-2's heads split n_embd)"
    return None
