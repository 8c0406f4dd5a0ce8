"""Every setting tinygpt reads, defined once: typed dataclasses with their defaults and checks.

Hydra composes `configs/*.yaml` on top of these schemas (`register_schemas` puts them in its
ConfigStore), so a misspelt key or a value of the wrong type is refused while the config is
composed, for `-m` sweeps too. The YAML files hold only what differs from the defaults below:
model presets, datasets, experiments (a test checks that none restates a default).
`__post_init__` checks ranges and relations, so a settings object that exists is a valid one,
whether Hydra built it or Python code did.

No torch here: composing a config (and refusing a bad one) stays fast.
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from gpt.errors import TinyGPTError

_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
T = TypeVar("T")
MISSING = "???"  # OmegaConf's mark for a value that must be given (Hydra reports it when absent)


def _key(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def check_types(obj, section: str) -> None:
    """Check (and, int -> float, coerce) every field of a settings dataclass against its type.
    Hydra has already done this for composed configs; this covers settings built in Python."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        if typing.get_origin(hint) is list:  # list[str]: a list of such items
            (item,) = typing.get_args(hint)
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, item) for v in value):
                raise TinyGPTError(f"{_key(section, f.name)} must be {expected_type(type(obj), f.name)}; got {value!r}")
            continue
        allowed = typing.get_args(hint) or (hint,)  # `int | None` -> (int, NoneType)
        if hint is Any or any(t not in _NAMES and t is not type(None) for t in allowed):
            continue  # free-form, or a nested settings class (checked by its own __post_init__)
        if value == MISSING:
            raise TinyGPTError(f"{_key(section, f.name)} is required; set it, e.g. {_key(section, f.name)}=...")
        if value is None and type(None) in allowed:
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            try:
                setattr(obj, f.name, float(value))
            except OverflowError:  # an integer of 400 digits is no float
                raise TinyGPTError(
                    f"{_key(section, f.name)} is too large for a number (an integer of {len(str(value))} digits)"
                ) from None
            continue
        # bool is a subclass of int; `n_layer=true` is a mistake, not 1.
        if not any(isinstance(value, t) and not (t is int and isinstance(value, bool)) for t in allowed if t is not type(None)):
            raise TinyGPTError(f"{_key(section, f.name)} must be {expected_type(type(obj), f.name)}, got {value!r}")


def expected_type(cls, name: str) -> str | None:
    """'an integer', 'a number or null', ...: what field `name` of settings class `cls` takes."""
    hints = typing.get_type_hints(cls) if hasattr(cls, "__dataclass_fields__") else {}
    if name not in hints:
        return None
    if typing.get_origin(hints[name]) is list:
        return f"a list of {_NAMES[typing.get_args(hints[name])[0]].split(' ', 1)[1]}s, e.g. [a, b]"  # "a string" -> strings
    allowed = typing.get_args(hints[name]) or (hints[name],)
    names = [_NAMES.get(t, "null" if t is type(None) else None) for t in allowed]
    return " or ".join(names) if all(names) else None


