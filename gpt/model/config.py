"""GPTConfig: the shape of a GPT and the options of its block, checked when built."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from gpt.errors import TinyGPTError

ATTENTION_IMPLS = ("sdpa", "manual")
POS_ENCODINGS = ("learned", "sinusoidal", "rope", "none")
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu", "relu2")


@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 64  # longest context the model can attend over
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers, as in GPT-2
    attention: str = "sdpa"  # "sdpa" (fused/flash kernels) or "manual" (explicit math)
    pos_encoding: str = "learned"  # learned | sinusoidal | rope | none
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None = n_head
    rope_theta: float = 10000.0  # RoPE base: rotation frequencies are theta^(-2i/head_dim)
    activation: str = "gelu"  # mlp=gelu's GELU: gelu (exact, erf) | gelu_tanh (the approximation OpenAI's GPT-2 used)
    # --- the block's options (GPT-2's block by default; Llama's: rmsnorm, swiglu, rope, no bias, untied)
    norm: str = "layernorm"  # layernorm (GPT-2) | rmsnorm (Llama: no mean, no bias)
    norm_eps: float = 1e-5  # added to the variance inside the square root
    mlp: str = "gelu"  # gelu (GPT-2) | swiglu (Llama: silu(gate) * up) | relu2 (ReLU squared, modded-nanogpt)
    mlp_hidden: int | None = None  # None: 4 n_embd, or for swiglu Llama's 2/3 of that rounded up to a multiple of 256
    qk_norm: bool = False  # normalise each head's queries and keys (before RoPE), as Qwen3 does
    tie_embeddings: bool = True  # the LM head shares the token embedding's matrix
    logit_softcap: float | None = None  # logits -> c tanh(logits / c): bounded, as in Gemma 2 and modded-nanogpt
    head_dim: int | None = None  # None: n_embd / n_head
    qkv_bias: bool | None = None  # biases on q, k, v (None: as `bias`; Qwen2: true with bias=false)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not _positive_int(value):
                raise TinyGPTError(f"model.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.dropout, (int, float)) or isinstance(self.dropout, bool):
            raise TinyGPTError(f"model.dropout must be a number in [0, 1), got {self.dropout!r}")
        for name in ("bias", "qk_norm", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TinyGPTError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        if self.qkv_bias is not None and not isinstance(self.qkv_bias, bool):
            raise TinyGPTError(f"model.qkv_bias must be true, false or null (as model.bias), got {self.qkv_bias!r}")
        if self.head_dim is not None and not _positive_int(self.head_dim):
            raise TinyGPTError(f"model.head_dim must be a positive integer or null (n_embd / n_head), got {self.head_dim!r}")
        if self.head_dim is None and self.n_embd % self.n_head:
            raise TinyGPTError(
                f"model.n_embd={self.n_embd} is not divisible by model.n_head={self.n_head}; "
                f"pick n_embd as a multiple of n_head (e.g. model.n_embd={self.n_head * max(1, round(self.n_embd / self.n_head))})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise TinyGPTError(f"model.dropout must be in [0, 1), got {self.dropout}")
        _one_of("attention", self.attention, ATTENTION_IMPLS)
        _one_of("pos_encoding", self.pos_encoding, POS_ENCODINGS)
        _one_of("norm", self.norm, NORMS)
        _one_of("mlp", self.mlp, MLPS)
        if self.n_kv_head is not None and (
            not isinstance(self.n_kv_head, int) or self.n_kv_head < 1 or self.n_head % self.n_kv_head
        ):
            raise TinyGPTError(
                f"model.n_kv_head={self.n_kv_head!r} must divide model.n_head={self.n_head} (each key/value head serves "
                f"n_head / n_kv_head query heads); use a divisor of {self.n_head} or null"
            )
        if self.activation not in ("gelu", "gelu_tanh"):
            raise TinyGPTError(f"model.activation={self.activation!r} is unknown; use gelu or gelu_tanh")
        if self.activation != "gelu" and self.mlp != "gelu":
            raise TinyGPTError(f"model.activation={self.activation} picks mlp=gelu's GELU; mlp={self.mlp} has its own")
        if self.pos_encoding == "rope" and self.dim_per_head % 2:
            raise TinyGPTError(f"RoPE rotates pairs of channels: the head dimension {self.dim_per_head} must be even")
        if self.mlp_hidden is not None and not _positive_int(self.mlp_hidden):
            raise TinyGPTError(f"model.mlp_hidden must be a positive integer or null, got {self.mlp_hidden!r}")
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or not self.norm_eps > 0:
            raise TinyGPTError(f"model.norm_eps must be a number > 0, got {self.norm_eps!r}")
        if self.logit_softcap is not None and (
            isinstance(self.logit_softcap, bool) or not isinstance(self.logit_softcap, (int, float)) or not self.logit_softcap > 0
        ):
            raise TinyGPTError(f"model.logit_softcap must be a number > 0 or null (off), got {self.logit_softcap!r}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    @property
    def hidden(self) -> int:
        """The MLP's hidden width. SwiGLU has three matrices where GELU has two, so Llama keeps
        its parameters level with 2/3 of 4 n_embd, rounded up to a multiple of 256."""
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        if self.mlp == "swiglu":
            return 256 * -(-int(2 * 4 * self.n_embd / 3) // 256)
        return 4 * self.n_embd

    @property
    def attn_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        """Build from a mapping such as a model preset; its `name` is a label and its `arch`
        (always "gpt" here) picks this class, neither is a field."""
        if d.get("arch", "gpt") != "gpt":
            raise TinyGPTError(f"model.arch={d['arch']!r} is not a GPT; build it with gpt.model.registry")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known - {"name", "arch"})
        if unknown:
            raise TinyGPTError(
                f"unknown model setting(s) {', '.join('model.' + k for k in unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict:
        return asdict(self)


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _one_of(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise TinyGPTError(f"model.{name}={value!r} is unknown; use one of {', '.join(choices)}")
