"""tinygpt's own Hugging Face family: any GPT block, for the blocks no transformers class
computes (the quickstart's RMSNorm + RoPE + QK-norm + GELU MLP, ReLU², soft-capping, sinusoidal
or no positions...). The export carries its modeling code (gpt/interop/modeling_tinygpt.py,
copied into the folder and named by `auto_map` in config.json), so transformers loads it with
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`, tinygpt not installed;
tinygpt reads such a folder back without running that code."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpt.config.model import GPTConfig
from gpt.errors import TinyGPTError
from gpt.interop import hf
from gpt.model import GPT
from gpt.runtime import io

MODULE = "modeling_tinygpt"
CLASS = "TinyGPTForCausalLM"
# the fields of config.json that are GPTConfig's own (the rest are transformers' bookkeeping)
_FIELDS = (
    "vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "head_dim", "mlp_hidden", "bias",
    "qkv_bias", "pos_encoding", "rope_theta", "norm", "norm_eps", "mlp", "activation", "qk_norm", "logit_softcap",
)  # fmt: skip


def cannot_export(c) -> str | None:
    """Every GPT block exports here; a recurrent model has no transformers form."""
    if not isinstance(c, GPTConfig):
        return f"it is a recurrent model ({getattr(c, 'arch', type(c).__name__)}): tinygpt's Hugging Face form is a transformer"
    return None


def export(model: GPT, tokenizer, out: Path) -> str:
    """Write `model`, its modeling code and its tokenizer's files as a folder that
    `AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)` loads with tinygpt's
    logits; returns the class that loads it (with trust_remote_code=True: its code is in MODULE.py)."""
    c = model.config
    state = {k: v for k, v in hf.unpadded_state(model).items() if not (k == "lm_head.weight" and c.tie_embeddings)}
    hf.write_weights(out, state)
    shutil.copyfile(Path(__file__).with_name(f"{MODULE}.py"), out / f"{MODULE}.py")
    eot = getattr(tokenizer, "eot_id", None)
    config = {
        "model_type": "tinygpt",
        "architectures": [CLASS],
        "auto_map": {"AutoConfig": f"{MODULE}.TinyGPTConfig", "AutoModelForCausalLM": f"{MODULE}.{CLASS}"},
        **{name: getattr(c, name) for name in _FIELDS},
        "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "use_cache": True,
        "tinygpt_name": c.name,
    }
    io.write_json(out / "config.json", config, indent=2)
    hf.write_tokenizer(tokenizer, out, c.block_size)
    return CLASS


def check(folder: Path, config: dict) -> None:
    unknown = [k for k in ("pos_encoding", "norm", "mlp") if k not in config]
    if unknown:
        raise TinyGPTError(f"{folder}: config.json of model_type tinygpt lacks {', '.join(unknown)}; export it again")


def load(folder: Path, config: dict, dropout: float = 0.0, mapped: bool = False) -> tuple[GPT, dict | None]:
    """Our GPT from a folder of this family (its weights under tinygpt's own names)."""
    check(folder, config)
    model_config = GPTConfig(
        name=config.get("tinygpt_name", "gpt"),
        vocab_multiple=1,  # an export holds the tokenizer's rows only
        dropout=dropout,
        tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        **{name: config[name] for name in _FIELDS if name in config},
    )
    state = dict(hf.read_state_dict(folder))
    if model_config.tie_embeddings:
        hf.tie_head(state, folder)
    model = hf.build(model_config, state, folder, "tinygpt", mapped)
    return model, hf.tokenizer_for(folder, model_config.vocab_size)
