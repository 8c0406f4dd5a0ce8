"""GPT-2 weights in and out, in Hugging Face's format (config.json + model.safetensors or
pytorch_model.bin), so models move between tinygpt and the transformers ecosystem.

Hugging Face's GPT-2 stores its projections as `Conv1D` layers, whose weights are the transpose
of an `nn.Linear`'s; everything else maps one to one. OpenAI's GPT-2 uses the tanh
approximation of GELU, so imported models get `activation="gelu_tanh"`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gpt import io
from gpt.errors import TinyGPTError
from gpt.hf_tokenizer import HFTokenizer
from gpt.model import GPT, GPTConfig
from gpt.tokenizer import TiktokenTokenizer

HUB_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# transformers' names of the two GELUs tinygpt's GPT implements (gelu_new, gelu_pytorch_tanh and
# gelu_fast are the same tanh approximation).
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu": "gelu"}

# What loading does with every field of transformers' GPT2Config (a test keeps this complete
# for the installed transformers), so that no folder loads into a model that computes something
# else than transformers would:
# - read into the model (the shape, the activation) or checked against it (the rest);
_READ = (
    *("model_type", "vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "activation_function"),
    *("n_inner", "layer_norm_epsilon", "tie_word_embeddings"),
)
# - forward-pass variants tinygpt's GPT does not implement: any value but GPT-2's is refused;
_GPT2_ONLY = {
    "scale_attn_weights": (True, "attention scores without the 1/sqrt(head_dim) scale"),
    "scale_attn_by_inverse_layer_idx": (False, "attention scores also divided by the layer index + 1"),
    "add_cross_attention": (False, "cross-attention layers over an encoder's output"),
}
# - no effect on a GPT2LMHeadModel's logits in eval: dropout (training only; `dropout` replaces
#   it), initialisation, other tasks' heads, generation and output options, bookkeeping, and
#   reorder_and_upcast_attn (the same attention, computed in fp32: tinygpt loads into fp32).
_NO_EFFECT = (
    *("resid_pdrop", "embd_pdrop", "attn_pdrop", "initializer_range", "reorder_and_upcast_attn"),
    *("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout"),
    *("id2label", "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder"),
    *("use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "output_hidden_states", "output_attentions"),
    *("return_dict", "dtype", "torch_dtype", "architectures", "transformers_version", "_name_or_path"),
)


def is_hf_source(source: str) -> bool:
    """A Hub model name, or a folder holding a Hugging Face config.json."""
    return source in HUB_MODELS or (Path(source).expanduser() / "config.json").is_file()


def _resolve_dir(source: str) -> Path:
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if source not in HUB_MODELS:
        raise TinyGPTError(f"{source!r} is neither a folder with config.json nor one of {', '.join(HUB_MODELS)}")
    from huggingface_hub import snapshot_download

    patterns = ["config.json", "model.safetensors"]  # pytorch_model.bin only where there is no safetensors
    for local_only in (True, False):  # the local Hugging Face cache first: works offline once downloaded
        try:
            folder = Path(snapshot_download(source, allow_patterns=patterns, local_files_only=local_only))
            if not (folder / "model.safetensors").is_file():
                folder = Path(
                    snapshot_download(source, allow_patterns=["config.json", "pytorch_model.bin"], local_files_only=local_only)
                )
            return folder
        except Exception as e:  # huggingface_hub raises many kinds; the last one is reported
            error = e
    raise TinyGPTError(
        f"cannot download {source} from the Hugging Face Hub ({type(error).__name__}); offline, put its config.json and "
        f"model.safetensors (or pytorch_model.bin) in a folder and pass that folder instead"
    )


def _read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """The weights file of a Hugging Face folder, safely: safetensors, or a pickle read with
    weights_only=True. A damaged or hostile file is one line (torch's advice to retry with
    weights_only=False is not passed on: that would run the file's code)."""
    path = folder / "model.safetensors"
    try:
        if path.is_file():
            from safetensors.torch import load_file

            weights = load_file(str(path))
        elif (path := folder / "pytorch_model.bin").is_file():
            weights = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise TinyGPTError(f"{folder} holds no model.safetensors or pytorch_model.bin")
    except TinyGPTError:
        raise
    except Exception as e:  # safetensors, the unpickler and zip reader fail in many ways
        if isinstance(e, MemoryError):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]
        if "weights_only" in first or "torch.save" in first:
            first = "it holds objects other than tensors, or is not a file torch wrote"
        raise TinyGPTError(f"cannot load {path}: {first}; download the model folder again") from None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise TinyGPTError(f"{path} holds no state dict of tensors; download the model folder again")
    return weights


