"""Load test of `tinygpt serve`: N concurrent streaming clients against a server on 127.0.0.1.

    python benchmarks/serve.py                                   # gpt-micro shape, 32 clients vs 1 at a time
    python benchmarks/serve.py --clients 8 --max-tokens 100 --shape gpt-nano
    python benchmarks/serve.py --url http://127.0.0.1:8000 --model <id>   # a server you started
    python benchmarks/serve.py --compile                         # the server started with compile=true

Without --url it writes a checkpoint of the given model preset (random weights: speed does not
depend on them; a char vocabulary of printable ASCII), starts `python serve.py` on a free port,
and, after a warm-up round, measures two phases against it, alternated --repeats times (the
median run is reported): all clients at once (batched), and the same requests one at a time
(each waits for the previous). Each client streams one completion of exactly
--max-tokens tokens (no stop strings, no end-of-text in a char vocabulary). Reports throughput
(generated tokens/s over the phase's wall time), p50/p95 time to first token and total latency,
errors, and whether every client got its full text. Bounded: --clients <= 256 and --timeout
seconds per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHARS = ["\n", *[chr(c) for c in range(32, 127)]]


def write_checkpoint(shape: str, folder: Path) -> Path:
    """A run folder holding checkpoints/best.pt of `shape` with random weights."""
    import torch

    from gpt.apps.common import compose
    from gpt.checkpoints import checkpoint, runs
    from gpt.checkpoints.checkpoint import Checkpoint
    from gpt.model import GPT, registry
    from gpt.tokenizers import CharTokenizer

    settings = compose("config", [f"model={shape}", "model.dropout=0.0"]).model
    config = registry.with_vocab(settings, len(CHARS))
    torch.manual_seed(0)
    model = GPT(config)
    run = folder / f"{shape}-random"
    path = run / runs.CKPT_DIR / runs.BEST
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = CharTokenizer(CHARS).to_dict()
    checkpoint.save(path, Checkpoint(model.state_dict(), registry.config_to_dict(config), tokenizer))
    return run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(run: Path, port: int, extra: list[str], within: float = 120) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "serve.py"), f"run_dir={run}", f"port={port}", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() < t0 + within:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                print(f"the server answered {time.time() - t0:.1f} s after its start", flush=True)
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not start within {within:.0f} s")


def one_client(url: str, model: str | None, prompt: str, max_tokens: int, seed: int, timeout: float) -> dict:
    """Stream one completion; its time to first text, total time, tokens and text."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    req = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    t0 = time.perf_counter()
    first, text, tokens, done = None, "", 0, False
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    return {"error": event["error"]["message"]}
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                for choice in event["choices"]:
                    if choice["text"] and first is None:
                        first = time.perf_counter() - t0
                    text += choice["text"]
    except Exception as e:  # counted as an error, with its kind
        return {"error": f"{type(e).__name__}: {e}"}
    total = time.perf_counter() - t0
    if not done or tokens != max_tokens:
        return {"error": f"incomplete: {tokens}/{max_tokens} tokens, [DONE] {'seen' if done else 'missing'}"}
    return {"ttft": first if first is not None else total, "total": total, "tokens": tokens, "text": text}