def check_threads(value: Any) -> int | str | None:
    """`threads=`: a positive count, null (the rule of gpt.runtime.threads) or auto (follow the load). An
    `Any` field: Hydra's structured configs have no int-or-string type."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise TinyGPTError(
        f"threads must be a positive integer, null (OMP_NUM_THREADS, else the cores) or auto (follow the load), got {value!r}"
    )


def _at_least(obj, section: str, minimum: int, names: tuple[str, ...], hint: str = "") -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < minimum:
            what = "a positive integer" if minimum == 1 else f">= {minimum}"
            raise TinyGPTError(f"{_key(section, name)} must be {what}{hint}, got {value!r}")


# --- model: one schema per family; the shape defaults are those of gpt.model.GPTConfig /
# gpt.model.rnn.RNNConfig (a test keeps them equal), converted once by gpt.model.registry ------------


@dataclass
class GPTSettings:
    name: str = "gpt"  # a label for logs and sweeps
    arch: str = "gpt"
    vocab_size: int | None = None  # null: the tokenizer's
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    attention: str = "sdpa"  # fused kernels, or `manual` (explicit softmax); choices: gpt.model.ATTENTION_IMPLS
    pos_encoding: str = "learned"  # choices: gpt.model.POS_ENCODINGS
    n_kv_head: int | None = None  # fewer key/value heads than n_head: grouped-query attention
    rope_theta: float = 10000.0
    activation: str = "gelu"  # mlp=gelu's GELU: gelu (exact) | gelu_tanh (OpenAI's GPT-2)
    # The block's options (GPT-2's by default; what each does: gpt/model/config.py, docs/training.md)
    norm: str = "layernorm"  # layernorm | rmsnorm
    norm_eps: float = 1e-5
    mlp: str = "gelu"  # gelu | swiglu | relu2
    mlp_hidden: int | None = None  # null: 4 x n_embd (swiglu: 2/3 of that, rounded up to a multiple of 256)
    qk_norm: bool = False  # normalise queries and keys per head, before RoPE
    tie_embeddings: bool = True  # the LM head shares the token embedding's matrix
    logit_softcap: float | None = None  # logits -> c * tanh(logits / c); null: off
    head_dim: int | None = None  # null: n_embd / n_head
    qkv_bias: bool | None = None  # biases on q, k, v; null: as `bias`
    # The size knob of scaling studies (gpt.model.registry.depth_shape): depth sets n_layer = n_head =
    # depth and n_embd = depth * aspect_ratio (heads aspect_ratio wide; depth=12 is GPT-2 small's
    # shape); null: n_layer, n_head and n_embd as given
    depth: int | None = None
    aspect_ratio: int = 64


@dataclass
class RNNSettings:
    name: str = "recurrent"  # a label for logs and sweeps
    arch: str = MISSING  # rnn (Elman) | lstm | gru
    vocab_size: int | None = None
    block_size: int = 64  # training window (truncated backprop through time); sampling is unlimited
    n_layer: int = 2
    n_embd: int = 128
    n_hidden: int = 256
    dropout: float = 0.0
    impl: str = "fused"  # fused (torch kernels) | explicit (the step equations of gpt/model/rnn.py)


# --- data ----------------------------------------------------------------------------------


@dataclass
class TokenizerSettings:
    kind: str = "char"  # char (alphabet fitted on the corpus) | byte | tiktoken | bpe (trained on the corpus) | hf
    name: str = "gpt2"  # tiktoken: gpt2 | r50k_base | p50k_base | cl100k_base | o200k_base; hf: Hub id or folder
    ranks_file: str | None = None  # tiktoken gpt2/r50k_base from a local file (offline)
    vocab_size: int | None = None  # bpe: tokens in all (256 bytes + end-of-text + merges; null: 8192)
    train_docs: int | None = None  # bpe: train on at most the first this many documents
    train_bytes: int | None = 100_000_000  # bpe: ... and at most this many bytes of them (null: no cap)

    def __post_init__(self) -> None:
        check_types(self, "data.tokenizer")
        if self.kind not in ("char", "byte", "tiktoken", "bpe", "hf"):
            raise TinyGPTError(f"data.tokenizer.kind={self.kind!r} is unknown; use char, byte, tiktoken, bpe or hf")
        _at_least(self, "data.tokenizer", 1, ("train_docs", "train_bytes"))
        if self.kind != "bpe" and self.vocab_size is not None:  # the others' sizes are their own
            raise TinyGPTError(f"data.tokenizer.vocab_size applies to kind=bpe (a BPE to train), not kind={self.kind}")
        if self.kind == "bpe" and self.vocab_size is None:
            self.vocab_size = 8192
        if self.kind == "bpe" and self.vocab_size < 257:
            raise TinyGPTError(
                f"data.tokenizer.vocab_size={self.vocab_size} is too small for a byte-level BPE: use >= 257 (256 bytes + end-of-text)"
            )


@dataclass
class SourceSettings:
    kind: str = MISSING  # where documents come from: a kind of gpt.data.sources.SOURCES
    url: str | None = None  # url: where to download from
    sha256: str | None = None  # url: the file's checksum
    filename: str | None = None  # url: where it goes under the data root
    path: str | None = None  # hub: dataset name; disk: save_to_disk folder; local: file, folder or glob
    config: str | None = None  # hub: dataset config
    split: str = "train"  # hub/disk
    text_field: str = "text"  # hub/disk/local records: the field holding the text
    streaming: bool = False  # hub: stream instead of downloading everything first
    revision: str | None = None  # hub: a git revision of the dataset
    doc_unit: str = "file"  # local .txt/.md: one document per file | line | paragraph

    def __post_init__(self) -> None:
        check_types(self, "data.source")  # which kinds exist and what each needs: gpt.data.sources


@dataclass
class DataSettings:
    name: str = MISSING  # folder under the data root for the prepared tokens
    tokenizer: TokenizerSettings = field(default_factory=TokenizerSettings)
    source: SourceSettings = MISSING
    val_fraction: float = 0.1
    split_by: str = "documents"  # documents (a seeded choice of documents) | tail (the stream's end)
    seed: int = 1337  # for split_by=documents
    num_proc: int | None = None  # tokenizer processes (null: all CPUs)
    max_docs: int | None = None  # caps, for quick experiments
    max_tokens: int | None = None
    shard_tokens: int = 100_000_000  # tokens per .bin shard
    # check every shard's CRC-32 at start; false: only shards whose size or mtime changed since checked
    verify: bool = False
    # auto: local/disk records with "messages" (or Alpaca's instruction/output) are conversations
    # (gpt.chat), anything else text | text | chat (say so for Hub conversation sets)
    format: str = "auto"
    # conversations: each batch comes from one of this many groups of similar length (less
    # padding; every conversation stays equally likely); 1: from all of them alike
    length_buckets: int = 8

    def __post_init__(self) -> None:
        check_types(self, "data")
        if not 0.0 < self.val_fraction < 1.0:
            raise TinyGPTError(f"data.val_fraction must be between 0 and 1 (exclusive), got {self.val_fraction}")
        if self.split_by not in ("documents", "tail"):
            raise TinyGPTError(f"data.split_by={self.split_by!r} is unknown; use documents or tail")
        if self.format not in ("auto", "text", "chat"):
            raise TinyGPTError(f"data.format={self.format!r} is unknown; use auto, text or chat")
        if self.source == MISSING:
            raise TinyGPTError("data.source is required: pick a dataset with data=<name>, or set data.source.kind=...")
        _at_least(self, "data", 1, ("num_proc", "max_docs", "max_tokens", "shard_tokens", "length_buckets"))


# --- training --------------------------------------------------------------------------------


@dataclass
class TrainSettings:
    max_iters: int = 2000
    batch_size: int = 12  # per process
    grad_accum_steps: int = 1
    grad_clip: float = 1.0  # 0 disables clipping
    eval_interval: int = 250
    eval_iters: int = 50  # batches per split at each eval
    log_interval: int = 50
    sample_tokens: int = 200  # a sample printed when training ends (0: none)
    keep_last: int = 2  # step checkpoints kept in <run>/checkpoints (plus best.pt)
    max_bad_steps: int = 5  # non-finite steps are skipped; this many in a row stop the run
    peak_flops: float | None = None  # accelerator peak FLOP/s for MFU (null: known GPUs are looked up)
    eval_sample_tokens: int = 100  # a short sample at every eval, in TensorBoard's Text tab (0: none)
    histogram_every: int = 0  # weight/gradient histograms every N evals (0: never)
    attention_every: int = 0  # attention-map images every N evals (0: never; GPT only)
    # zero-shot tasks scored at every eval, e.g. [hellaswag]; names checked by gpt.evals.tasks (settings import no behaviour)
    eval_tasks: list[str] = field(default_factory=list)
    eval_task_limit: int = 200  # items of each task scored at an eval (the first ones)
    # A horizon given as compute instead of steps (either sets max_iters from the model's size,
    # gpt.model.compute): training FLOPs to spend (6N + attention per token), or tokens per parameter
    flops_budget: float | None = None
    tokens_per_param: float | None = None

    def __post_init__(self) -> None:
        check_types(self, "train")
        for name in ("flops_budget", "tokens_per_param"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and value != float("inf")):
                raise TinyGPTError(f"train.{name} must be a number > 0 (or null: train.max_iters steps), got {value!r}")
        if self.flops_budget is not None and self.tokens_per_param is not None:
            raise TinyGPTError("train.flops_budget and train.tokens_per_param both set the horizon; give one of them")
        _at_least(
            self,
            "train",
            1,
            (
                "max_iters",
                "batch_size",
                "grad_accum_steps",
                "eval_interval",
                "eval_iters",
                "log_interval",
                "keep_last",
                "max_bad_steps",
                "eval_task_limit",
            ),
        )
        if self.grad_clip < 0:
            raise TinyGPTError(f"train.grad_clip must be >= 0 (0 disables it), got {self.grad_clip}")
        _at_least(
            self, "train", 0, ("sample_tokens", "eval_sample_tokens", "histogram_every", "attention_every"), " (0 turns it off)"
        )


@dataclass
class AdamWSettings:
    """AdamW with linear warmup and cosine decay to min_lr (optim=adamw)."""

    name: str = "adamw"
    # The quickstart model is small: twice nanoGPT's 1e-3 trains faster (measured on 2 CPU cores:
    # val 1.807 at step 2000, vs 1.885 with lr 1e-3 / min_lr 1e-4). Experiments set their own.
    lr: float = 2e-3
    min_lr: float | None = None  # the schedule's floor; null: lr * min_lr_ratio
    min_lr_ratio: float = 0.1  # the floor as a fraction of the peak (a search over lr stays valid)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99  # a little below 0.999: tokens per step are few, so average over fewer steps
    eps: float = 1e-8
    warmup_iters: int = 100
    decay_iters: int | None = None  # null: train.max_iters

    def __post_init__(self) -> None:
        check_types(self, "optim")
        if self.name != type(self).name:
            raise TinyGPTError(f"optim.name={self.name!r}: pick the optimizer with optim=adamw or optim=muon")
        if self.lr <= 0 or (self.min_lr is not None and not 0 <= self.min_lr <= self.lr):
            raise TinyGPTError(f"need 0 <= optim.min_lr <= optim.lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise TinyGPTError(f"optim.min_lr_ratio must be in [0, 1] (the floor as a fraction of lr), got {self.min_lr_ratio}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise TinyGPTError(f"optim.beta1 and optim.beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        if self.weight_decay < 0 or self.eps <= 0:
            raise TinyGPTError(f"need optim.weight_decay >= 0 and optim.eps > 0, got {self.weight_decay}, {self.eps}")
        if self.warmup_iters < 0 or (self.decay_iters is not None and self.decay_iters < 1):
            raise TinyGPTError("optim.warmup_iters must be >= 0 and optim.decay_iters >= 1 (or null: train.max_iters)")


@dataclass
class MuonSettings(AdamWSettings):
    """Muon (momentum + Newton-Schulz orthogonalisation) on the hidden 2-D weights, AdamW (the
    settings above) on embeddings, biases and LayerNorm gains; both follow one warmup + cosine
    curve, each scaled to its own peak (optim=muon)."""

    name: str = "muon"
    lr: float = 3e-3  # the AdamW part
    # Off by default: decoupled decay scales with the learning rate, and at Muon's (0.02) a decay
    # of 0.1 shrank every matrix by 0.2% a step; without it the quickstart reaches val 1.86
    # instead of 1.90 by step 750 (benchmarks/reference.py) and ends at 1.622 instead of 1.609.
    weight_decay: float = 0.0
    muon_lr: float = 0.02  # the Muon part (decays by the same factor as lr)
    momentum: float = 0.95  # Nesterov momentum
    ns_steps: int = 5
    ns_dtype: str = "auto"  # Newton-Schulz precision: auto = bfloat16 on CUDA SM >= 80, float32 elsewhere

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.muon_lr <= 0 or not 0 <= self.momentum < 1 or self.ns_steps < 1:
            raise TinyGPTError(
                f"need optim.muon_lr > 0, 0 <= optim.momentum < 1 and optim.ns_steps >= 1, "
                f"got {self.muon_lr}, {self.momentum}, {self.ns_steps}"
            )
        if self.ns_dtype not in ("auto", "float32", "bfloat16"):
            raise TinyGPTError(f"optim.ns_dtype={self.ns_dtype!r}: choose auto, float32 or bfloat16")


OPTIMIZERS = {"adamw": AdamWSettings, "muon": MuonSettings}


@dataclass
class FinetuneSettings:
    """Starting from trained weights (init_from); freezing and LoRA also work from scratch."""

    block_size: int | None = None  # crop the initial model's context, e.g. 256 for GPT-2 on a CPU
    freeze_embeddings: bool = False  # token (+ position) embeddings; with tying, the LM head too
    freeze_layers: int = 0  # freeze the first N transformer blocks
    lora_rank: int = 0  # > 0: LoRA adapters on attention and MLP projections, all else frozen
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    require_init: bool = False  # set by finetune experiments: init_from must be given

    def __post_init__(self) -> None:
        check_types(self, "finetune")
        _at_least(self, "finetune", 0, ("freeze_layers", "lora_rank"))
        _at_least(self, "finetune", 1, ("block_size",))
        if not 0.0 <= self.lora_dropout < 1.0:
            raise TinyGPTError(f"finetune.lora_dropout must be in [0, 1), got {self.lora_dropout}")


@dataclass
class PathsSettings:
    data_dir: str | None = None  # downloads and prepared tokens (null: $TINYGPT_DATA_DIR or ~/.cache/tinygpt)
    runs_dir: str = "outputs"  # runs and sweeps, relative to the working directory
    output_dir: str | None = None  # this run's directory (null: Hydra's, or a new one under runs_dir/runs)

    def data_root(self) -> Path:
        return Path(self.data_dir or os.environ.get("TINYGPT_DATA_DIR") or "~/.cache/tinygpt").expanduser()


@dataclass
class RunConfig:
    """`python train.py` / `tinygpt train`: configs/config.yaml on top of this."""

    model: Any = MISSING  # GPTSettings or RNNSettings, by the model group's schema
    data: DataSettings = MISSING
    optim: Any = MISSING  # AdamWSettings or MuonSettings, by the optim group's schema
    train: TrainSettings = field(default_factory=TrainSettings)
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)
    paths: PathsSettings = field(default_factory=PathsSettings)
    seed: int = 1337
    resume: str | None = "auto"  # auto (continue this run dir's newest checkpoint) | false | a checkpoint or run dir
    init_from: str | None = None  # gpt2 | gpt2-medium | ... | a Hugging Face GPT-2 folder | a tinygpt checkpoint or run dir
    device: str = "auto"  # auto = cuda > mps > cpu; or cpu, cuda, cuda:N, mps
    dtype: str = "auto"  # auto = bf16 autocast where supported, fp16 + GradScaler on older GPUs, fp32 elsewhere
    compile: str = "auto"  # auto = on for CUDA | true | false
    # CPU threads: N | null (OMP_NUM_THREADS, else the cores; a resume keeps its checkpoint's) | auto (follow the load)
    threads: Any = None

    def __post_init__(self) -> None:
        check_types(self, "")
        self.threads = check_threads(self.threads)
        self.compile = self.compile.lower()  # compile=true arrives as "True"
        if self.compile not in ("auto", "true", "false"):
            raise TinyGPTError(f"compile={self.compile!r} is not understood; use compile=auto, compile=true or compile=false")


# --- sampling and the other commands --------------------------------------------------------


_NOT_CONTROLS = ("max_new_tokens", "stop", "stop_at_eot", "seed", "kv_cache")


@dataclass
class SamplingSettings:
    """How text is generated: the controls of gpt.generation, of `sample.py` (which adds where
    the model and prompts come from) and of the server's API (gpt.serve). A new control is a
    field here plus its use in gpt.generation.next_tokens; sample.py, the server and training's
    samples then take it as they are."""

    max_new_tokens: int = 500
    temperature: float = 0.8  # 0 = greedy
    top_k: int | None = 200  # keep the k most likely tokens (null: all)
    top_p: float | None = None  # nucleus: the most likely tokens up to this probability mass, in (0, 1]
    min_p: float | None = None  # keep tokens at least this fraction as likely as the top one
    # locally typical sampling: the tokens whose surprise is nearest the entropy, up to this mass, in (0, 1]
    typical_p: float | None = None
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the text
    stop: Any = None  # strings that end a sample (not included), e.g. 'stop=["\n\n"]'
    stop_at_eot: bool = True  # end a sample at the end-of-text token (BPE and byte tokenizers)
    seed: int = 1337  # sample j of every prompt uses seed + j
    kv_cache: bool = True  # reuse keys/values of past tokens (same tokens, much faster)

    def __post_init__(self) -> None:
        check_types(self, "")
        # stop=END and 'stop=[END,"\n\n"]' both work
        self.stop = (self.stop,) if isinstance(self.stop, str) else tuple(str(s) for s in (self.stop or ()))
        _at_least(self, "", 1, ("max_new_tokens",))
        if self.top_k is not None and self.top_k < 1:
            raise TinyGPTError(f"top_k must be a positive integer or null, got {self.top_k}")
        # Logits divided by a temperature that rounds to 0 in float32 are infinite: no distribution.
        if not 0 <= self.temperature < float("inf") or 0 < self.temperature < 1e-3:
            raise TinyGPTError(f"temperature must be 0 (greedy) or at least 0.001, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise TinyGPTError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise TinyGPTError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.typical_p is not None and not 0 < self.typical_p <= 1:
            raise TinyGPTError(f"typical_p must be in (0, 1], got {self.typical_p}")
        if not 0.01 <= self.repetition_penalty <= 100:  # beyond, penalised logits overflow
            raise TinyGPTError(f"repetition_penalty must be in [0.01, 100] (1 = off), got {self.repetition_penalty}")
        if any(s == "" for s in self.stop):
            raise TinyGPTError("stop strings must not be empty")

    def controls(self) -> dict:
        """The values that shape each token's distribution (what `next_tokens` reads): rows that
        share them can be filtered as one batch. Everything but when a sample ends, its seed and
        how the model is run."""
        return {f.name: getattr(self, f.name) for f in fields(SamplingSettings) if f.name not in _NOT_CONTROLS}

    def sampling_only(self) -> dict:
        """The generation controls alone, e.g. to record with a sample."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(SamplingSettings)}


