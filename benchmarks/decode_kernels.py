"""Decoding on a GPU, step by step: which attention kernel a decode step gets, what it costs, and
where the host waits for the device.

The first device run (2026-12-04, one H200) decoded the 124M shape at ~21 tokens/s at batch 1
with the KV cache (~47 ms a token; 18 tokens/s without), where the first token (the 128-token
prompt and the first draw) took 6 ms. This script splits that up:

Decoding as gpt.generation ships it keeps cuDNN's attention out of decode steps
(gpt.generation.decoder.DECODE_KERNELS); the rows under each other choice set that aside.

1. one decode step's attention alone (the KV cache's shapes: 1 query, L keys, a boolean mask),
   under each SDPA kernel choice, at a key length seen for the first time and again at the same
   length: a kernel that builds a plan for each new shape pays it at every generated token;
2. the Decoder's tokens/s at the 124M shape (random weights, bf16 autocast, sample.py's sampling
   defaults), batch 1 and 8, as gpt.generation ships it and under each kernel choice;
3. the host syncs of a decode step: CUDA's sync debug mode set to "error" turns the first one
   into an exception whose traceback names the line.

    python benchmarks/decode_kernels.py               # on a CUDA GPU (~30 s on an H200)
    python benchmarks/decode_kernels.py --smoke       # the plumbing on a CPU, tiny shapes

Prints one JSON object per measurement and a summary table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

CHOICES = {
    "torch's default": None,
    "cudnn only": [SDPBackend.CUDNN_ATTENTION],
    "efficient only": [SDPBackend.EFFICIENT_ATTENTION],
    "math only": [SDPBackend.MATH],
    "all but cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
}


def kernels(choice):
    return contextlib.nullcontext() if choice is None else sdpa_kernel(choice)


def timed(fn, sync, repeat: int = 1) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync()
    return (time.perf_counter() - t0) / repeat


def attention_alone(device, sync, smoke: bool) -> list[dict]:
    """One query against L keys with a boolean mask, as KVCache.positions makes it."""
    heads, dim = (2, 16) if smoke else (12, 64)
    dtype = torch.float32 if smoke else torch.bfloat16
    out = []
    for name, choice in CHOICES.items():
        row = {"part": "attention", "choice": name}
        try:
            with kernels(choice):
                for length in (200, 201, 202):
                    q = torch.randn(1, heads, 1, dim, device=device, dtype=dtype)
                    k = torch.randn(1, heads, length, dim, device=device, dtype=dtype)
                    v = torch.randn_like(k)
                    mask = torch.ones(1, 1, 1, length, dtype=torch.bool, device=device)
                    call = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: B023,E731
                    row[f"first_ms_L{length}"] = timed(call, sync) * 1000
                    row[f"again_ms_L{length}"] = timed(call, sync, repeat=20) * 1000
            row["status"] = "ok"
        except RuntimeError as e:
            row["status"] = f"refused: {str(e).splitlines()[0][:160]}"
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def decoder_speed(device, sync, smoke: bool, new: int) -> list[dict]:
    from gpt.apps.common import compose
    from gpt.config import SamplingSettings
    from gpt.generation import Decoder
    from gpt.generation import decoder as decoding
    from gpt.model import registry
    from gpt.runtime import devices

    tiny = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=64"] if smoke else []
    rt = devices.setup(str(device), "float32" if smoke else "auto", False)
    torch.manual_seed(0)
    config = registry.with_vocab(compose("config", ["experiment=gpt2_124m", *tiny]).model, 50257)
    model = registry.build(config).to(rt.device).eval()
    prompt = 8 if smoke else 128
    out = []
    with torch.inference_mode(), rt.autocast():
        shipped = decoding.DECODE_KERNELS
        for name, choice in {"as shipped": None, **CHOICES}.items():
            # the Decoder's own choice (gpt.generation.decoder.DECODE_KERNELS) would override the outer one
            decoding.DECODE_KERNELS = shipped if name == "as shipped" else None
            for batch in (1, 8):
                ids = torch.randint(0, 50257, (batch, prompt), generator=torch.Generator().manual_seed(batch)).tolist()
                settings = SamplingSettings(max_new_tokens=new, kv_cache=True)
                row = {"part": "decoder", "choice": name, "batch": batch}
                try:
                    with kernels(choice):
                        warm = Decoder(model, ids, settings, seeds=list(range(batch)))
                        warm.steps(4)
                        decoder = Decoder(model, ids, settings, seeds=list(range(batch)))
                        first = timed(lambda: decoder.steps(1), sync)  # noqa: B023
                        rest = timed(lambda: decoder.steps(new - 1), sync)  # noqa: B023
                    row.update(first_ms=first * 1000, ms_per_token=rest / (new - 1) * 1000, tokens_per_s=batch * (new - 1) / rest)
                    row["status"] = "ok"
                except RuntimeError as e:
                    row["status"] = f"refused: {str(e).splitlines()[0][:160]}"
                print(json.dumps(row), flush=True)
                out.append(row)
        decoding.DECODE_KERNELS = shipped
        if device.type == "cuda":
            out.append(first_sync(model, sync))
    return out


def first_sync(model, sync) -> dict:
    """The line of gpt/ where a decode step (after the prompt's) first makes the host wait."""
    from gpt.config import SamplingSettings
    from gpt.generation import Decoder

    decoder = Decoder(model, [[1, 2, 3, 4]], SamplingSettings(max_new_tokens=16), seeds=[0])
    decoder.steps(2)
    sync()
    row = {"part": "first host sync in decoder.steps(4)"}
    torch.cuda.set_sync_debug_mode("error")
    try:
        decoder.steps(4)
        row["where"] = "none before the read of the 4 steps' tokens"
    except RuntimeError as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "/gpt/" in f.filename or "/torch/nn/" in f.filename]
        row["where"] = [f"{Path(f.filename).name}:{f.lineno} {f.line}" for f in frames[-4:]]
        row["error"] = str(e).splitlines()[0][:200]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--new", type=int, default=64, help="tokens decoded a row (default 64)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None, help="also write every row here (JSON)")
    a = ap.parse_args()
    device = torch.device("cpu" if a.smoke else a.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        print(
            json.dumps(
                {
                    "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(),
                    "cudnn": torch.backends.cudnn.version(),
                    "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
                }
            ),
            flush=True,
        )
    rows = attention_alone(device, sync, a.smoke) + decoder_speed(device, sync, a.smoke, 8 if a.smoke else a.new)
    print("\n| part | choice | batch | status | figures |\n|---|---|---|---|---|")
    for r in rows:
        figures = {k: round(v, 3) for k, v in r.items() if isinstance(v, float)}
        print(f"| {r['part']} | {r.get('choice', '')} | {r.get('batch', '')} | {r.get('status', r.get('where'))} | {figures} |")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
