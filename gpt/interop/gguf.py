"""GGUF out: llama.cpp's one-file format (also what Ollama and LM Studio run, and what
transformers reads with `gguf_file=`), written with the `gguf` package, llama.cpp's own writer
(`pip install 'tinygpt[gguf]'`):

    tinygpt export format=gguf quant=f32|f16|q8_0 run_dir=<run> out=model.gguf

llama.cpp computes a fixed set of architectures, each a block of its own; a tinygpt block goes to
the one that computes it:

    GPT-2's block (LayerNorm, GELU MLP, learned positions, biases)    -> gpt2
    Llama's block (RMSNorm, SwiGLU, RoPE)                             -> llama
    ... with biases on q, k and v alone                               -> qwen2
    ... with QK-norm                                                  -> qwen3

Any other block (the quickstart's RMSNorm + RoPE + QK-norm with GPT-2's GELU MLP) has no
architecture there and is refused in one line that names the presets that export.

The tokenizer travels in the file as llama.cpp's byte-level BPE (tokenizer.ggml.model "gpt2"):
GPT-2's BPE, a trained BPE or a byte-level Hugging Face BPE with its merges; a char or byte
vocabulary as one token per character (its UTF-8 bytes in GPT-2's byte alphabet) or per byte; a
chat model's template tokens as control tokens and its template as tokenizer.chat_template.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from gpt.errors import TinyGPTError
from gpt.interop import gpt2, hf, llama
from gpt.tokenizers.byte import ByteTokenizer
from gpt.tokenizers.char import CharTokenizer
from gpt.tokenizers.hf import HFTokenizer
from gpt.tokenizers.tiktoken import TiktokenTokenizer

QUANTS = ("f32", "f16", "q8_0")
# llama.cpp's token types (llama_token_type): ordinary text, and tokens only the program emits
NORMAL, CONTROL = 1, 3


def _gguf():
    try:
        import gguf
    except ImportError:
        raise TinyGPTError("format=gguf needs the gguf package: pip install 'tinygpt[gguf]'") from None
    return gguf


def architecture(c) -> str:
    """llama.cpp's architecture for this model's block, or a one-line refusal."""
    if gpt2.cannot_export(c) is None:
        return "gpt2"
    if llama.cannot_export(c) is None:
        return llama.family_of(c)
    reason = llama.cannot_export(c) if getattr(c, "pos_encoding", None) == "rope" else gpt2.cannot_export(c)
    raise TinyGPTError(
        f"llama.cpp has no architecture for this model's block ({reason}); the presets with a GGUF form are "
        f"model=llama-nano (Llama's block) and model=gpt-micro (GPT-2's), or export it to a Hugging Face folder "
        f"(format=hf)"
    )


def export(model, tokenizer, out: str | Path, quant: str = "f32") -> tuple[Path, str]:
    """Write `model` and its tokenizer as one GGUF file at `out` (written beside it, then moved
    into place: a reader never sees half a file); returns the path and llama.cpp's architecture."""
    if quant not in QUANTS:
        raise TinyGPTError(f"quant={quant!r} is not a GGUF type tinygpt writes; use one of {', '.join(QUANTS)}")
    gguf = _gguf()
    c = model.config
    arch = architecture(c)
    out = Path(out).expanduser().absolute()
    check_out(out)
    tensors = _tensors(model, arch)
    vocab = _vocab(tokenizer)
    if len(vocab["tokens"]) != c.vocab_size:
        raise TinyGPTError(f"the tokenizer holds {len(vocab['tokens'])} tokens and the model {c.vocab_size}; cannot export")
    staging = out.with_name(f".{out.name}.exporting-{os.getpid()}")
    writer = gguf.GGUFWriter(str(staging), arch)
    try:
        _write_metadata(writer, gguf, c, arch, quant, vocab)
        for name, value in tensors.items():
            data, qtype = _encoded(gguf, name, value, quant)
            writer.add_tensor(name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(staging, out)
    except OSError as e:
        raise TinyGPTError(f"cannot write {out} ({e.strerror or e}); pass out=<a file you can write>") from None
    finally:
        writer.close()
        staging.unlink(missing_ok=True)
    return out, arch


def check_out(out: Path) -> None:
    """A new file, or an earlier GGUF file (replaced); never a folder or another kind of file."""
    if out.suffix != ".gguf":
        raise TinyGPTError(f"out={out} does not end in .gguf; name the file to write, e.g. out=model.gguf")
    if out.is_dir():
        raise TinyGPTError(f"out={out} is a folder; name the GGUF file to write, e.g. out={out / 'model.gguf'}")
    if out.exists():
        with open(out, "rb") as f:
            if f.read(4) != b"GGUF":
                raise TinyGPTError(f"out={out} exists and is not a GGUF file; name a new file (an earlier GGUF is replaced)")


def _tensors(model, arch: str) -> dict[str, torch.Tensor]:
    """GGUF's tensor names -> the weights (nn.Linear's [out, in] layout, which is GGUF's), the
    vocabulary's padding rows cut (hf.unpadded_state)."""
    c = model.config
    state = {k: v.detach().float() for k, v in hf.unpadded_state(model).items()}
    out = {"token_embd.weight": state["transformer.wte.weight"]}
    if arch == "gpt2":
        out["position_embd.weight"] = state["transformer.wpe.weight"]
    for i in range(c.n_layer):
        p, b = f"transformer.h.{i}.", f"blk.{i}."
        names = {
            "ln_1": "attn_norm", "attn.c_proj": "attn_output", "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up",
            "mlp.c_proj": "ffn_down", "mlp.c_gate": "ffn_gate", "attn.q_norm": "attn_q_norm", "attn.k_norm": "attn_k_norm",
        }  # fmt: skip
        for ours, theirs in names.items():
            for kind in ("weight", "bias"):
                if f"{p}{ours}.{kind}" in state:
                    out[f"{b}{theirs}.{kind}"] = state[f"{p}{ours}.{kind}"]
        for kind in ("weight", "bias"):
            qkv = state.get(f"{p}attn.c_attn.{kind}")
            if qkv is None:
                continue
            if arch == "gpt2":  # one stacked matmul, as GPT-2's c_attn
                out[f"{b}attn_qkv.{kind}"] = qkv
                continue
            q, k, v = qkv.split([c.n_head * c.head_dim, c.n_kv_head * c.head_dim, c.n_kv_head * c.head_dim])
            if arch == "llama":  # llama.cpp's llama rotates neighbouring channels: reorder each head's rows to match
                q, k = _interleave_halves(q, c.n_head), _interleave_halves(k, c.n_kv_head)
            out.update({f"{b}attn_q.{kind}": q, f"{b}attn_k.{kind}": k, f"{b}attn_v.{kind}": v})
    for kind in ("weight", "bias"):
        if f"transformer.ln_f.{kind}" in state:
            out[f"output_norm.{kind}"] = state[f"transformer.ln_f.{kind}"]
    # A tied head is written again for gpt2, as llama.cpp's own converter does; the Llama family
    # reads a missing output.weight as tied (and transformers sets tie_word_embeddings from it).
    if arch == "gpt2" or not c.tie_embeddings:
        out["output.weight"] = state["lm_head.weight"] if "lm_head.weight" in state else state["transformer.wte.weight"]
    return out


def _interleave_halves(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each head from (first half, second half) to interleaved (0, d/2, 1, d/2+1, ...):
    tinygpt and transformers rotate channel j with j + d/2, llama.cpp's llama j with j + 1."""
    return w.reshape(heads, 2, w.size(0) // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _encoded(gguf, name: str, value: torch.Tensor, quant: str):
    """(array, its GGML type): norms, biases and other vectors stay f32 (llama.cpp adds them in
    f32); matrices take `quant`, where q8_0 needs rows in whole blocks of 32 (else f16, as
    llama.cpp's converter falls back)."""
    array = value.contiguous().numpy()
    if quant == "f32" or array.ndim < 2:
        return array, gguf.GGMLQuantizationType.F32
    if quant == "q8_0" and array.shape[-1] % 32 == 0:
        return gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    return array.astype(np.float16), gguf.GGMLQuantizationType.F16


def _write_metadata(writer, gguf, c, arch: str, quant: str, vocab: dict) -> None:
    writer.add_name(c.name)
    writer.add_file_type(
        {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[quant]
    )
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(c.block_size)
    writer.add_embedding_length(c.n_embd)
    writer.add_block_count(c.n_layer)
    writer.add_feed_forward_length(c.mlp_hidden)
    writer.add_head_count(c.n_head)
    if arch == "gpt2":
        writer.add_layer_norm_eps(c.norm_eps)
    else:
        writer.add_head_count_kv(c.n_kv_head)
        writer.add_layer_norm_rms_eps(c.norm_eps)
        writer.add_rope_freq_base(c.rope_theta)
        writer.add_rope_dimension_count(c.head_dim)
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
        writer.add_vocab_size(c.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id), ("pad", writer.add_pad_token_id)):
        if vocab.get(key) is not None:
            add(vocab[key])
    writer.add_add_bos_token(False)  # tinygpt encodes a prompt as it is: no start token put before it
    if vocab.get("template"):
        writer.add_chat_template(vocab["template"])


def _vocab(tokenizer) -> dict:
    """The tokenizer as GGUF's byte-level BPE: token texts in id order, their types, merges, the
    pre-tokenizer's name in llama.cpp, special ids and a chat template."""
    chat = hasattr(tokenizer, "special_ids")
    base = getattr(tokenizer, "base", tokenizer)
    to_unicode = hf.bytes_to_unicode()
    spell = lambda text: "".join(to_unicode[b] for b in text.encode("utf-8"))  # noqa: E731
    control: set[int] = set()
    pre = "gpt-2"
    if isinstance(base, TiktokenTokenizer):
        if base.name not in ("gpt2", "r50k_base", "p50k_base"):
            raise TinyGPTError(f"tiktoken's {base.name} has a pre-tokenizer GGUF export does not write; GPT-2's BPE exports")
        by_text, merges = hf.gpt2_vocab_and_merges(base)
        tokens = [t for t, _ in sorted(by_text.items(), key=lambda kv: kv[1])]
        control.add(base.eot_id)
    elif isinstance(base, HFTokenizer):
        tokens, merges, pre, control = _hf_vocab(base)
    elif isinstance(base, CharTokenizer):
        tokens = [spell(ch) for ch in base.chars]
        merges = _char_merges(tokens)
    elif isinstance(base, ByteTokenizer):
        tokens = [to_unicode[b] for b in range(256)] + ["<|endoftext|>"]
        merges = []
        control.add(256)
    else:
        raise TinyGPTError(f"a {type(base).__name__} has no GGUF form; export it to a Hugging Face folder (format=hf)")
    if not merges:
        # llama.cpp requires the merges key and gguf writes no empty list: one merge of two pieces
        # no other merge builds, so it never applies (every symbol starts as one character).
        merges = [f"{tokens[0]}{tokens[0]} {tokens[0]}{tokens[0]}"]
    eot = base.eot_id
    vocab = {"pre": pre, "tokens": tokens, "merges": merges, "bos": eot, "eos": eot}
    if chat:
        from gpt.chat.template import SPECIAL_TOKENS, jinja_template

        if getattr(tokenizer, "spec", {}).get("template") == "hf":  # a Hugging Face tokenizer's own template and tokens
            vocab["template"] = tokenizer.spec["jinja"]
        else:
            tokens += list(SPECIAL_TOKENS)
            vocab["template"] = jinja_template(tokens[eot] if eot is not None else None)
        control |= set(tokenizer.special_ids)
        vocab.update(eos=tokenizer.end_id, pad=tokenizer.end_id)
    vocab["types"] = [CONTROL if i in control else NORMAL for i in range(len(tokens))]
    return vocab


def _char_merges(tokens: list[str]) -> list[str]:
    """A character of several UTF-8 bytes is several byte symbols in llama.cpp's BPE: merges
    join them left to right (llama.cpp looks up only the final piece)."""
    merges = []
    for token in tokens:
        for end in range(2, len(token) + 1):
            merges.append(f"{token[: end - 1]} {token[end - 1]}")
    return merges


# llama.cpp's names of the Hugging Face pre-tokenizers it implements (llama-vocab.cpp)
_PRE_TOKENIZERS = {
    json.dumps([{"type": "ByteLevel", "use_regex": True}]): "gpt-2",
    json.dumps([{"type": "Digits", "individual_digits": True}, {"type": "ByteLevel", "use_regex": True}]): "smollm",
}


def _hf_vocab(tokenizer: HFTokenizer) -> tuple[list[str], list[str], str, set[int]]:
    spec = json.loads(tokenizer.json_text)
    model = spec.get("model") or {}
    where = f"the tokenizer {tokenizer.name or ''}".rstrip()
    if model.get("type") != "BPE" or spec.get("normalizer") is not None:
        raise TinyGPTError(f"{where} is not a byte-level BPE without a normalizer; GGUF export writes only that kind")
    pre_spec = spec.get("pre_tokenizer") or {}
    steps = pre_spec.get("pretokenizers", [pre_spec]) if pre_spec.get("type") == "Sequence" else [pre_spec]
    shape = json.dumps([{k: s.get(k) for k in ("type", "use_regex", "individual_digits") if k in s} for s in steps])
    pre = _PRE_TOKENIZERS.get(shape)
    if pre is None:
        raise TinyGPTError(f"{where} splits text in a way llama.cpp has no name for ({shape}); GGUF export cannot write it")
    by_id = {i: t for t, i in model["vocab"].items()}
    control = set()
    for added in spec.get("added_tokens") or []:
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            control.add(added["id"])
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(tokenizer.vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, merges, pre, control