@dataclass
class ModelChoice:
    """Which model a command uses: a checkpoint, a run directory, a pretrained model, or (none
    given) the newest run under paths.runs_dir."""

    run_dir: str | None = None  # a run directory (its checkpoints/best.pt)
    ckpt: str | None = None  # a checkpoint file
    init_from: str | None = None  # gpt2 | gpt2-medium | ... | a Hugging Face GPT-2 folder
    paths: PathsSettings = field(default_factory=PathsSettings)


@dataclass
class SampleConfig(SamplingSettings, ModelChoice):
    """`python sample.py` / `tinygpt sample`."""

    prompt: str = "\n"  # taken verbatim from the command line; "-" reads stdin; "" starts from end-of-text
    prompt_file: str | None = None  # one prompt, or one per line when it ends in .jsonl
    num_samples: int = 3  # per prompt
    stream: bool = True  # print tokens as they come; false: all prompts as one padded batch
    out_file: str | None = None  # also append {prompt, text, settings} records to this JSONL file
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False  # torch.compile the model first (pays off for long generations on a GPU)
    threads: Any = None  # CPU threads: N | null (OMP_NUM_THREADS, else the cores) | auto (follow the load)

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least(self, "", 1, ("num_samples",))
        self.threads = check_threads(self.threads)


