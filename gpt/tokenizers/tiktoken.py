"""OpenAI's BPE encodings through tiktoken (kind `tiktoken`): by name, downloaded by tiktoken on
first use, or GPT-2's from a local ranks file, for offline and air-gapped machines."""

from __future__ import annotations

from pathlib import Path

from gpt.errors import TinyGPTError

TIKTOKEN_NAMES = ("gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base")
GPT2_EOT = "<|endoftext|>"


class TiktokenTokenizer:
    """A tiktoken BPE encoding. `gpt2` is the same encoding as `r50k_base` (50,257 tokens,
    <|endoftext|> = 50256), so it is loaded as r50k_base, whose single ranks file is what
    tiktoken caches (or what `ranks_file` points to)."""

    kind = "tiktoken"

    def __init__(self, name: str = "gpt2", ranks_file: str | None = None, vocab_size: int | None = None):
        """`vocab_size`, when given (it is recorded in meta.json and checkpoints), must match what
        was loaded: a recorded ranks file that is missing here must not be silently replaced by
        a different vocabulary."""
        if name not in TIKTOKEN_NAMES:
            raise TinyGPTError(f"tiktoken encoding {name!r} is unknown; use one of {', '.join(TIKTOKEN_NAMES)}")
        self.name, self.ranks_file = name, ranks_file
        self.enc = _load_encoding(name, ranks_file)
        self.eot_id = self.enc.eot_token
        if vocab_size is not None and vocab_size != self.enc.n_vocab:
            raise TinyGPTError(
                f"tiktoken {name} loaded with {self.enc.n_vocab} tokens, but this model/data was made with {vocab_size} "
                f"(from ranks file {ranks_file}); provide that ranks file"
            )

    @property
    def vocab_size(self) -> int:
        return self.enc.n_vocab

    def encode(self, text: str) -> list[int]:
        # Ordinary encoding: text that happens to spell "<|endoftext|>" is not a control token.
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(texts, num_threads=1)  # processes parallelise, not threads

    def decode(self, ids: list[int]) -> str:
        return self.enc.decode(ids)  # invalid UTF-8 pieces become U+FFFD

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "ranks_file": self.ranks_file, "vocab_size": self.vocab_size}


def _load_encoding(name: str, ranks_file: str | None):
    import tiktoken

    # A ranks file recorded on another machine may be missing here: then try tiktoken itself.
    if ranks_file and Path(ranks_file).expanduser().is_file():
        path = Path(ranks_file).expanduser()
        if name not in ("gpt2", "r50k_base"):
            raise TinyGPTError(
                f"a local ranks file is supported for gpt2 / r50k_base; for {name}, let tiktoken download it once "
                f"(or copy it into $TIKTOKEN_CACHE_DIR)"
            )
        from tiktoken.load import load_tiktoken_bpe
        from tiktoken_ext.openai_public import r50k_pat_str

        try:
            ranks = load_tiktoken_bpe(str(path))
        except Exception:
            raise TinyGPTError(
                f"{path} is not a tiktoken ranks file (base64 token and rank per line, e.g. r50k_base.tiktoken)"
            ) from None
        return tiktoken.Encoding(name=name, pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={GPT2_EOT: len(ranks)})
    try:
        return tiktoken.get_encoding("r50k_base" if name == "gpt2" else name)
    except Exception as e:  # tiktoken raises whatever its HTTP client raised
        missing = f"ranks file {ranks_file} does not exist and " if ranks_file else ""
        raise TinyGPTError(
            f"cannot load tiktoken encoding {name!r}: {missing}tiktoken's download failed ({type(e).__name__}). Offline, "
            f"pass data.tokenizer.ranks_file=<r50k_base.tiktoken> (gpt2/r50k_base) or copy the ranks file into "
            f"$TIKTOKEN_CACHE_DIR (see README, Offline data)"
        ) from None
