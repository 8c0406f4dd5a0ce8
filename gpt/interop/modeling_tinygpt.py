"""tinygpt's GPT for transformers: the modeling code an export carries (with `auto_map` in its
config.json) when no transformers class computes its block, e.g. RMSNorm + RoPE + QK-norm with a
GELU MLP. Load it with `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`.

Self-contained (torch and transformers only, no tinygpt), and the same math as tinygpt's
gpt/model/: the module names are tinygpt's, so its weights load as they are. Generation past the
context does what tinygpt does: each new token is predicted from the last block_size tokens,
encoded afresh (so `generate` gives tinygpt's text at any length).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

# the output's field for the cache: `cache` from transformers 5.2x, `past_key_values` before
_CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


class TinyGPTConfig(PretrainedConfig):
    """tinygpt's GPTConfig with its derived values resolved (n_kv_head, head_dim, mlp_hidden,
    qkv_bias are numbers here)."""

    model_type = "tinygpt"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "num_key_value_heads": "n_kv_head",
        "max_position_embeddings": "block_size",
    }

    def __init__(
        self,
        vocab_size: int = 257,
        block_size: int = 64,
        n_layer: int = 4,
        n_head: int = 4,
        n_kv_head: int = 4,
        n_embd: int = 128,
        head_dim: int = 32,
        mlp_hidden: int = 512,
        bias: bool = False,
        qkv_bias: bool = False,
        pos_encoding: str = "rope",
        rope_theta: float = 10000.0,
        norm: str = "rmsnorm",
        norm_eps: float = 1e-5,
        mlp: str = "gelu",
        activation: str = "gelu",
        qk_norm: bool = True,
        logit_softcap: float | None = None,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        **kwargs,
    ):
        self.vocab_size, self.block_size = vocab_size, block_size
        self.n_layer, self.n_head, self.n_kv_head, self.n_embd, self.head_dim = n_layer, n_head, n_kv_head, n_embd, head_dim
        self.mlp_hidden, self.bias, self.qkv_bias = mlp_hidden, bias, qkv_bias
        self.pos_encoding, self.rope_theta = pos_encoding, rope_theta
        self.norm, self.norm_eps, self.mlp, self.activation = norm, norm_eps, mlp, activation
        self.qk_norm, self.logit_softcap, self.use_cache = qk_norm, logit_softcap, use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g, in float32 and cast back before the gain."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def make_norm(config: TinyGPTConfig, dim: int) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(dim, config.norm_eps)
    return nn.LayerNorm(dim, eps=config.norm_eps, bias=config.bias)


class MLP(nn.Module):
    def __init__(self, config: TinyGPTConfig):
        super().__init__()
        self.kind = config.mlp
        if self.kind == "swiglu":
            self.c_gate = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.approximate = "tanh" if config.activation == "gelu_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            return self.c_proj(F.silu(self.c_gate(x)) * self.c_fc(x))
        h = self.c_fc(x)
        h = F.relu(h).square() if self.kind == "relu2" else F.gelu(h, approximate=self.approximate)
        return self.c_proj(h)


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * theta^(-2i/head_dim) for positions (B, T): (B, 1, T, head_dim/2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim))
    angles = positions.float()[..., None] * inv_freq
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the channel pairs (x_i, x_{i+d/2}) of x (B, H, T, d) by their positions' angles."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


def sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """The original Transformer's table at these positions (B, T): computed in float64, rounded."""
    pos = positions.to(torch.float64)[..., None]
    freq = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
    table = torch.zeros(*positions.shape, dim, dtype=torch.float64, device=positions.device)
    table[..., 0::2] = torch.sin(pos * freq)
    table[..., 1::2] = torch.cos(pos * freq)[..., : dim // 2]
    return table.float()


class Attention(nn.Module):
    def __init__(self, config: TinyGPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, q_dim + 2 * kv_dim, bias=config.qkv_bias)
        self.c_proj = nn.Linear(q_dim, config.n_embd, bias=config.bias)
        self.q_norm = make_norm(config, self.head_dim) if config.qk_norm else None
        self.k_norm = make_norm(config, self.head_dim) if config.qk_norm else None

    def forward(self, x, mask, rotary, cache) -> torch.Tensor:
        B, T, _ = x.shape
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split([q_dim, kv_dim, kv_dim], dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            q, k = apply_rope(q, *rotary), apply_rope(k, *rotary)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        if self.n_kv_head != self.n_head:
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, q_dim))