@dataclass
class ChatConfig(SamplingSettings, ModelChoice):
    """`tinygpt chat`: talk to a model finetuned on conversations (gpt.chat)."""

    max_new_tokens: int = 256  # per reply
    system: str | None = None  # a system message that opens the conversation (kept when old turns are dropped)
    device: str = "auto"
    dtype: str = "auto"
    threads: Any = None  # CPU threads: N | null (OMP_NUM_THREADS, else the cores) | auto (follow the load)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.threads = check_threads(self.threads)


@dataclass
class ServeConfig(ModelChoice):
    """`python serve.py` / `tinygpt serve`: a web playground and an OpenAI-compatible completions
    API (gpt/serve/). Request limits are here; each request's sampling controls come with it."""

    # several to choose from per request: a list of run dirs, checkpoints or GPT-2 names, or all (every run under paths.runs_dir)
    models: Any = None
    host: str = "127.0.0.1"  # 0.0.0.0 serves other machines too: set api_key then
    port: int = 8000
    api_key: str | None = None  # required as "Authorization: Bearer <key>" when set (null: $TINYGPT_API_KEY, else none)
    max_batch: int = 32  # rows (prompts x n) decoded together; a finished row frees its slot at once
    max_queue: int = 64  # requests waiting for a slot; beyond it: 503 with Retry-After
    max_streams: int = 64  # streaming requests open at once; beyond it: 429 with Retry-After
    max_body_bytes: int = 1_000_000  # larger request bodies: 413
    # longer prompts: 400 (null: the model's context); one longer than the context keeps its last block_size tokens, as in sample.py
    max_prompt_tokens: int | None = None
    max_tokens: int = 2048  # the largest max_tokens a request may ask for
    max_n: int = 8  # the largest n (completions per prompt) times prompts a request may ask for
    device: str = "auto"
    dtype: str = "auto"
    threads: Any = None  # CPU threads: N | null (OMP_NUM_THREADS, else the cores) | auto (follow the load)

    def __post_init__(self) -> None:
        check_types(self, "")
        positive = ("max_batch", "max_streams", "max_body_bytes", "max_prompt_tokens", "max_tokens", "max_n")
        _at_least(self, "", 1, positive)
        self.threads = check_threads(self.threads)
        _at_least(self, "", 1, ("max_queue",))  # every request waits in the queue, if only for a step
        if not 1 <= self.port <= 65535:
            raise TinyGPTError(f"port must be in 1..65535, got {self.port}")
        if isinstance(self.models, str):
            self.models = [self.models]
        self.models = [str(m) for m in (self.models or [])]


