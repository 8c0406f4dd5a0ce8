"""The settings of a training run (`tinygpt train`, RunConfig) and their sections: data (with its
tokenizer and source), the training loop, the optimizers, finetuning, paths, and the device
fields every command shares. The model section is gpt.config.model's. Each class checks itself
in `__post_init__`, so a settings object that exists is a valid one."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt.config.checks import MISSING, at_least, check_threads, check_types
from gpt.errors import TinyGPTError

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
        at_least(self, "data.tokenizer", 1, ("train_docs", "train_bytes"))
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
        at_least(self, "data", 1, ("num_proc", "max_docs", "max_tokens", "shard_tokens", "length_buckets"))


# --- training --------------------------------------------------------------------------------


@dataclass
class TrainSettings:
    max_iters: int = 2000
    batch_size: int = 12  # per process
    grad_accum_steps: int = 1
    grad_clip: float = 1.0  # 0 disables clipping
    eval_interval: int = 250
    eval_iters: int = 50  # batches (of batch_size rows) per split at each eval, shared out over the processes
    log_interval: int = 50
    sample_tokens: int = 200  # a sample printed when training ends (0: none)
    keep_last: int = 2  # step checkpoints kept in <run>/checkpoints (plus best.pt)
    # checkpoints written by a thread from a copy of the state while training goes on (host memory
    # the size of the state is kept for the copy); false: the step waits for the write. FSDP2 runs
    # write their shards blocking either way.
    async_save: bool = True
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
        at_least(
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
        at_least(
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
    # Newton-Schulz precision: auto = bfloat16 on CUDA SM >= 80 and CPUs with AVX-512 BF16 or AMX, float32 elsewhere
    ns_dtype: str = "auto"

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

    # the initial model's context: cropped (e.g. 128 for GPT-2 on a CPU), or extended where its
    # positions are computed (rope, sinusoidal, none: e.g. 256 to finetune the quickstart on chats)
    block_size: int | None = None
    # at least this context where the base's positions are computed, else the base's own (a learned
    # table, or a longer context, is kept); block_size, when given, decides instead. experiment=sft: 256
    min_block_size: int | None = None
    freeze_embeddings: bool = False  # token (+ position) embeddings; with tying, the LM head too
    freeze_layers: int = 0  # freeze the first N transformer blocks
    lora_rank: int = 0  # > 0: LoRA adapters on attention and MLP projections, all else frozen
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    require_init: bool = False  # set by finetune experiments: init_from must be given

    def __post_init__(self) -> None:
        check_types(self, "finetune")
        at_least(self, "finetune", 0, ("freeze_layers", "lora_rank"))
        at_least(self, "finetune", 1, ("block_size", "min_block_size"))
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
class DeviceSettings:
    """Where a command computes: the fields every command that runs a model shares, checked once
    (`check_device`). Which device, dtype and thread count they turn into, and why, is decided
    by gpt.runtime.devices when the command starts."""

    device: str = "auto"  # auto = cuda > mps > cpu; or cpu, cuda, cuda:N, mps
    dtype: str = "auto"  # auto = bf16 autocast where supported, fp16 + GradScaler on older GPUs, fp32 elsewhere
    # CPU threads: N | null (OMP_NUM_THREADS, else the cores; a resume keeps its checkpoint's) | auto (follow the load)
    threads: Any = None

    def check_device(self) -> None:
        self.threads = check_threads(self.threads)


@dataclass
class RunConfig(DeviceSettings):
    """`python train.py` / `tinygpt train`: configs/config.yaml on top of this."""

    model: Any = MISSING  # GPTConfig or RNNConfig (gpt.config.model), by the model group's schema
    data: DataSettings = MISSING
    optim: Any = MISSING  # AdamWSettings or MuonSettings, by the optim group's schema
    train: TrainSettings = field(default_factory=TrainSettings)
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)
    paths: PathsSettings = field(default_factory=PathsSettings)
    seed: int = 1337
    resume: str | None = "auto"  # auto (continue this run dir's newest checkpoint) | false | a checkpoint or run dir
    # gpt2 | gpt2-medium | ... | a Hugging Face folder (GPT-2, Llama, Qwen) | a tinygpt checkpoint or run dir
    init_from: str | None = None
    compile: str = "auto"  # auto = on for CUDA | true | false
    # under torchrun: ddp (each process holds the whole model) | fsdp (each holds 1/N of the weights,
    # gradients and optimizer state: FSDP2; GPT models)
    distributed: str = "ddp"
    # distributed=fsdp only: each process's shards of the weights, gradients and AdamW's moments in
    # host memory, the optimizer stepping there; a GPU holds only the weights being gathered
    cpu_offload: bool = False

    def __post_init__(self) -> None:
        check_types(self, "")
        self.check_device()
        self.compile = self.compile.lower()  # compile=true arrives as "True"
        if self.compile not in ("auto", "true", "false"):
            raise TinyGPTError(f"compile={self.compile!r} is not understood; use compile=auto, compile=true or compile=false")
        if self.distributed not in ("ddp", "fsdp"):
            raise TinyGPTError(
                f"distributed={self.distributed!r} is not understood; use distributed=ddp (the default) or distributed=fsdp"
            )
        if self.cpu_offload and self.distributed != "fsdp":
            raise TinyGPTError("cpu_offload=true offloads FSDP2's shards to host memory; add distributed=fsdp (under torchrun)")