class Block(nn.Module):
    def __init__(self, config: TinyGPTConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = make_norm(config, config.n_embd)
        self.attn = Attention(config, layer_idx)
        self.ln_2 = make_norm(config, config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, mask, rotary, cache) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask, rotary, cache)
        return x + self.mlp(self.ln_2(x))


class TinyGPTPreTrainedModel(PreTrainedModel):
    config_class = TinyGPTConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["Block"]
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)


class TinyGPTForCausalLM(TinyGPTPreTrainedModel, GenerationMixin):
    # transformers 5 names the tie as a mapping, 4 as the list of tied keys
    if int(transformers.__version__.split(".")[0]) >= 5:
        _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}
    else:
        _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config: TinyGPTConfig):
        super().__init__(config)
        layers = {"wte": nn.Embedding(config.vocab_size, config.n_embd)}
        if config.pos_encoding == "learned":
            layers["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        layers["h"] = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        layers["ln_f"] = make_norm(config, config.n_embd)
        self.transformer = nn.ModuleDict(layers)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.transformer.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.transformer.wte = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, *args, **kwargs) -> dict:
        """As transformers prepares each step, until the text outgrows the context; from then on
        the last block_size tokens are encoded afresh at positions 0..block_size-1 with a new
        cache, as tinygpt generates (the model never saw a position past its context, and every
        cached key was computed at a position that has since shifted)."""
        inputs = super().prepare_inputs_for_generation(input_ids, *args, **kwargs)
        block = self.config.block_size
        if input_ids.shape[1] <= block or inputs.get("inputs_embeds") is not None:
            return inputs
        inputs["input_ids"] = input_ids[:, -block:].contiguous()
        if inputs.get("attention_mask") is not None and inputs["attention_mask"].dim() == 2:
            inputs["attention_mask"] = inputs["attention_mask"][:, -block:]
        for key in ("position_ids", "cache_position"):
            inputs.pop(key, None)
        key = "cache" if "cache" in inputs else "past_key_values"  # transformers 5.2x / earlier
        inputs[key] = DynamicCache() if inputs.get("use_cache", True) is not False else None
        return inputs

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        c = self.config
        if kwargs.get("cache") is not None:  # transformers 5.2x names the cache `cache`, earlier ones `past_key_values`
            past_key_values = kwargs["cache"]
        x = self.transformer.wte(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = x.shape[:2]
        use_cache = c.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if attention_mask is None or attention_mask.dim() != 2:
            attention_mask = torch.ones(B, past + T, dtype=torch.long, device=x.device)
        if position_ids is None:  # a row's first real token is position 0, as in tinygpt's left-padded batches
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past : past + T]
        # A query at column c sees the unpadded columns up to c; a padding query sees only itself
        # (its output is never used, but a row with nothing to attend to would turn into NaNs).
        q_col = torch.arange(past, past + T, device=x.device)
        k_col = torch.arange(past + T, device=x.device)
        mask = (k_col[None, None, :] <= q_col[None, :, None]) & attention_mask.bool()[:, None, :]
        mask = (mask | (k_col[None, None, :] == q_col[None, :, None]))[:, None]
        rotary = None
        if c.pos_encoding == "learned":
            x = x + self.transformer.wpe(position_ids)
        elif c.pos_encoding == "sinusoidal":
            x = x + sinusoids(position_ids, c.n_embd).to(x.dtype)
        elif c.pos_encoding == "rope":
            rotary = rope(position_ids, c.head_dim, c.rope_theta)
        for block in self.transformer.h:
            x = block(x, mask, rotary, past_key_values if use_cache else None)
        x = self.transformer.ln_f(x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(x)
        if c.logit_softcap:
            logits = c.logit_softcap * torch.tanh(logits.float() / c.logit_softcap)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here
            shifted = logits[:, :-1].float().reshape(-1, logits.size(-1))
            loss = F.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: past_key_values if use_cache else None})