@dataclass
class TaskSettings:
    """A zero-shot task (`tinygpt eval task=<name>`; the tasks and their default sources: gpt/evals/tasks.py)."""

    name: str = MISSING  # hellaswag | lambada | arc_easy | arc_challenge | chat (replies to held-out conversations)
    path: str | None = None  # its items: a .jsonl/.parquet file, folder or glob, or a save_to_disk folder;
    # null: <data root>/tasks/<name>.jsonl when there, else the task's Hub dataset
    limit: int | None = None  # score the first this many items; null: all

    def __post_init__(self) -> None:
        check_types(self, "task")
        _at_least(self, "task", 1, ("limit",))


@dataclass
class EvalConfig(ModelChoice):
    """`tinygpt eval`: loss, perplexity and bits per byte on a text file or a data split."""

    text_file: str | None = None  # a text file to score; else a split of the model's data (or data=...)
    split: str = "val"  # train | val
    max_tokens: int | None = None  # score at most this many tokens
    stride: int | None = None  # sliding-window step: each target gets >= block_size - stride tokens of context; null: block_size
    batch_size: int = 16
    device: str = "auto"
    threads: Any = None  # CPU threads: N | null (OMP_NUM_THREADS, else the cores) | auto (follow the load)
    data: DataSettings | None = None  # another prepared dataset (data=<name>); null: the model's own
    task: TaskSettings | None = None  # a zero-shot task (task=<name>) instead of perplexity

    def __post_init__(self) -> None:
        check_types(self, "")
        _at_least(self, "", 1, ("max_tokens", "stride", "batch_size"))
        self.threads = check_threads(self.threads)
        if self.split not in ("train", "val"):
            raise TinyGPTError(f"split={self.split!r}: use train or val")
        if self.task is not None and (self.text_file or self.data is not None):
            raise TinyGPTError("task= scores a zero-shot task, text_file=/data= a text's perplexity: pass one of them")