def phase(url: str, model: str | None, clients: int, max_tokens: int, concurrent: bool, timeout: float) -> dict:
    results: list[dict | None] = [None] * clients

    def run(i: int) -> None:
        results[i] = one_client(url, model, f"Client {i}:\n", max_tokens, seed=i, timeout=timeout)

    t0 = time.perf_counter()
    if concurrent:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
    else:
        for i in range(clients):
            if time.perf_counter() - t0 > timeout:
                break
            run(i)
    wall = time.perf_counter() - t0
    ok = [r for r in results if r and "error" not in r]
    errors = [r["error"] if r else "no answer in time" for r in results if not r or "error" in r]
    ttft = sorted(r["ttft"] for r in ok)
    total = sorted(r["total"] for r in ok)
    pct = lambda xs, q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")  # noqa: E731
    return {
        "mode": "concurrent" if concurrent else "one at a time",
        "clients": clients,
        "wall_s": wall,
        "tokens": sum(r["tokens"] for r in ok),
        "tokens_per_s": sum(r["tokens"] for r in ok) / wall,
        "ttft_p50_ms": 1000 * pct(ttft, 0.5),
        "ttft_p95_ms": 1000 * pct(ttft, 0.95),
        "latency_p50_s": pct(total, 0.5),
        "latency_p95_s": pct(total, 0.95),
        "errors": len(errors),
        "first_errors": errors[:3],
        "full_texts": sum(1 for r in ok if len(r["text"]) == max_tokens),  # a char model: one character a token
        "texts": [r.get("text") if r else None for r in results],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (default: start one on a free 127.0.0.1 port)")
    ap.add_argument("--model", help="model id (default: the server's first)")
    ap.add_argument("--shape", default="gpt-micro", help="model preset for the server this starts")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per phase, at most")
    ap.add_argument("--threads", type=int, default=None, help="the server's CPU threads (default: its choice)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each mode (alternated); the median is reported")
    ap.add_argument("--modes", nargs="+", default=["concurrent", "serial"], choices=["concurrent", "serial"])
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--compile", action="store_true", help="serve with compile=true (its start-up compiles; waited for)")
    args = ap.parse_args()
    if not 1 <= args.clients <= 256:
        ap.error("--clients must be in 1..256")

    proc, url = None, args.url
    with tempfile.TemporaryDirectory(prefix="tinygpt-serve-bench-") as tmp:
        if url is None:
            run = write_checkpoint(args.shape, Path(tmp))
            port = free_port()
            extra = [f"max_batch={max(32, args.clients)}", f"max_queue={args.clients}", f"max_streams={args.clients}"]
            extra += [f"threads={args.threads}"] if args.threads else []
            extra += ["compile=true"] if args.compile else []
            proc = start_server(run, port, extra, within=1800 if args.compile else 120)
            url = f"http://127.0.0.1:{port}"
        try:
            phase(url, args.model, args.clients, 5, True, args.timeout)  # warm-up: first-call costs of every path
            runs: dict[str, list[dict]] = {mode: [] for mode in args.modes}
            for _ in range(args.repeats):  # the modes alternate, so drift affects both alike
                for mode in args.modes:
                    runs[mode].append(phase(url, args.model, args.clients, args.max_tokens, mode == "concurrent", args.timeout))
            # per mode, the run of median throughput
            figures = [sorted(r, key=lambda f: f["tokens_per_s"])[len(r) // 2] for r in runs.values()]
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    print(
        f"{args.clients} clients x {args.max_tokens} tokens, streaming, model {args.model or args.shape} ({url}); "
        f"median of {args.repeats} runs per mode"
    )
    print("| mode | throughput (tokens/s) | TTFT p50 / p95 (ms) | latency p50 / p95 (s) | errors | full texts | wall (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for f in figures:
        print(
            f"| {f['mode']} | {f['tokens_per_s']:.0f} | {f['ttft_p50_ms']:.0f} / {f['ttft_p95_ms']:.0f} | "
            f"{f['latency_p50_s']:.2f} / {f['latency_p95_s']:.2f} | {f['errors']} | {f['full_texts']}/{f['clients']} | {f['wall_s']:.1f} |"
        )
        for e in f["first_errors"]:
            print(f"  error: {e}")
    if len(figures) == 2 and figures[1]["tokens_per_s"] > 0:
        print(f"batched / one at a time: {figures[0]['tokens_per_s'] / figures[1]['tokens_per_s']:.1f}x")
        same = figures[0]["texts"] == figures[1]["texts"]
        print(f"same texts batched and one at a time (seeded): {same}")
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in f.items() if k != "texts"} for f in figures], indent=1))
    os.sys.exit(0 if all(f["errors"] == 0 for f in figures) else 1)


if __name__ == "__main__":
    main()
