"""The model's shape and block options, declared once: `GPTConfig` and `RNNConfig` are both the
`model` section of the settings (Hydra composes configs/model/*.yaml on them) and what the
model is built from (gpt.model.GPT, gpt.model.rnn.RecurrentLM). Checked when built, and the
values derived from others resolved once, under their own names, in `__post_init__`:

    model.depth           -> n_layer, n_head, n_embd (the scaling knob, see depth_shape)
    model.n_kv_head=null  -> n_head (no grouped-query attention)
    model.head_dim=null   -> n_embd / n_head
    model.mlp_hidden=null -> 4 n_embd (SwiGLU: 2/3 of that, rounded up to a multiple of 256)
    model.qkv_bias=null   -> model.bias

`vocab_size=null` stays null here: it is the tokenizer's, known once the data is prepared
(`dataclasses.replace(config, vocab_size=n)` then). Torch-free: composing a config and refusing
a bad one stays fast.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from gpt.errors import TinyGPTError

MISSING = "???"  # OmegaConf's mark for a value that must be given
ATTENTION_IMPLS = ("sdpa", "manual")
POS_ENCODINGS = ("learned", "sinusoidal", "rope", "none")
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu", "relu2")
RECURRENT = ("rnn", "lstm", "gru")
LABELS = ("name",)  # fields that name a model without changing it
DERIVED = ("n_kv_head", "head_dim", "mlp_hidden", "qkv_bias", "vocab_multiple")  # resolved from the others when null
# A vocabulary of PAD_FROM tokens or more is padded to a multiple of PAD_MULTIPLE rows unless
# model.vocab_multiple says otherwise: a few dozen rows more, and the LM head's matmul aligned.
PAD_FROM, PAD_MULTIPLE = 1024, 64


@dataclass
class GPTConfig:
    name: str = "gpt"  # a label for logs and sweeps
    arch: str = "gpt"
    vocab_size: int | None = None  # null: the tokenizer's
    # The embedding and LM-head tables are padded to a multiple of this many rows (1: none): GPU
    # matmuls over 50304 rows run at full speed where 50257 do not. vocab_size stays the
    # tokenizer's, and the model's logits cover it only, so a padded id is never sampled, scored
    # or exported. null: PAD_MULTIPLE from PAD_FROM tokens on (a BPE), 1 below (char, byte).
    # Records without it (older checkpoints) and imported weights are unpadded.
    vocab_multiple: int | None = None
    block_size: int = 64  # longest context the model can attend over
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers, as in GPT-2
    attention: str = "sdpa"  # "sdpa" (fused/flash kernels) or "manual" (explicit math)
    pos_encoding: str = "learned"  # learned | sinusoidal | rope | none
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); null: n_head
    rope_theta: float = 10000.0  # RoPE base: rotation frequencies are theta^(-2i/head_dim)
    activation: str = "gelu"  # mlp=gelu's GELU: gelu (exact, erf) | gelu_tanh (the approximation OpenAI's GPT-2 used)
    # --- the block's options (GPT-2's block by default; Llama's: rmsnorm, swiglu, rope, no bias, untied)
    norm: str = "layernorm"  # layernorm (GPT-2) | rmsnorm (Llama: no mean, no bias)
    norm_eps: float = 1e-5  # added to the variance inside the square root
    mlp: str = "gelu"  # gelu (GPT-2) | swiglu (Llama: silu(gate) * up) | relu2 (ReLU squared, modded-nanogpt)
    mlp_hidden: int | None = None  # null: 4 n_embd, or for swiglu Llama's 2/3 of that rounded up to a multiple of 256
    qk_norm: bool = False  # normalise each head's queries and keys (before RoPE), as Qwen3 does
    tie_embeddings: bool = True  # the LM head shares the token embedding's matrix
    logit_softcap: float | None = None  # logits -> c tanh(logits / c): bounded, as in Gemma 2 and modded-nanogpt
    head_dim: int | None = None  # null: n_embd / n_head
    qkv_bias: bool | None = None  # biases on q, k, v (null: as `bias`; Qwen2: true with bias=false)
    # The size knob of scaling studies (depth_shape): depth sets n_layer = n_head = depth and
    # n_embd = depth * aspect_ratio (heads aspect_ratio wide; depth=12 is GPT-2 small's shape);
    # null: n_layer, n_head and n_embd as given
    depth: int | None = None
    aspect_ratio: int = 64
    # Recompute each block's activations in the backward pass instead of keeping them: about a
    # third more compute for a fraction of the activation memory (large presets on one GPU). It
    # changes no weight and no result beyond float rounding, so a resumed run may turn it on or off.
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.arch != "gpt":
            raise TinyGPTError(f"model.arch={self.arch!r} is not a GPT; use one of gpt, {', '.join(RECURRENT)}")
        if self.depth is not None:
            for name, value in depth_shape(self.depth, self.aspect_ratio).items():
                setattr(self, name, value)
        for name in ("block_size", "n_layer", "n_head", "n_embd"):
            _require_positive(name, getattr(self, name))
        if self.vocab_size is not None:
            _require_positive("vocab_size", self.vocab_size)
        _require_fraction("dropout", self.dropout)
        if self.vocab_multiple is not None and not _positive_int(self.vocab_multiple):
            raise TinyGPTError(
                f"model.vocab_multiple must be a positive integer (1: no padding) or null, got {self.vocab_multiple!r}"
            )
        if self.vocab_multiple is None and self.vocab_size is not None:  # (null until the tokenizer's size is known)
            self.vocab_multiple = PAD_MULTIPLE if self.vocab_size >= PAD_FROM else 1
        for name in ("bias", "qk_norm", "tie_embeddings", "activation_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise TinyGPTError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        if self.qkv_bias is not None and not isinstance(self.qkv_bias, bool):
            raise TinyGPTError(f"model.qkv_bias must be true, false or null (as model.bias), got {self.qkv_bias!r}")
        if self.head_dim is not None and not _positive_int(self.head_dim):
            raise TinyGPTError(f"model.head_dim must be a positive integer or null (n_embd / n_head), got {self.head_dim!r}")
        _one_of("attention", self.attention, ATTENTION_IMPLS)
        _one_of("pos_encoding", self.pos_encoding, POS_ENCODINGS)
        _one_of("norm", self.norm, NORMS)
        _one_of("mlp", self.mlp, MLPS)
        # Before the width's check, whose hint changes n_embd alone: no n_embd mends this one.
        if self.n_kv_head is not None and (not _positive_int(self.n_kv_head) or self.n_head % self.n_kv_head):
            raise TinyGPTError(
                f"model.n_kv_head={self.n_kv_head!r} must divide model.n_head={self.n_head} (each key/value head serves "
                f"n_head / n_kv_head query heads); use a divisor of {self.n_head} (e.g. model.n_kv_head="
                f"{_nearest_divisor(self.n_head, self.n_kv_head)}) or null"
            )
        rope = self.pos_encoding == "rope"
        if self.head_dim is None and self.n_embd % self.n_head:
            raise TinyGPTError(
                f"model.n_embd={self.n_embd} is not divisible by model.n_head={self.n_head}; pick n_embd as a multiple of "
                f"{'2 x n_head, as RoPE needs heads of an even width' if rope else 'n_head'} "
                f"(e.g. model.n_embd={_width(self.n_embd, self.n_head, rope)})"
            )
        if self.activation not in ("gelu", "gelu_tanh"):
            raise TinyGPTError(f"model.activation={self.activation!r} is unknown; use gelu or gelu_tanh")
        if self.activation != "gelu" and self.mlp != "gelu":
            raise TinyGPTError(f"model.activation={self.activation} picks mlp=gelu's GELU; mlp={self.mlp} has its own")
        if self.mlp_hidden is not None and not _positive_int(self.mlp_hidden):
            raise TinyGPTError(f"model.mlp_hidden must be a positive integer or null, got {self.mlp_hidden!r}")
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or not self.norm_eps > 0:
            raise TinyGPTError(f"model.norm_eps must be a number > 0, got {self.norm_eps!r}")
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 0:
            raise TinyGPTError(f"model.rope_theta must be a number > 0, got {self.rope_theta!r}")
        if self.logit_softcap is not None and (
            isinstance(self.logit_softcap, bool) or not isinstance(self.logit_softcap, (int, float)) or not self.logit_softcap > 0
        ):
            raise TinyGPTError(f"model.logit_softcap must be a number > 0 or null (off), got {self.logit_softcap!r}")
        # The derived values, resolved once under their own names.
        width_given = self.head_dim is not None
        self.n_kv_head = self.n_kv_head or self.n_head
        self.head_dim = self.head_dim or self.n_embd // self.n_head
        self.qkv_bias = self.bias if self.qkv_bias is None else self.qkv_bias
        if self.mlp_hidden is None:
            # SwiGLU has three matrices where GELU has two, so Llama keeps its parameters level
            # with 2/3 of 4 n_embd, rounded up to a multiple of 256.
            self.mlp_hidden = 256 * -(-int(2 * 4 * self.n_embd / 3) // 256) if self.mlp == "swiglu" else 4 * self.n_embd
        if rope and self.head_dim % 2:
            mend = (
                f"model.head_dim={self.head_dim + 1}" if width_given else f"model.n_embd={_width(self.n_embd, self.n_head, rope)}"
            )
            raise TinyGPTError(f"RoPE rotates pairs of channels: the head dimension {self.head_dim} must be even (e.g. {mend})")

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding and LM-head tables: vocab_size rounded up to vocab_multiple."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        """From a mapping such as a checkpoint's record; unknown keys are refused by name. A record
        from before vocab_multiple existed was unpadded."""
        return cls(**{"vocab_multiple": 1, **_known(cls, d, "a GPT")})

    def changed(self, **changes) -> GPTConfig:
        """This config with some settings changed, and the derived values that followed from the
        old ones following the new (dataclasses.replace would keep them: a head_dim of the old
        width, an n_kv_head that no longer divides n_head)."""
        return GPTConfig.from_dict({**as_given(self), **changes})

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RNNConfig:
    """The recurrent baselines (model=rnn | lstm | gru, gpt.model.rnn)."""

    name: str = "recurrent"  # a label for logs and sweeps
    arch: str = MISSING  # rnn (Elman) | lstm | gru
    vocab_size: int | None = None  # null: the tokenizer's
    block_size: int = 64  # training window (truncated backprop through time); sampling has no limit
    n_layer: int = 2
    n_embd: int = 128  # token embedding size
    n_hidden: int = 256  # hidden state size
    dropout: float = 0.0  # on the embeddings, between layers and before the head
    impl: str = "fused"  # fused (torch kernels) | explicit (the step equations of gpt/model/rnn.py)

    def __post_init__(self) -> None:
        if self.arch not in RECURRENT:
            raise TinyGPTError(f"model.arch={self.arch!r} is not recurrent; use one of {', '.join(RECURRENT)}")
        for name in ("block_size", "n_layer", "n_embd", "n_hidden"):
            _require_positive(name, getattr(self, name))
        if self.vocab_size is not None:
            _require_positive("vocab_size", self.vocab_size)
        _require_fraction("dropout", self.dropout)
        if self.impl not in ("fused", "explicit"):
            raise TinyGPTError(f"model.impl={self.impl!r} is unknown; use fused or explicit")

    @property
    def padded_vocab_size(self) -> int:  # recurrent baselines keep their tables unpadded
        return self.vocab_size

    @classmethod
    def from_dict(cls, d: dict) -> RNNConfig:
        return cls(**_known(cls, d, "a recurrent model"))

    def changed(self, **changes) -> RNNConfig:
        return RNNConfig.from_dict({**self.to_dict(), **changes})

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return f"{self.arch} {self.n_layer}L hidden {self.n_hidden} embd {self.n_embd} window {self.block_size}"


ARCHS = ("gpt", *RECURRENT)


def config_from_dict(d: dict) -> GPTConfig | RNNConfig:
    """GPTConfig or RNNConfig from a model section or a checkpoint's record (`arch` picks; gpt
    when absent, as in checkpoints written before the field)."""
    arch = d.get("arch", "gpt")
    if arch == "gpt":
        return GPTConfig.from_dict(d)
    if arch in RECURRENT:
        return RNNConfig.from_dict(d)
    raise TinyGPTError(f"model.arch={arch!r} is unknown; use one of {', '.join(ARCHS)}")


def other_kinds_setting(key: str, arch: str | None, name: str | None = None) -> str | None:
    """The refusal of `key`, a setting the composed model (`arch`, preset `name`) does not have,
    when it is a setting of the other kind of model: `model.attention` under model=gru is no typo
    but a GPT's setting that a recurrent model has no use for (and `model.n_hidden` the reverse).
    None for a key no model has."""
    section, _, leaf = key.rpartition(".")
    if section != "model" or arch is None:
        return None
    gpt, rnn = {f.name for f in fields(GPTConfig)}, {f.name for f in fields(RNNConfig)}
    if arch in RECURRENT and leaf in gpt - rnn:
        return (
            f"{key} is a GPT setting; model={arch} has none (a recurrent model has no attention, heads or block "
            f"options): drop {key}, or train a GPT (e.g. model=gpt-micro)"
        )
    if arch == "gpt" and leaf in rnn - gpt:
        return (
            f"{key} is a recurrent model's setting; model={name or 'gpt'} is a GPT and has none: drop {key}, "
            f"or train a recurrent model (model=lstm, gru or rnn)"
        )
    return None


def as_given(config: GPTConfig | RNNConfig) -> dict:
    """A config's record as a user would write it: the derived values that follow from the others
    (what null resolves to) shown as null, so that comparing two configs names what was set, not
    what followed from it (n_embd=36, not also head_dim and mlp_hidden)."""
    d = config.to_dict()
    if isinstance(config, GPTConfig):
        blank = GPTConfig.from_dict({**d, **dict.fromkeys(DERIVED)})
        d.update({k: None for k in DERIVED if d[k] == getattr(blank, k)})
    return d


def ignored_settings(
    asked: GPTConfig | RNNConfig, kept: dict, given: set[str] | None, was: dict | None = None, kept_as: str = "checkpoint"
) -> list[str]:
    """`model.k=v (<kept_as>: w)` for each model setting the user gave whose value `kept` (as_given
    of the model a run goes on with: a resumed checkpoint's, a finetune's base) does not have.
    `given`: the names the command line gave ("*": a preset, every one); None (a run built in
    Python) those `asked` sets apart from its class's defaults. What the defaults or the finetune
    itself made (a context extended for conversations) is no setting of the user's, and neither is
    one `was` (the record of what the run's last start asked) asked already: it was said then."""
    new = as_given(asked)
    try:
        was = as_given(config_from_dict(was)) if was is not None else None
    except (TinyGPTError, TypeError, AttributeError):  # a record of another version
        was = None
    if given is None:
        blank = RNNConfig(arch=asked.arch) if isinstance(asked, RNNConfig) else GPTConfig()
        given = {k for k, v in as_given(blank).items() if new.get(k) != v}
    return [
        f"model.{k}={new[k]!r} ({kept_as}: {kept[k]!r})"
        for k in sorted(new)
        if ("*" in given or k in given)
        and k not in LABELS
        and k in kept
        and new[k] not in (None, kept[k])  # None: follows the tokenizer or the other settings
        and (was is None or k not in was or new[k] != was[k])
    ]


def depth_shape(depth, aspect_ratio) -> dict:
    """The shape `model.depth` names: depth layers of depth heads, each head aspect_ratio wide
    (n_embd = depth * aspect_ratio). One knob that grows width with depth at a fixed ratio, as
    nanochat's does, so a scaling study walks model sizes with one setting; depth=12 with the
    default 64 is GPT-2 small's 12 layers, 12 heads, 768 dims."""
    for name, value in (("depth", depth), ("aspect_ratio", aspect_ratio)):
        if not _positive_int(value):
            raise TinyGPTError(f"model.{name} must be a positive integer, got {value!r}")
    return {"n_layer": depth, "n_head": depth, "n_embd": depth * aspect_ratio}


def _known(cls, d: dict, what: str) -> dict:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise TinyGPTError(
            f"unknown model setting(s) {', '.join('model.' + k for k in unknown)} for {what}; known: {', '.join(sorted(known))}"
        )
    return dict(d)


def _width(n_embd: int, n_head: int, rope: bool) -> int:
    """The multiple of n_head nearest n_embd (of 2 n_head with RoPE, which rotates pairs of each
    head's channels): the n_embd a mistaken one is told to take."""
    step = n_head * (2 if rope else 1)
    return step * max(1, round(n_embd / step))


def _nearest_divisor(n: int, near) -> int:
    """The divisor of n nearest `near` (the smaller of two as near; 1 for a value that is no count)."""
    near = near if _positive_int(near) else 1
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - near), d))


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _require_positive(name: str, value) -> None:
    if not _positive_int(value):
        raise TinyGPTError(f"model.{name} must be a positive integer, got {value!r}")


def _require_fraction(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise TinyGPTError(f"model.{name} must be a number in [0, 1), got {value!r}")


def _one_of(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise TinyGPTError(f"model.{name}={value!r} is unknown; use one of {', '.join(choices)}")