@dataclass
class ExportConfig(ModelChoice):
    """`tinygpt export`: a checkpoint to a Hugging Face GPT-2 folder."""

    out: str = MISSING  # the folder to write


@dataclass
class SweepConfig:
    """`tinygpt sweep <dir>`: a sweep folder's leaderboard and val-curve plot."""

    dir: str = MISSING  # a multirun folder, e.g. outputs/sweeps/<stamp>
    rank_by: str = "best_val_loss"  # or final_val_loss, or a task figure of train.eval_tasks, e.g. hellaswag/acc_norm


@dataclass
class ScalingConfig:
    """`tinygpt scaling`: an IsoFLOP study (gpt.scaling.study). configs/scaling.yaml picks a preset
    (configs/preset/); each preset fills every field below."""

    out: str = MISSING  # the study's folder (presets: outputs/scaling/<preset>): report.md, fit.json, plots, runs/<job>/
    budgets: list[float] = field(default_factory=list)  # training FLOPs of each run (train.flops_budget), at least 2
    depths: list[int] = field(default_factory=list)  # the size ladder (model.depth) trained at every budget, at least 3
    train: list[str] = field(default_factory=list)  # overrides every job gets: model, data, batch, optimizer, evals
    predict: float | None = None  # the budget to predict the optimum for (null: 4x the largest)
    check: bool = False  # train the predicted optimum at `predict` and compare its loss with the prediction

    def __post_init__(self) -> None:
        check_types(self, "")
        budgets = ", ".join(f"{b:g}" for b in self.budgets)
        if len(set(self.budgets)) < 2:
            raise TinyGPTError(
                f"budgets=[{budgets}]: a scaling fit needs at least 2 different compute budgets (3 or more to see a "
                f"trend), e.g. budgets=[1e12,3e12,9e12]"
            )
        if any(not b > 0 or b == float("inf") for b in self.budgets):
            raise TinyGPTError(f"budgets=[{budgets}]: every budget must be a number of FLOPs > 0, e.g. 3e12")
        if len(set(self.depths)) < 3:
            raise TinyGPTError(
                f"depths={self.depths}: each budget needs at least 3 model sizes to fit a parabola through, e.g. depths=[2,3,4,5]"
            )
        if any(d < 1 for d in self.depths):
            raise TinyGPTError(f"depths={self.depths}: model.depth must be a positive integer")
        if len(set(self.budgets)) != len(self.budgets) or len(set(self.depths)) != len(self.depths):
            raise TinyGPTError(f"budgets=[{budgets}] depths={self.depths}: each value once")
        if self.predict is not None and not (self.predict > 0 and self.predict != float("inf")):
            raise TinyGPTError(f"predict={self.predict!r} must be a number of FLOPs > 0 (or null: 4x the largest budget)")
        if self.predict is None:
            self.predict = 4 * max(self.budgets)


