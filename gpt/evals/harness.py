"""EleutherAI's lm-evaluation-harness on any tinygpt model: its hundreds of tasks (HellaSwag, ARC,
LAMBADA, MMLU, WikiText, ...) with its own prompts and metrics. Importing this module registers
the model type `tinygpt` with lm_eval; `tinygpt harness ...` (gpt/apps/harness.py) does that and
runs lm_eval's command line.

The three kinds of request lm_eval makes, and what answers them:
- loglikelihood(context, continuation): gpt.evals.scoring, batched; context that does not fit the
  model's window is cut from the left (the harness's rule), a longer continuation is scored a
  window at a time.
- loglikelihood_rolling(document): the document's total log-likelihood, every token scored once,
  block_size tokens at a time, each window with as much context as it holds (the harness's
  rolling windows); recurrent models read the document whole.
- generate_until(context, gen_kwargs): gpt.generation, greedy unless do_sample; it ends at the
  first `until` string (not included), end-of-text, or max_gen_toks tokens.

An empty context, and the first token of a document, are predicted from end-of-text. Tokenizers
without one (char) use a newline instead, the stand-in generation uses for an empty prompt; in a
vocabulary without a newline either, a document's first token is given, not scored.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from gpt.checkpoints import loading
from gpt.config import SamplingSettings
from gpt.errors import TinyGPTError
from gpt.evals.scoring import score
from gpt.generation import encode_prompt, generate
from gpt.runtime import devices

try:
    import lm_eval.models  # noqa: F401  (lm_eval lists its own models only while its registry is empty)
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError:
    raise TinyGPTError("lm-evaluation-harness is not installed; pip install 'tinygpt[eval]'") from None

MODEL_ARGS = ("pretrained", "device", "batch_size", "max_batch_size", "threads")
BATCH_SIZE = 16  # what batch_size=auto gives: tinygpt's models are small, so memory is not probed


@register_model("tinygpt")
class TinyGPTLM(LM):
    """lm_eval's model interface over a tinygpt run directory, checkpoint file, or Hugging Face
    GPT-2 (name or folder); `pretrained` omitted: the newest run under outputs/runs."""

    def __init__(
        self,
        pretrained: str | None = None,
        device: str = "auto",
        batch_size: int | str = BATCH_SIZE,
        max_batch_size: int | None = None,
        threads: int | None = None,
    ):
        super().__init__()
        rt = devices.setup(str(device), "float32", False, threads=threads)
        loaded = loading.load(source(pretrained), dropout=0.0)
        print(f"tinygpt: {loaded.source}; {rt.describe()}", file=sys.stderr)
        self.model = rt.place(loaded.model)
        self.tokenizer = loaded.tokenizer()
        self._device = rt.device
        self.batch_size = _batch_size(batch_size, max_batch_size)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> TinyGPTLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> TinyGPTLM:
        check_args(arg_dict)
        # lm_eval always passes its own --device and --batch_size (device defaulting to cuda:0);
        # the same keys in --model_args are the more specific choice, and win instead of clashing.
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = [self._encode_pair(*r.args) for r in requests]
        results = [(s.logprob, s.greedy) for s in score(self.model, pairs, self.device, self.batch_size)]
        return self._cached("loglikelihood", requests, results)

    def loglikelihood_rolling(self, requests) -> list[float]:
        documents = [self._start() + self.tokenizer.encode(r.args[0]) for r in requests]
        # Scored as the continuation of its first token: gpt.evals.scoring takes block_size targets at a
        # time, each with the longest context its window allows (the harness's rolling windows).
        scored = [n for n, tokens in enumerate(documents) if len(tokens) > 1]
        pairs = [(documents[n][:1], documents[n][1:]) for n in scored]
        totals = [0.0] * len(requests)
        for n, s in zip(scored, score(self.model, pairs, self.device, self.batch_size)):
            totals[n] = s.logprob
        return self._cached("loglikelihood_rolling", requests, totals)

    def generate_until(self, requests) -> list[str]:
        # Requests with the same generation settings share batches (a task's usually all do).
        groups: dict[str, list[int]] = {}
        for number, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items())), []).append(number)
        texts: list[str] = [""] * len(requests)
        for numbers in groups.values():
            settings = _sampling(requests[numbers[0]].args[1])
            sampled = settings.temperature > 0
            size = 1 if sampled else self.batch_size
            for begin in range(0, len(numbers), size):
                batch = numbers[begin : begin + size]
                # A sampled request draws from a seed of its own: repeats of a prompt (maj@k) must differ.
                cfg = replace(settings, seed=settings.seed + batch[0]) if sampled else settings
                out = generate(self.model, self.tokenizer, [requests[n].args[0] for n in batch], cfg)
                for n, samples in zip(batch, out):
                    texts[n] = samples[0]
        return self._cached("generate_until", requests, texts)

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        # Trailing whitespace of the context goes to the continuation, as the harness moves it:
        # BPE spells a word with its leading space (" Paris"), never as a lone space then "Paris".
        cut = len(context) - len(context.rstrip())
        if cut:
            context, continuation = context[:-cut], context[-cut:] + continuation
        head = self.tokenizer.encode(context) if context else encode_prompt(self.tokenizer, "", None)
        return head, self.tokenizer.encode(continuation)

    def _start(self) -> list[int]:
        try:
            return encode_prompt(self.tokenizer, "", None)
        except TinyGPTError:
            return []

    def _cached(self, kind: str, requests, results: list) -> list:
        # lm_eval's --use_cache stores what passes through this hook
        for request, result in zip(requests, results):
            self.cache_hook.add_partial(kind, request.args, result)
        return results


def check_args(args: dict) -> None:
    unknown = [k for k in args if k not in MODEL_ARGS]
    if unknown:
        raise TinyGPTError(f"model_args: tinygpt has no {unknown[0]!r}; it takes {', '.join(MODEL_ARGS)}")


def source(pretrained: str | None) -> str:
    """What pretrained= names; omitted, the newest run under outputs/runs."""
    if pretrained:
        return str(pretrained)
    try:
        return loading.choose()
    except TinyGPTError as e:  # its hint names other commands' settings (run_dir=, ckpt=)
        reason = str(e).split("; ")[0]
        raise TinyGPTError(f"{reason}; name a model with --model_args pretrained=<run directory | checkpoint | gpt2>") from None


def _batch_size(value: int | str, largest: int | None) -> int:
    text = str(value)
    if text.startswith("auto"):
        return int(largest or BATCH_SIZE)
    if not text.isdigit() or int(text) < 1:
        raise TinyGPTError(f"batch_size={value!r}: use a positive integer or auto")
    return int(text)


def _sampling(kwargs: dict) -> SamplingSettings:
    """The gen_kwargs lm_eval passes, as tinygpt's sampling settings; others (HF-only) are ignored."""
    until = kwargs.get("until") or []
    until = [until] if isinstance(until, str) else until
    temperature = float(kwargs.get("temperature", 1.0)) if kwargs.get("do_sample") else 0.0
    sampled = temperature > 0
    return SamplingSettings(
        max_new_tokens=int(kwargs.get("max_gen_toks", 256)),
        temperature=temperature,
        top_k=kwargs.get("top_k") if sampled else None,
        top_p=kwargs.get("top_p") if sampled else None,
        stop=[s for s in until if s],
    )
