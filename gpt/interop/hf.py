"""What every Hugging Face format shares: finding the folder (a local one, or a Hub repository,
from the local cache first), reading config.json and the weights (one safetensors file, shards
listed in model.safetensors.index.json, or a pickle read with weights_only=True), writing
weights, and the tokenizer files that travel with a model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from gpt.errors import TinyGPTError
from gpt.model import GPT, meta
from gpt.runtime import io
from gpt.tokenizers import ByteTokenizer, CharTokenizer, TiktokenTokenizer
from gpt.tokenizers.hf import EOT, HFTokenizer

# A Hub repository id: owner/name
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
INDEX = "model.safetensors.index.json"
TOKENIZER_RECORD = "tinygpt_tokenizer.json"  # our tokenizer, as a round trip reads it back: in every export
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", TOKENIZER_RECORD)


def is_hub_id(source: str) -> bool:
    return bool(HUB_ID.match(source)) and not Path(source).expanduser().exists()


def resolve_dir(source: str, names: tuple[str, ...] = ()) -> Path:
    """The folder `source` names: itself, or a Hub repository (a bare name in `names`, such as
    gpt2, or owner/name) downloaded into the Hugging Face cache, which is tried first so that
    a model fetched once works offline."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if source not in names and not is_hub_id(source):
        raise TinyGPTError(
            f"{source!r} is neither a folder with config.json nor a Hugging Face Hub model (e.g. {', '.join(names)})"
        )
    from huggingface_hub import snapshot_download

    patterns = ["config.json", "*.safetensors", INDEX, *TOKENIZER_FILES]
    error: Exception | None = None
    for local_only in (True, False):  # the local Hugging Face cache first: works offline once downloaded
        try:
            folder = Path(snapshot_download(source, allow_patterns=patterns, local_files_only=local_only))
            if not any(folder.glob("*.safetensors")):  # pytorch_model.bin only where there is no safetensors
                folder = Path(
                    snapshot_download(source, allow_patterns=[*patterns, "pytorch_model.bin"], local_files_only=local_only)
                )
            return folder
        except Exception as e:  # huggingface_hub raises many kinds; the last one is reported
            error = e
    raise TinyGPTError(
        f"cannot download {source} from the Hugging Face Hub ({type(error).__name__}); offline, put its config.json and "
        f"model.safetensors (or pytorch_model.bin) in a folder and pass that folder instead"
    )


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise TinyGPTError(f"{folder} has no config.json; a Hugging Face model folder holds config.json and model.safetensors")
    try:
        config = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise TinyGPTError(f"{path} cannot be read as JSON ({e}); download the model folder again") from None
    if not isinstance(config, dict):
        raise TinyGPTError(f"{path} is not a JSON object; download the model folder again")
    return config


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """The weights of a Hugging Face folder, safely: model.safetensors, the shards its index
    lists, or a pickle read with weights_only=True. A damaged, missing or hostile file is one
    line (torch's advice to retry with weights_only=False is not passed on: that would run the
    file's code)."""
    if (folder / INDEX).is_file():
        return _read_shards(folder)
    path = folder / "model.safetensors"
    if not path.is_file():
        path = folder / "pytorch_model.bin"
        if not path.is_file():
            raise TinyGPTError(f"{folder} holds no model.safetensors, {INDEX} or pytorch_model.bin")
    return _read_file(path)


def _read_shards(folder: Path) -> dict[str, torch.Tensor]:
    try:
        weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, OSError, KeyError, TypeError, AttributeError) as e:
        raise TinyGPTError(f"{folder / INDEX} cannot be read ({e}); download the model folder again") from None
    missing = [name for name in shards if not (folder / name).is_file()]
    if missing:
        raise TinyGPTError(
            f"{folder} lacks {missing[0]}, a shard its {INDEX} lists ({len(missing)} of {len(shards)} missing); "
            f"download the model folder again"
        )
    state = {}
    for name in shards:
        state.update(_read_file(folder / name))
    absent = sorted(set(weight_map) - set(state))
    if absent:
        raise TinyGPTError(f"{folder}: {absent[0]} is listed in {INDEX} but in none of its shards; download the model again")
    return state


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            weights = load_file(str(path))
        else:
            weights = torch.load(path, map_location="cpu", weights_only=True)
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


