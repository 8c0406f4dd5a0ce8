"""Every block option (gpt/model: norm, mlp, qk_norm, tie_embeddings, bias, logit_softcap, and
their Llama combination) through everything a model goes through, on a tiny model trained from
the real configs: training, a stop and a bitwise resume, greedy sampling with and without the
KV cache, evaluation, the server's batching engine, a LoRA finetune, and export (into
transformers where a format computes it, else refused by name).
Run: pytest tests/test_block_options.py"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpt import interop
from gpt.checkpoints import checkpoint, loading, runs
from gpt.config import SamplingSettings
from gpt.evals.perplexity import evaluate_tokens
from gpt.generation import generate
from helpers import compose, train_recording_losses

OPTIONS = {
    "rmsnorm": ["model.norm=rmsnorm"],
    "swiglu": ["model.mlp=swiglu", "model.mlp_hidden=48"],
    "relu2": ["model.mlp=relu2"],
    "qk_norm": ["model.qk_norm=true", "model.pos_encoding=rope"],
    "untied": ["model.tie_embeddings=false"],
    "no_bias": ["model.bias=false"],
    "softcap": ["model.logit_softcap=5.0"],
    "llama": [
        "model=llama-nano",
        "model.n_layer=1",
        "model.n_head=3",
        "model.n_embd=18",
        "model.mlp_hidden=48",
        "model.n_kv_head=1",
    ],
    "quickstart": ["model=gpt-micro-modern", "model.n_layer=1", "model.n_head=3", "model.n_embd=18"],  # the default's block
    "modern": [  # modded-nanogpt's and nanochat's choices together
        *("model.norm=rmsnorm", "model.mlp=relu2", "model.pos_encoding=rope", "model.qk_norm=true"),
        *("model.bias=false", "model.logit_softcap=15.0", "model.tie_embeddings=false"),
    ],
}
RUN = ["debug=tiny", "train.max_iters=10", "train.eval_interval=5", "train.sample_tokens=0", "threads=1", "optim=adamw"]


def _train(overrides, out, stop_after=None) -> dict[int, float]:
    return train_recording_losses(compose(overrides, out), stop_after)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_block_option_trains_resumes_samples_evaluates_serves_finetunes_and_exports(option, tmp_path, data_root):
    root, data_overrides = data_root
    overrides = [*RUN, *OPTIONS[option], *data_overrides, f"paths.data_dir={root}"]
    full = _train(overrides, tmp_path / "full")
    first = _train(overrides, tmp_path / "split", stop_after=6)
    rest = _train(overrides, tmp_path / "split")
    assert sorted(first) == list(range(1, 7)) and sorted(rest) == list(range(7, 11))
    assert {**first, **rest} == full  # bitwise: the same floats at every step
    a, b = (checkpoint.load(runs.latest(tmp_path / d)).model for d in ("full", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)

    loaded = loading.load(str(tmp_path / "full"))
    model, tok = loaded.model, loaded.tokenizer()
    with torch.no_grad():  # weights far from init, so that the samples depend on the context
        for p in model.parameters():
            p.mul_(4)
    greedy = [
        generate(model, tok, ["ROMEO:", "KING"], SamplingSettings(max_new_tokens=30, temperature=0.0, kv_cache=cache))
        for cache in (True, False)
    ]
    assert greedy[0] == greedy[1]  # 30 tokens: past the 16-token context, the cache recomputes as without it
    scored = evaluate_tokens(model, np.array(tok.encode("ROMEO: But soft, what light through yonder window breaks?")), tok, "cpu")
    assert np.isfinite(scored["loss"]) and scored["tokens"] > 16
    _served_equals_generated(model, tok, greedy[0])

    tuned = _train([*overrides, f"init_from={tmp_path / 'full'}", "finetune.lora_rank=2", "train.max_iters=4"], tmp_path / "lora")
    assert sorted(tuned) == [1, 2, 3, 4] and all(np.isfinite(list(tuned.values())))
    _exports(loading.load(str(tmp_path / "lora")), tmp_path / "hf", option)


def _served_equals_generated(model, tok, want) -> None:
    """The server's engine, both prompts batched: the texts generation gives each alone."""
    pytest.importorskip("fastapi")
    import threading

    from gpt.serve.engine import Engine, Job

    texts, ended, finished = {0: "", 1: ""}, [], threading.Event()

    def emit(events):
        for e in events:
            if e[0] == "text":
                texts[e[1]] += e[2]
            elif e[0] == "end":
                ended.append(e[1])
        if len(ended) == 2:
            finished.set()

    engine = Engine(model, tok, max_batch=4)
    try:
        job = Job([tok.encode("ROMEO:"), tok.encode("KING")], SamplingSettings(max_new_tokens=30, temperature=0.0), 1, emit=emit)
        assert engine.submit(job) and finished.wait(30)
        assert [texts[0], texts[1]] == [want[0][0], want[1][0]]
    finally:
        engine.close()


def _exports(loaded, out, option) -> None:
    """Into transformers, whatever the block: GPT-2's or Llama's format where one computes the
    model, else tinygpt's own (its modeling code in the folder); logits within 1e-5."""
    transformers = pytest.importorskip("transformers")
    model = loaded.model
    folder, cls = interop.export(model, loaded.tokenizer(), out)
    from gpt.interop import gpt2, llama

    remote = cls.startswith("TinyGPT")  # a transformers class wherever one computes the block:
    assert remote == (gpt2.cannot_export(model.config) is not None and llama.cannot_export(model.config) is not None), cls
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=remote).eval()
    idx = torch.randint(0, model.config.vocab_size, (2, model.config.block_size))
    with torch.no_grad():
        assert (model.eval()(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
