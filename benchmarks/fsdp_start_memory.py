"""What starting a sharded finetune from a Hugging Face folder costs rank 0 in private memory:
the folder's weights mapped (loading.load(mapped=True), what `distributed=fsdp` does) against
read into a float32 model (what every other command does, and what FSDP2's start did before).

The folder is SmolLM2-360M's shape (32 Llama blocks, 960 wide, 15 heads of which 5 key/value, a
tied head) with random weights saved in bf16, as the Hub's is, and a 400-token BPE trained on Tiny
Shakespeare (its own 49,152-token vocabulary has no tokenizer here): 315M parameters, 0.63 GB.

1. `loading.load` alone, each way in a fresh process: the growth of its private memory (RssAnon
   in /proc/self/status: memory no file backs; the mapped folder's pages are RssFile, the page
   cache's, shared and reclaimable) and the wall time.
2. A real `torchrun --nproc_per_node=2 train.py init_from=<folder> distributed=fsdp` of one step
   (AdamW, fp32, the folder's text as data): each rank's private memory sampled every 20 ms, its
   peak over the start (until its "optimizer ..." line: the model loaded, sharded and filled,
   the optimizer built, its moments not yet allocated) and over the whole run, and the kernel's high-water
   mark of its whole resident memory (VmHWM, file pages included). `--repo` runs another
   checkout's train.py (an older commit, for the comparison).

3. With `--new-run`, a new run of that shape from scratch instead (the preset smollm2-135m made
   SmolLM2-360M's shape, over the text's bytes: 316M parameters, 1.18 GiB in fp32), whose
   initial weights rank 0 builds whole and scatters to the shards (gpt.training.parallel.
   load_from_rank_0; from 2026-12-05 to 12-06 every process drew its own shards by replaying the
   build's fills instead); parts 1 and 2 are skipped.

    python benchmarks/fsdp_start_memory.py [--repo PATH] [--data PATH/TO/input.txt] [--new-run]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
GIB = 1024**3

LOAD = """
import re, sys, time
def anon():
    return int(re.search(r"RssAnon:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
from gpt.checkpoints import loading
before, start = anon(), time.perf_counter()
model = loading.load(sys.argv[1], mapped=sys.argv[2] == "mapped").model
print(anon() - before, time.perf_counter() - start, sum(p.numel() for p in model.parameters()))
"""


def make_folder(out: Path, text: str) -> Path:
    import torch
    import transformers

    from gpt.tokenizers.bpe import train_bpe

    bpe = train_bpe([text], 400)
    config = transformers.LlamaConfig(
        vocab_size=bpe.vocab_size, hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
        num_attention_heads=15, num_key_value_heads=5, max_position_embeddings=2048, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = out / "smollm2-360m-shape"
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    (folder / "tokenizer.json").write_text(bpe.json_text)
    return folder


def _status(pid: int, field: str) -> int | None:
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(f"{field}:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def _workers(launcher: int) -> dict[int, int]:
    """{pid: rank} of torchrun's workers (processes whose environment holds RANK, below the launcher)."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != launcher:
                continue
            env = (proc / "environ").read_bytes().split(b"\0")
            rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
            if rank is not None:
                found[int(proc.name)] = rank
        except (OSError, ValueError, IndexError):
            continue
    return found


# SmolLM2-360M's shape from the 135M preset, for a new run (--new-run)
NEW_RUN = [
    "model=smollm2-135m", "model.n_layer=32", "model.n_embd=960", "model.n_head=15", "model.n_kv_head=5",
    "model.mlp_hidden=2560", "model.block_size=32", "data.tokenizer.kind=byte",
]  # fmt: skip


def sharded_start(repo: Path, folder: Path | None, corpus: Path, out: Path) -> list[list[int]]:
    """[peak private bytes over the start, over the run, VmHWM bytes] of each rank over a one-step
    FSDP2 finetune from `folder`, or a new run of NEW_RUN's shape where `folder` is None."""
    start = (
        [f"init_from={folder}", "data.tokenizer.kind=hf", f"data.tokenizer.name={folder}", "finetune.block_size=32"]
        if folder is not None
        else NEW_RUN
    )
    args = [
        *start, "data=local", f"data.source.path={corpus}", "data.name=start_memory", "data.split_by=tail",
        "optim=adamw", "dtype=float32", "device=cpu",
        "threads=1", "train.batch_size=1", "train.max_iters=1", "train.eval_interval=1",
        "train.eval_iters=1", "train.sample_tokens=0", "train.eval_sample_tokens=0", "train.log_interval=1", "distributed=fsdp",
        f"hydra.run.dir={out}", f"paths.data_dir={out.parent / 'data'}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(repo / "train.py")]
    peaks: dict[int, list[int]] = {}
    with tempfile.NamedTemporaryFile("w+") as log:
        proc = subprocess.Popen([*launch, *args], env=env, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=repo)
        ranks: dict[int, int] = {}
        started = False
        while proc.poll() is None:
            if len(ranks) < 2:
                ranks.update(_workers(proc.pid))
            started = started or re.search(r"^(\[\w+\]:)?optimizer ", Path(log.name).read_text(), re.M) is not None
            for pid, rank in ranks.items():
                anon, hwm = _status(pid, "RssAnon"), _status(pid, "VmHWM")
                if anon is not None:
                    old = peaks.get(rank, [0, 0, 0])
                    peaks[rank] = [old[0] if started else max(old[0], anon), max(old[1], anon), max(old[2], hwm or 0)]
            time.sleep(0.02)
        if proc.returncode != 0:
            raise SystemExit(Path(log.name).read_text()[-3000:])
    return [peaks.get(r, [0, 0, 0]) for r in range(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(REPO), help="the checkout whose train.py runs part 2")
    parser.add_argument("--data", default=None, help="Tiny Shakespeare's input.txt (default: $TINYGPT_DATA_DIR's)")
    parser.add_argument("--new-run", action="store_true", help="part 3: a new run of the shape, no folder")
    a = parser.parse_args()
    data = Path(a.data or Path(os.environ.get("TINYGPT_DATA_DIR", "data")) / "tinyshakespeare" / "input.txt")
    text = data.read_text()[:200_000]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.txt"
        corpus.write_text(text)
        if a.new_run:
            _print_peaks("one-step FSDP2 new run of the shape", a.repo, sharded_start(Path(a.repo), None, corpus, tmp / "run"))
            return
        folder = make_folder(tmp, text)
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        print(f"folder: {size / GIB:.2f} GiB of bf16 weights")
        print("| loading.load | private memory grown | wall time | parameters |\n| --- | ---: | ---: | ---: |")
        for how in ("read", "mapped"):
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
            out = subprocess.run([sys.executable, "-c", LOAD, str(folder), how], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(out.stderr[-3000:])
            grown, seconds, params = out.stdout.split()
            print(f"| {how} | {int(grown) / GIB:.2f} GiB | {float(seconds):.1f} s | {int(params):,} |", flush=True)
        _print_peaks(
            "\none-step FSDP2 finetune from the folder", a.repo, sharded_start(Path(a.repo), folder, corpus, tmp / "run")
        )


def _print_peaks(title: str, repo: str, peaks: list[list[int]]) -> None:
    print(f"{title}, 2 processes ({repo}):")
    print("| rank | peak private memory, start | peak private memory, run | peak resident (VmHWM) |")
    print("| --- | ---: | ---: | ---: |")
    for rank, (start, run, hwm) in enumerate(peaks):
        print(f"| {rank} | {start / GIB:.2f} GiB | {run / GIB:.2f} GiB | {hwm / GIB:.2f} GiB |")


if __name__ == "__main__":
    main()
