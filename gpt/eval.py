"""Loss, perplexity and bits per byte of a model on a data split or a text file:

    python -m gpt.eval ckpt=outputs/runs/<stamp>/checkpoints/best.pt            # its data's val split
    python -m gpt.eval run_dir=outputs/runs/<stamp> split=train max_tokens=200000
    python -m gpt.eval init_from=gpt2 text_file=essay.txt
    python -m gpt.eval ckpt=... data=shakespeare split=val                     # another prepared dataset
    python -m gpt.eval runs_dir=elsewhere                                       # the newest run under it

With neither ckpt, run_dir nor init_from, the newest run under runs_dir (default: outputs) is used.

Every token is scored once: the text is cut into consecutive windows of block_size + 1 tokens
(the first token of each window is context only). Bits per byte = total loss / ln 2 / the UTF-8
bytes of the scored text, which compares models with different tokenizers.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch

from gpt.errors import TinyGPTError


def token_bytes(tokenizer, ids) -> int:
    """UTF-8 bytes the ids stand for, token by token: end-of-text counts 0, and a character
    split over several BPE/byte tokens counts once (decoding windows whole would not)."""
    kind = getattr(tokenizer, "kind", None)
    eot = getattr(tokenizer, "eot_id", None)
    if kind == "tiktoken":
        return sum(len(tokenizer.enc.decode_single_token_bytes(i)) for i in ids if i != eot)
    if kind == "byte":
        return sum(1 for i in ids if i < 256)
    return sum(len(tokenizer.decode([i]).encode("utf-8")) for i in ids if i != eot)


@torch.no_grad()
def evaluate_tokens(model, tokens: np.ndarray, tokenizer, device, batch_size: int = 16, max_tokens: int | None = None) -> dict:
    block = model.config.block_size
    tokens = np.asarray(tokens[: max_tokens + 1] if max_tokens else tokens)
    n_windows = (len(tokens) - 1) // block
    if n_windows < 1:
        raise TinyGPTError(f"the text has {len(tokens)} tokens; evaluating needs more than block_size={block}")
    model.eval()
    total_loss, total_tokens, total_bytes = 0.0, 0, 0
    for start in range(0, n_windows, batch_size):
        rows = range(start, min(start + batch_size, n_windows))
        windows = np.stack([tokens[r * block : r * block + block + 1] for r in rows]).astype(np.int64)
        x = torch.from_numpy(windows[:, :-1]).to(device)
        y = torch.from_numpy(windows[:, 1:]).to(device)
        logits, _ = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
        total_loss += loss.item()
        total_tokens += y.numel()
        total_bytes += token_bytes(tokenizer, windows[:, 1:].ravel().tolist())
    mean = total_loss / total_tokens
    return {"tokens": total_tokens, "bytes": total_bytes, "loss": mean, "perplexity": math.exp(mean),
            "bits_per_byte": total_loss / math.log(2) / max(total_bytes, 1)}


def main(argv: list[str]) -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from gpt import checkpoint, runtime
    from gpt.cli import check_keys, fail, guard, preflight
    from gpt.data import load_data
    from gpt.pretrained import load_initial
    from gpt.sampling import load_model
    from gpt.tokenizer import tokenizer_from_dict

    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return
    opts = {"ckpt": None, "run_dir": None, "init_from": None, "text_file": None, "split": "val", "max_tokens": None,
            "batch_size": "16", "device": "auto", "runs_dir": checkpoint.RUNS_DIR}
    data_overrides = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in opts:
            opts[key] = value
        else:
            data_overrides.append(arg)
    for key in ("max_tokens", "batch_size"):
        if opts[key] is not None and not str(opts[key]).isdigit():
            fail(f"{key}={opts[key]!r} must be a positive integer")
    configs = Path(__file__).resolve().parent.parent / "configs"
    preflight(data_overrides, configs)
    check_keys(data_overrides, configs, "config")

    def run():
        rt = runtime.setup(opts["device"], "auto", False)
        if opts["init_from"]:
            model, tokenizer_spec = load_initial(opts["init_from"], dropout=0.0)
            tokenizer = tokenizer_from_dict(tokenizer_spec)
            model.to(rt.device)
            train_cfg, what = None, opts["init_from"]
        else:
            path = checkpoint.resolve(opts["ckpt"], opts["run_dir"], opts["runs_dir"])
            model, tokenizer, ckpt = load_model(path, rt.device)
            train_cfg, what = ckpt.get("config"), str(path)
        max_tokens = int(opts["max_tokens"]) if opts["max_tokens"] else None
        if opts["text_file"]:
            text_path = Path(opts["text_file"]).expanduser()
            if not text_path.is_file():
                raise TinyGPTError(f"text_file {text_path} does not exist")
            tokens = np.array(tokenizer.encode(text_path.read_text(encoding="utf-8")), dtype=np.int64)
            source = str(text_path)
        else:
            with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
                cfg = OmegaConf.to_container(compose("config", overrides=[*data_overrides, "paths.output_dir=."]), resolve=True)
            data_cfg = cfg["data"] if (data_overrides or not train_cfg) else train_cfg["data"]
            data = load_data(data_cfg, cfg["paths"]["data_dir"], log=lambda *a: None)
            from gpt.tokenizer import tokenizer_identity

            if tokenizer_identity(data.tokenizer.to_dict()) != tokenizer_identity(tokenizer.to_dict()):
                raise TinyGPTError(f"data {data.name} uses another tokenizer than the model; pick data prepared with the model's")
            split = opts["split"]
            if split not in ("train", "val"):
                raise TinyGPTError(f"split={split!r}: use train or val")
            # Only what is evaluated leaves the memmaps (a train split can be far larger than RAM).
            need = (max_tokens + 1) if max_tokens else None
            taken, have = [], 0
            for shard in getattr(data, split):
                taken.append(np.asarray(shard if need is None else shard[: need - have]))
                have += len(taken[-1])
                if need is not None and have >= need:
                    break
            tokens = np.concatenate(taken)
            source = f"{data.name} {split}"
        r = evaluate_tokens(model, tokens, tokenizer, rt.device, int(opts["batch_size"]), max_tokens)
        print(f"{what} on {source}: {r['tokens']:,} tokens ({r['bytes']:,} bytes): loss {r['loss']:.4f}, "
              f"perplexity {r['perplexity']:.2f}, bits per byte {r['bits_per_byte']:.4f}")
        return r

    guard(run)


if __name__ == "__main__":
    main(sys.argv[1:])