def write_weights(out: Path, state: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save

    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    io.write_bytes(out / "model.safetensors", save(state, metadata={"format": "pt"}))


def unpadded_state(model) -> dict[str, torch.Tensor]:
    """The model's weights as a Hugging Face folder holds them: the token embedding and LM head
    cut to the tokenizer's vocab_size, so the rows a padded vocabulary adds (model.vocab_multiple)
    are never exported, and transformers computes logits over the true vocabulary only."""
    n = model.config.vocab_size
    state = model.state_dict()
    for key in ("transformer.wte.weight", "lm_head.weight"):
        if key in state and state[key].size(0) > n:
            state[key] = state[key][:n]
    return state


def tie_head(state: dict, folder: Path) -> None:
    """A tied model's LM head is its token embedding: filled in where the folder leaves it out,
    refused where the folder holds a different matrix under the tie."""
    head = state.setdefault("lm_head.weight", state["transformer.wte.weight"])
    if not torch.equal(head, state["transformer.wte.weight"]):
        raise TinyGPTError(f"{folder}: tie_word_embeddings=true but lm_head.weight differs from the token embedding")


def build(config, state: dict[str, torch.Tensor], folder: Path, family: str, mapped: bool = False):
    """Our GPT of `config` holding `state` (the folder's weights under our names), every weight
    accounted for, or one line saying what does not fit. Built on the meta device, so no initial
    values are computed only to be overwritten; the weights are float32 copies, or with `mapped`
    the state's tensors themselves (safetensors maps the file: nothing is read until used; in the
    file's dtype; gpt.checkpoints.loading.load)."""
    with meta.building():
        model = GPT(config)
    try:
        missing, unexpected = meta.adopt(model, state, strict=False, copy=not mapped)
    except RuntimeError as e:  # shapes that contradict config.json
        detail = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), str(e))
        raise TinyGPTError(f"{folder}: the weights do not fit its config.json ({detail})") from None
    if missing or unexpected:
        raise TinyGPTError(
            f"{folder} does not match a {family} of its config: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    return model


def tokenizer_for(folder: Path, vocab_size: int, gpt2_vocab: bool = False) -> dict | None:
    """The dict form of the folder's tokenizer: ours from tinygpt_tokenizer.json (our exports),
    GPT-2's BPE for GPT-2's vocabulary (`gpt2_vocab`: a GPT-2 folder of 50257 or 50304 tokens),
    its tokenizer.json otherwise, else None. A dict, not a tokenizer: comparing it with the
    data's needs no download."""
    ours = folder / TOKENIZER_RECORD
    if ours.is_file():
        return json.loads(ours.read_text())
    if gpt2_vocab and vocab_size in (50257, 50304):  # GPT-2's, or padded to a multiple of 64
        return {"kind": "tiktoken", "name": "gpt2", "ranks_file": None, "vocab_size": 50257}
    if (folder / "tokenizer.json").is_file():
        spec = HFTokenizer(str(folder)).to_dict()
        config = folder / "tokenizer_config.json"
        if config.is_file():  # a chat template of its own (gpt.chat.hf_template) travels with it
            from gpt.chat.hf_template import template_of

            try:
                chat = template_of(json.loads(config.read_text(encoding="utf-8")))
            except ValueError:
                chat = None
            if chat:
                spec["chat"] = chat
        return spec
    return None


def write_tokenizer(tokenizer, out: Path, max_length: int) -> None:
    """Our tokenizer's record (tinygpt_tokenizer.json, what a round trip reads back), and the files
    transformers' AutoTokenizer reads where tinygpt's tokenizer has an equivalent: GPT-2's
    vocab.json/merges.txt, or a tokenizer.json (a trained BPE, a Hugging Face tokenizer)."""
    io.write_json(out / TOKENIZER_RECORD, tokenizer.to_dict())
    chat, base = hasattr(tokenizer, "special_ids"), getattr(tokenizer, "base", tokenizer)
    # vocab.json/merges.txt mean GPT-2's pre-tokenizer: right for r50k/p50k, wrong for cl100k/o200k.
    if isinstance(base, TiktokenTokenizer) and base.name in ("gpt2", "r50k_base", "p50k_base"):
        write_gpt2_tokenizer_files(base, out)
    elif isinstance(base, HFTokenizer):
        write_fast_tokenizer_files(base, out, max_length)
    elif isinstance(base, (CharTokenizer, ByteTokenizer)):
        write_table_tokenizer_files(base, out, max_length)
    else:
        return  # (cl100k / o200k: their pre-tokenizers have no transformers equivalent here) tinygpt_tokenizer.json only
    if chat:
        write_chat_tokenizer_files(tokenizer, out, max_length)


def write_chat_tokenizer_files(tokenizer, out: Path, max_length: int) -> None:
    """A model finetuned on conversations: one tokenizer.json with the chat template's special
    tokens at tinygpt's ids, `chat_template` in tokenizer_config.json (Jinja, rendered by
    `apply_chat_template`) and generation_config.json ending generation at the end of a turn, so
    transformers' pipelines chat with the export. Here the template's tokens must be read as
    special in rendered text (split_special_tokens off): transformers, unlike tinygpt, then
    also reads them in message text that spells them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from gpt.chat.template import SPECIAL_TOKENS, jinja_template

    own = getattr(tokenizer, "spec", {}).get("template") == "hf"  # a Hugging Face tokenizer's own template: kept
    if (out / "tokenizer.json").is_file():  # a Hugging Face tokenizer or a trained BPE
        tok = Tokenizer.from_str((out / "tokenizer.json").read_text(encoding="utf-8"))
    else:  # GPT-2's BPE, from the vocab.json/merges.txt just written
        tok = Tokenizer(models.BPE.from_file(str(out / "vocab.json"), str(out / "merges.txt")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(tokenizer.decode([tokenizer.eot_id]), special=True, normalized=False)])
    if not own:
        if tok.get_vocab_size(with_added_tokens=True) != tokenizer.base.vocab_size:
            raise TinyGPTError(
                f"cannot export the chat template: the tokenizer files hold {tok.get_vocab_size(with_added_tokens=True)} "
                f"tokens, tinygpt's base tokenizer {tokenizer.base.vocab_size}"
            )
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    io.write_bytes(out / "tokenizer.json", tok.to_str().encode("utf-8"))
    # the end-of-text token as the tokenizer files spell it (a byte vocabulary decodes it to nothing)
    eot = tok.id_to_token(tokenizer.eot_id) if tokenizer.eot_id is not None else None
    end = tokenizer.decode([tokenizer.end_id])
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "chat_template": tokenizer.spec["jinja"] if own else jinja_template(eot),
        "eos_token": end,
        "pad_token": end,
    }
    bos = tokenizer.spec.get("bos") if own else eot
    if bos is not None:
        config["bos_token"] = bos
    io.write_json(out / "tokenizer_config.json", config, indent=2)
    stops = [tokenizer.end_id] + ([tokenizer.eot_id] if tokenizer.eot_id is not None else [])
    io.write_json(out / "generation_config.json", {"eos_token_id": stops, "pad_token_id": tokenizer.end_id}, indent=2)


def write_table_tokenizer_files(tokenizer, out: Path, max_length: int) -> None:
    """tokenizer.json for a char or byte vocabulary, with tinygpt's ids: one token per character
    (or per UTF-8 byte, in GPT-2's byte-to-character alphabet), as a BPE without merges, decoded
    by joining the tokens; the byte vocabulary's end-of-text (256) as a special token that text
    spelling it does not become. (A character outside a char vocabulary, which tinygpt refuses,
    has no id here: transformers leaves it out.)"""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if isinstance(tokenizer, CharTokenizer):
        tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(tokenizer.chars)}, merges=[]))
        tok.decoder = decoders.Fuse()
        eot = None
    else:
        to_unicode = bytes_to_unicode()
        tok = Tokenizer(models.BPE(vocab={to_unicode[b]: b for b in range(256)}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        eot = EOT
        tok.add_special_tokens([AddedToken(eot, special=True, normalized=False)])
    io.write_bytes(out / "tokenizer.json", tok.to_str().encode("utf-8"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "split_special_tokens": True, "model_max_length": max_length}
    if eot is not None:
        config.update(eos_token=eot, bos_token=eot)
    io.write_json(out / "tokenizer_config.json", config, indent=2)


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


def bytes_to_unicode() -> dict[int, str]:
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


def gpt2_vocab_and_merges(tokenizer: TiktokenTokenizer) -> tuple[dict[str, int], list[str]]:
    """GPT-2's vocab.json (byte-level token text -> id, end-of-text included) and merges from
    tiktoken's ranks, which hold no merges. A merge is recovered by running BPE on a token's
    bytes with only the lower-ranked tokens: the two parts left at the end are the pair that
    merges into it."""
    ranks = tokenizer.enc._mergeable_ranks
    to_unicode = bytes_to_unicode()
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
    return vocab, merges


def write_gpt2_tokenizer_files(tokenizer: TiktokenTokenizer, out: Path) -> None:
    """vocab.json + merges.txt (what GPT2Tokenizer reads) from tiktoken's ranks."""
    vocab, merges = gpt2_vocab_and_merges(tokenizer)
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
