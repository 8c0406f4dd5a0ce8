"""The settings of the commands other than training: the generation controls (SamplingSettings)
and `tinygpt sample`, `chat`, `serve`, `eval`, `export`, `sweep` and `scaling`. Each checks
itself in `__post_init__`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from gpt.config.checks import MISSING, at_least, check_types
from gpt.config.run import DataSettings, DeviceSettings, PathsSettings
from gpt.errors import TinyGPTError

_NOT_CONTROLS = ("max_new_tokens", "stop", "stop_at_eot", "seed", "kv_cache")


def _stop_strings(stop) -> tuple[str, ...]:
    """stop=END and 'stop=[END,"\n\n"]' both work; a number or a mapping is refused (Hydra reads
    stop=5 as the number, whose text as typed is gone: 5.0 and 5 alike)."""
    items = list(stop) if isinstance(stop, (list, tuple)) else [] if stop is None else [stop]
    wrong = [item for item in items if not isinstance(item, str)]
    if wrong:
        raise TinyGPTError(f"stop takes strings, got {wrong[0]!r}; quote it, e.g. 'stop=\"5\"' or 'stop=[END,\"5\"]'")
    return tuple(items)


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
        self.stop = _stop_strings(self.stop)
        at_least(self, "", 1, ("max_new_tokens",))
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
    init_from: str | None = None  # gpt2 | gpt2-medium | ... | owner/name | a Hugging Face folder (GPT-2, Llama, Qwen, tinygpt)
    paths: PathsSettings = field(default_factory=PathsSettings)


@dataclass
class SampleConfig(SamplingSettings, ModelChoice, DeviceSettings):
    """`python sample.py` / `tinygpt sample`."""

    prompt: str = "\n"  # taken verbatim from the command line; "-" reads stdin; "" starts from end-of-text
    prompt_file: str | None = None  # one prompt, or one per line when it ends in .jsonl
    num_samples: int = 3  # per prompt
    stream: bool = True  # print tokens as they come; false: all prompts as one padded batch
    out_file: str | None = None  # also append {prompt, text, settings} records to this JSONL file
    compile: bool = False  # torch.compile the model first (minutes of compiling on a CPU, once: docs/sampling.md)

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, "", 1, ("num_samples",))
        self.check_device()


@dataclass
class ChatConfig(SamplingSettings, ModelChoice, DeviceSettings):
    """`tinygpt chat`: talk to a model finetuned on conversations (gpt.chat)."""

    max_new_tokens: int = 256  # per reply
    system: str | None = None  # a system message that opens the conversation (kept when old turns are dropped)
    compile: bool = False  # torch.compile the model first, as sample.py's compile=true (pays over a long conversation)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_device()


@dataclass
class ServeConfig(ModelChoice, DeviceSettings):
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
    compile: bool = False  # torch.compile each model for decoding, at start-up (minutes on a CPU: docs/serving.md)

    def __post_init__(self) -> None:
        check_types(self, "")
        positive = ("max_batch", "max_streams", "max_body_bytes", "max_prompt_tokens", "max_tokens", "max_n")
        at_least(self, "", 1, positive)
        self.check_device()
        at_least(self, "", 1, ("max_queue",))  # every request waits in the queue, if only for a step
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
        at_least(self, "task", 1, ("limit",))


@dataclass
class EvalConfig(ModelChoice, DeviceSettings):
    """`tinygpt eval`: loss, perplexity and bits per byte on a text file or a data split."""

    text_file: str | None = None  # a text file to score; else a split of the model's data (or data=...)
    split: str = "val"  # train | val
    max_tokens: int | None = None  # score at most this many tokens
    stride: int | None = None  # sliding-window step: each target gets >= block_size - stride tokens of context; null: block_size
    batch_size: int = 16
    data: DataSettings | None = None  # another dataset (data=<config of configs/data/>); null: the model's own
    task: TaskSettings | None = None  # a zero-shot task (task=<name>) instead of perplexity

    def __post_init__(self) -> None:
        check_types(self, "")
        at_least(self, "", 1, ("max_tokens", "stride", "batch_size"))
        self.check_device()
        if self.split not in ("train", "val"):
            raise TinyGPTError(f"split={self.split!r}: use train or val")
        if self.task is not None and (self.text_file or self.data is not None):
            raise TinyGPTError("task= scores a zero-shot task, text_file=/data= a text's perplexity: pass one of them")


@dataclass
class ExportConfig(ModelChoice):
    """`tinygpt export`: a checkpoint to a Hugging Face folder (GPT-2, Llama, Qwen2/3, or tinygpt's own with its
    modeling code), or to one GGUF file for llama.cpp, Ollama and LM Studio (format=gguf)."""

    out: str = MISSING  # the folder to write (format=gguf: the .gguf file)
    format: str = "hf"  # hf (a Hugging Face folder) | gguf (one llama.cpp file: gpt2, llama, qwen2 or qwen3)
    quant: str | None = None  # format=gguf: f32 | f16 | q8_0 (null: f32); the matrices' type, vectors stay f32

    def __post_init__(self) -> None:
        check_types(self, "")
        if self.format not in ("hf", "gguf"):
            raise TinyGPTError(f"format={self.format!r} is unknown; use hf (a Hugging Face folder) or gguf (llama.cpp)")
        if self.quant is not None and self.format != "gguf":
            raise TinyGPTError(f"quant={self.quant} is a GGUF setting; add format=gguf (a Hugging Face folder keeps fp32)")
        if self.quant is not None and self.quant not in ("f32", "f16", "q8_0"):
            raise TinyGPTError(f"quant={self.quant!r} is not a GGUF type tinygpt writes; use f32, f16 or q8_0")


@dataclass
class PlotConfig:
    """`tinygpt plot`: a run's loss curves, or its model's attention maps for a prompt."""

    run_dir: str | None = None  # a run directory (null: the newest run under paths.runs_dir)
    attention: str | None = None  # a prompt: draw the attention maps the model computes for it instead
    layers: list[int] | None = None  # with attention: the layers to draw (null: all)
    out: str | None = None  # the PNG to write (null: <run_dir>/curves.png, or <run_dir>/attention.png)
    paths: PathsSettings = field(default_factory=PathsSettings)

    def __post_init__(self) -> None:
        check_types(self, "")


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