def from_dict(cls: type[T], values: dict, section: str = "", ignored: list[str] | None = None) -> T:
    """A settings dataclass from plain data (a checkpoint's record, a notebook's dict): nested
    sections are built alike, the checks of each class run. Unknown keys are refused, or, given
    an `ignored` list (a record written by another tinygpt version), left out and named there."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown and ignored is None:
        raise TinyGPTError(
            f"unknown setting(s) {', '.join(_key(section, k) for k in unknown)}; known: {', '.join(sorted(known))}"
        )
    built = {}
    for name, value in values.items():
        if name not in known:
            ignored.append(_key(section, name))
            continue
        nested = [t for t in (typing.get_args(hints[name]) or (hints[name],)) if hasattr(t, "__dataclass_fields__")]
        built[name] = from_dict(nested[0], value, _key(section, name), ignored) if nested and isinstance(value, dict) else value
    return cls(**built)


def changed_settings(old: dict, new: dict, prefix: str = "") -> str:
    """'a.b: 1 -> 2, ...' for the leaves that differ (paths and run bookkeeping excluded)."""
    out = []
    for key in sorted(set(old) | set(new)):
        if (prefix == "" and key in ("paths", "resume")) or key not in old:
            continue  # bookkeeping, or a setting older checkpoints did not record
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            sub = changed_settings(a, b, f"{prefix}{key}.")
            if sub:
                out.append(sub)
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return ", ".join(out)


def register_schemas() -> None:
    """Put the schemas in Hydra's ConfigStore, under the names configs/*.yaml refer to."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, node in (
        ("schema_train", RunConfig),
        ("schema_sample", SampleConfig),
        ("schema_eval", EvalConfig),
        ("schema_export", ExportConfig),
        ("schema_sweep", SweepConfig),
        ("schema_scaling", ScalingConfig),
        ("schema_serve", ServeConfig),
        ("schema_chat", ChatConfig),
    ):
        store.store(name=name, node=node)
    store.store(group="model", name="schema_gpt", node=GPTSettings)
    store.store(group="model", name="schema_rnn", node=RNNSettings)
    for name, node in OPTIMIZERS.items():
        store.store(group="optim", name=f"schema_{name}", node=node)
