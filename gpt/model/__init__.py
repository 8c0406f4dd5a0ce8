"""A decoder-only GPT, readable top to bottom: gpt/config/model.py (GPTConfig: the shape and the
block's options, declared once for the settings and the model), layers.py (norms, feed-forward networks, position tables), attention.py (causal self-attention,
the KV cache), gpt.py (the block and the model).

    tokens -> token embedding (+ positional embedding) -> dropout
           -> n_layer x Block( x + attn(norm_1(x)); x + mlp(norm_2(x)) )
           -> final norm -> LM head (tied to the token embedding, or its own) -> logits

By default this is GPT-2's block (LayerNorm, a GELU MLP, learned positions, biases, a tied
head). Each option of GPTConfig swaps one piece for today's small-model choice: RMSNorm,
SwiGLU or ReLU-squared MLPs, RoPE, grouped-query attention, QK-norm, no biases, an untied
head, logit soft-capping; Llama's block is rmsnorm + swiglu + rope + bias=false + an untied head.

Positions enter either as a table added to the token embeddings (learned, as in GPT-2, or
fixed sinusoids, as in the original Transformer), as rotations of queries and keys inside
attention (RoPE), or not at all (causal masking alone still lets a model infer order).

No Hydra and no file I/O here: the model is built from a plain `GPTConfig` so it can be used
from a notebook, a test or another framework.
"""

from gpt.config.model import ATTENTION_IMPLS, MLPS, NORMS, POS_ENCODINGS, GPTConfig
from gpt.model.attention import CausalSelfAttention
from gpt.model.gpt import GPT, Block, next_token_loss
from gpt.model.layers import MLP, RMSNorm, SwiGLU, apply_rope, make_mlp, make_norm, rope_tables, sinusoidal_table

__all__ = [
    "ATTENTION_IMPLS",
    "MLPS",
    "NORMS",
    "POS_ENCODINGS",
    "GPTConfig",
    "GPT",
    "Block",
    "CausalSelfAttention",
    "KVCache",
    "MLP",
    "RMSNorm",
    "SwiGLU",
    "apply_rope",
    "make_mlp",
    "make_norm",
    "next_token_loss",
    "rope_tables",
    "sinusoidal_table",
]


def __getattr__(name: str):
    if name == "KVCache":  # decoding's: a training run never loads it
        from gpt.model.cache import KVCache

        return KVCache
    raise AttributeError(f"module 'gpt.model' has no attribute {name!r}")