def load_hf_gpt2(source: str, dropout: float = 0.0) -> tuple[GPT, dict | None]:
    """Our GPT with the weights of a Hugging Face GPT-2 (Hub name or local folder), and the dict
    form of its tokenizer: ours from tinygpt_tokenizer.json (our exports), GPT-2's BPE for
    GPT-2's vocabulary, its tokenizer.json for another vocabulary, else None. A dict, not a tokenizer: comparing it with the data's needs
    no download."""
    folder = _resolve_dir(source)
    if not (folder / "config.json").is_file():
        raise TinyGPTError(f"{folder} has no config.json; a Hugging Face GPT-2 folder holds config.json and model.safetensors")
    try:
        hf = json.loads((folder / "config.json").read_text())
    except (ValueError, OSError) as e:
        raise TinyGPTError(f"{folder / 'config.json'} cannot be read as JSON ({e}); download the model folder again") from None
    if not isinstance(hf, dict):
        raise TinyGPTError(f"{folder / 'config.json'} is not a JSON object; download the model folder again")
    if hf.get("model_type") != "gpt2":
        raise TinyGPTError(f"{folder} holds a {hf.get('model_type')!r} model; only GPT-2 checkpoints can be loaded")
    _refuse_variants(folder, hf)
    activation = _ACTIVATIONS[hf.get("activation_function", "gelu_new")]
    config = GPTConfig(
        vocab_size=hf["vocab_size"],
        block_size=hf.get("n_positions", hf.get("n_ctx", 1024)),
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        n_embd=hf["n_embd"],
        dropout=dropout,
        bias=True,
        activation=activation,
    )
    hf_state = _read_state_dict(folder)
    state = {}
    for key, value in hf_state.items():
        key = key if key.startswith("transformer.") or key.startswith("lm_head.") else f"transformer.{key}"
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers of old checkpoints, not weights
        state[key] = value.t() if key.endswith(_TRANSPOSED) else value
    head = state.setdefault("lm_head.weight", state["transformer.wte.weight"])  # tied
    if not torch.equal(head, state["transformer.wte.weight"]):
        raise TinyGPTError(
            f"{folder}: tie_word_embeddings={hf.get('tie_word_embeddings')!r} with an LM head that differs from the "
            "token embedding has no equivalent in tinygpt's GPT, which ties the two"
        )
    model = GPT(config)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shapes that contradict config.json
        raise TinyGPTError(f"{folder}: the weights do not fit its config.json ({str(e).splitlines()[1].strip()})") from None
    if missing or unexpected:
        raise TinyGPTError(f"{folder} does not match a GPT-2 of its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model, _tokenizer_for(folder, config.vocab_size)


def _refuse_variants(folder: Path, hf: dict) -> None:
    """One line naming the first config field whose value tinygpt's GPT does not compute."""

    def refuse(field: str, what: str) -> None:
        raise TinyGPTError(
            f"{folder}: config.json has {field}={hf[field]!r} ({what}); tinygpt's GPT has no equivalent, so it cannot load this model"
        )

    if hf.get("activation_function", "gelu_new") not in _ACTIVATIONS:
        refuse("activation_function", f"tinygpt implements {', '.join(_ACTIVATIONS)}")
    if hf.get("n_inner") not in (None, 4 * hf["n_embd"]):
        refuse("n_inner", f"an MLP width other than GPT-2's 4 x n_embd = {4 * hf['n_embd']}")
    if abs(hf.get("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12:
        refuse("layer_norm_epsilon", "a LayerNorm epsilon other than GPT-2's 1e-5")
    for field, (gpt2_value, what) in _GPT2_ONLY.items():
        if hf.get(field, gpt2_value) != gpt2_value:
            refuse(field, what)


def _tokenizer_for(folder: Path, vocab_size: int) -> dict | None:
    ours = folder / "tinygpt_tokenizer.json"
    if ours.is_file():
        return json.loads(ours.read_text())
    if (folder / "tokenizer.json").is_file() and vocab_size not in (50257, 50304):  # a model of its own tokenizer
        return HFTokenizer(str(folder)).to_dict()
    if vocab_size in (50257, 50304):  # GPT-2's, or padded to a multiple of 64
        return {"kind": "tiktoken", "name": "gpt2", "ranks_file": None, "vocab_size": 50257}
    return None


def export_hf(model: GPT, tokenizer, out_dir: str | Path) -> Path:
    """Write model (and tokenizer files) as a Hugging Face GPT-2 folder that
    `GPT2LMHeadModel.from_pretrained(out_dir)` loads with identical logits."""
    from safetensors.torch import save

    c = model.config
    missing = _not_in_gpt2(c)
    if missing:
        raise TinyGPTError(f"this model cannot be exported to GPT-2's format: {missing}")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, value in model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied to transformer.wte.weight
        value = value.detach().cpu()
        state[key] = (value.t() if key.endswith(_TRANSPOSED) else value).contiguous()
    io.write_bytes(out / "model.safetensors", save(state, metadata={"format": "pt"}))
    eot = getattr(tokenizer, "eot_id", None)
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_ctx": c.block_size,
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": None,
        "activation_function": "gelu_new" if c.activation == "gelu_tanh" else "gelu",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "scale_attn_weights": True,
        "use_cache": True,
    }
    io.write_json(out / "config.json", config, indent=2)
    io.write_json(out / "tinygpt_tokenizer.json", tokenizer.to_dict())
    # vocab.json/merges.txt mean GPT-2's pre-tokenizer: right for r50k/p50k, wrong for cl100k/o200k.
    if isinstance(tokenizer, TiktokenTokenizer) and tokenizer.name in ("gpt2", "r50k_base", "p50k_base"):
        write_gpt2_tokenizer_files(tokenizer, out)
    elif isinstance(tokenizer, HFTokenizer):
        write_fast_tokenizer_files(tokenizer, out, c.block_size)
    return out


def write_fast_tokenizer_files(tokenizer: HFTokenizer, out: Path, max_length: int) -> None:
    """tokenizer.json as it is, and the config that makes AutoTokenizer load it as a fast
    tokenizer with tinygpt's ids: special tokens spelt out in text stay ordinary text."""
    spec = json.loads(tokenizer.json_text)
    spec["post_processor"] = None  # tinygpt adds no special tokens (BOS templates would shift every id)
    io.write_bytes(out / "tokenizer.json", json.dumps(spec, ensure_ascii=False).encode("utf-8"))
    eot = tokenizer.tok.id_to_token(tokenizer.eot_id) if tokenizer.eot_id is not None else None
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "split_special_tokens": True, "model_max_length": max_length}
    if eot is not None:
        config.update(eos_token=eot, bos_token=eot)
    io.write_json(out / "tokenizer_config.json", config, indent=2)


def _not_in_gpt2(c) -> str | None:
    """What of this model's config GPT-2's format has no place for, in words; None if nothing."""
    if not isinstance(c, GPTConfig):
        return f"it is a recurrent model ({getattr(c, 'arch', type(c).__name__)}), and GPT-2 is a transformer"
    if c.pos_encoding != "learned":
        return f"model.pos_encoding={c.pos_encoding} (GPT-2 adds a learned position table; pos_encoding=learned)"
    if c.kv_heads != c.n_head:
        return f"model.n_kv_head={c.n_kv_head} (grouped-query attention; GPT-2 has as many key/value heads as query heads)"
    if not c.bias:
        return "model.bias=false (GPT-2's linear layers and LayerNorms have biases)"
    return None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to code points
    from 256 up, so every byte string is a printable string (the format of vocab.json)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_gpt2_tokenizer_files(tokenizer: TiktokenTokenizer, out: Path) -> None:
    """vocab.json + merges.txt (what GPT2Tokenizer reads) from tiktoken's ranks. A merge is
    recovered by running BPE on a token's bytes with only the lower-ranked tokens: the two
    parts left at the end are the pair that merges into it."""
    ranks = tokenizer.enc._mergeable_ranks
    to_unicode = _bytes_to_unicode()
    show = lambda b: "".join(to_unicode[x] for x in b)  # noqa: E731
    vocab = {show(token): rank for token, rank in ranks.items()}
    vocab[next(iter(tokenizer.enc._special_tokens))] = tokenizer.eot_id
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], float("inf")))
            if ranks.get(parts[best] + parts[best + 1], float("inf")) >= rank:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) == 2:
            merges.append(f"{show(parts[0])} {show(parts[1])}")
    io.write_bytes(out / "vocab.json", json.dumps(vocab, ensure_ascii=False).encode("utf-8"))
    io.write_bytes(out / "merges.txt", ("#version: 0.2\n" + "\n".join(merges) + "\n").encode("utf-8"))
    # tinygpt encodes text as ordinary text: "<|endoftext|>" spelt out in a corpus or a prompt is
    # seven tokens, never the end-of-text id (text cannot inject document boundaries). transformers
    # would read the literal as id 50256 unless told to split special tokens like any text.
    io.write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "GPT2Tokenizer",
            "split_special_tokens": True,
            "eos_token": "<|endoftext|>",
            "bos_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
        },
        indent=2,
    )
