"""Starting from trained weights: load them (checked against the data's tokenizer), crop the
context, freeze parts, or attach LoRA adapters. Used by the trainer before the optimizer is
built."""

from __future__ import annotations

from dataclasses import replace

import torch

from gpt.config import FinetuneSettings
from gpt.config.model import PAD_FROM, PAD_MULTIPLE
from gpt.errors import TinyGPTError
from gpt.model import registry
from gpt.tokenizers import require_same, without_template

# The model settings a finetune takes from the command line rather than from its base: they
# change no weight (dropout, passed to loading.load; activation checkpointing, set on the base)
APPLY_TO_A_BASE = ("dropout", "activation_checkpointing")


def initial_model(source: str, data_tokenizer, ft: FinetuneSettings, dropout: float, log=print, loaded=None):
    """Weights to finetune from (GPT-2 or a checkpoint of ours), checked against the data.
    `loaded`: the source, when the caller has loaded it already. A base without the chat
    template that the data has (conversations) gets the template's tokens (add_chat_tokens)."""
    if loaded is None:
        from gpt.checkpoints import loading

        loaded = loading.load(str(source), dropout=dropout)
    model = loaded.model.train()
    data_spec = data_tokenizer.to_dict()
    adds_template = bool(data_spec.get("chat")) and not loaded.tokenizer_spec.get("chat")
    require_same(
        loaded.tokenizer_spec,
        without_template(data_spec) if adds_template else data_spec,
        f"init_from={source} was trained with another tokenizer than the data's",
        _same_tokenizer(loaded.tokenizer_spec, source),
    )
    if adds_template:
        add_chat_tokens(model, data_tokenizer, log)
    model = _fit_context(model, ft, source, log)
    log(f"initialised from {source}: {registry.summary(model.config)}")
    return model


def _same_tokenizer(spec: dict, source: str) -> str:
    """How to give the data the base's tokenizer (the data's own is data.tokenizer's, GPT-2's BPE
    unless told, whatever the base was trained with)."""
    kind = spec.get("kind")
    if kind == "byte":
        return "pass data.tokenizer.kind=byte"
    if kind == "tiktoken":
        where = (
            f"data.tokenizer.ranks_file={spec['ranks_file']}"
            if spec.get("ranks_file")
            else f"data.tokenizer.name={spec.get('name', 'gpt2')}"
        )
        return f"pass data.tokenizer.kind=tiktoken {where}"
    if kind == "hf":
        return f"pass data.tokenizer.kind=hf data.tokenizer.name={source}"
    return f"its {kind} vocabulary was fitted to the corpus it was trained on: finetune on data of that tokenizer"


def _fit_context(model, ft: FinetuneSettings, source: str, log):
    """The base at the finetune's context: finetune.block_size exactly (cropped, or extended),
    else at least finetune.min_block_size where the base's positions reach it."""
    have = model.config.block_size
    kind = getattr(model.config, "pos_encoding", None)  # None: a recurrent model
    if ft.block_size and ft.block_size < have:
        if kind == "learned":  # keep the first block_size positions
            model.transformer.wpe.weight = torch.nn.Parameter(model.transformer.wpe.weight[: ft.block_size].clone())
        model.config.block_size = ft.block_size
    elif ft.block_size and ft.block_size > have:
        model = _extend_context(model, ft.block_size, source, log)
    elif not ft.block_size and ft.min_block_size and ft.min_block_size > have and kind is not None:
        if kind == "learned":
            log(
                f"notice: context kept at {have} (finetune.min_block_size={ft.min_block_size}): "
                f"{source} has a learned position table, with no rows beyond it"
            )
        else:
            model = _extend_context(model, ft.min_block_size, source, log)
    return model


def _extend_context(model, context: int, source: str, log):
    """The model with a longer context: rotary, sinusoidal or no positions are computed for any
    position, so the same weights see `context` tokens (finetuning then teaches them the longer
    windows); a learned position table has no rows past its own length, and a recurrent model
    no context to extend."""
    kind = getattr(model.config, "pos_encoding", None)
    if kind in (None, "learned"):
        what = "a recurrent model reads any length already" if kind is None else "its learned position table has no rows beyond"
        raise TinyGPTError(
            f"finetune.block_size={context} is longer than {source}'s context ({model.config.block_size}) and {what}; "
            f"use finetune.block_size <= {model.config.block_size}"
        )
    from gpt.model import meta

    with meta.building():  # the same weights, not copies (they may be a file's mapped pages)
        longer = registry.build(model.config.changed(block_size=context))
    meta.adopt(longer, model.state_dict())
    log(f"context {model.config.block_size} -> {context} ({kind} positions reach any length)")
    return longer.train()


def add_chat_tokens(model, tokenizer, log=print) -> None:
    """Give the chat template's special tokens (ids base vocab .. +3) embeddings and output rows:
    each the mean of the base's rows over its ordinary vocabulary, in the input table and in an
    untied LM head alike. Why the mean: a new input row near the average token changes what the
    base computes least, and a new output row equal to the mean gives each new token a logit
    near the average one, so the base's predictions barely move before finetuning starts (a
    random row can give a new token a large logit and spike the first losses; Hewitt, 2021). A
    model whose table is padded past its tokenizer already has the rows; they get the mean too,
    since nothing trained them."""
    base_vocab, need = tokenizer.base.vocab_size, tokenizer.vocab_size
    emb = _token_table(model)
    head = model.lm_head
    tied = head.weight is emb.weight
    # A base mapped from a bf16 folder (loading.load(mapped=True)) holds bf16 tables: they are
    # copied to float32 before the means are taken, so the new rows are the ones a base read into
    # float32 gets, and stay unrounded
    dtype = torch.promote_types(emb.weight.dtype, torch.float32)
    size = emb.num_embeddings
    if hasattr(model.config, "vocab_multiple") and emb.num_embeddings < need:
        # A table re-allocated anyway is padded for free: a BPE vocabulary to a multiple of 64
        # (GPT-2's 50257 + 4 -> 50304, not a misaligned 50261); a char or byte one as it was.
        multiple = max(model.config.vocab_multiple, PAD_MULTIPLE if need >= PAD_FROM else 1)
        model.config.vocab_multiple = multiple
        size = -(-need // multiple) * multiple
    size = max(size, need)
    with torch.no_grad():
        if emb.num_embeddings < size or emb.weight.dtype != dtype:
            grown = _blank(torch.nn.Embedding(size, emb.embedding_dim, dtype=dtype, device="meta"), emb.weight.device)
            grown.weight[: emb.num_embeddings] = emb.weight
            if hasattr(model, "transformer"):
                model.transformer.wte = grown
            else:
                model.embedding = grown
            if tied:
                head.weight = grown.weight
            emb = grown
        if not tied and (head.out_features < need or head.weight.dtype != dtype):
            rows = size if head.out_features < need else head.out_features
            linear = torch.nn.Linear(head.in_features, rows, bias=head.bias is not None, dtype=dtype, device="meta")
            grown = _blank(linear, head.weight.device)
            grown.weight[: head.out_features] = head.weight
            if head.bias is not None:
                grown.bias[: head.out_features] = head.bias
                grown.bias[head.out_features :] = grown.bias[:base_vocab].mean()
            model.lm_head = head = grown
        emb.weight[base_vocab:need] = emb.weight[:base_vocab].mean(dim=0)
        if not tied:
            head.weight[base_vocab:need] = head.weight[:base_vocab].mean(dim=0)
    model.config.vocab_size = max(model.config.vocab_size, need)
    log(
        f"chat template: {need - base_vocab} special tokens added (ids {base_vocab}-{need - 1}), initialised to the mean embedding"
    )


def _blank(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`module` (built on the meta device) with zeros for weights: a table grown here takes its rows
    from the base and the mean, and the padding rows past them are never read (no token has their
    ids; logits stop at the vocabulary). Built without random values, so the generator's state, and
    LoRA's adapters drawn next, are the same whether the table grew or not."""
    module = module.to_empty(device=device)
    for p in module.parameters():
        p.zero_()
    return module


def _token_table(model) -> torch.nn.Embedding:
    return model.transformer.wte if hasattr(model, "transformer") else model.embedding


def prepare_finetune(model, ft: FinetuneSettings, log=print, new_tokens: bool = False) -> dict | None:
    """Apply LoRA and freezing as configured; returns the LoRA settings (None without LoRA).
    `new_tokens`: the data's tokenizer has tokens of its own (tinygpt's chat template), whose
    rows must train even under LoRA. Decided from the data, so a resumed run decides alike."""
    if not (ft.freeze_embeddings or ft.freeze_layers or ft.lora_rank):
        return None
    lora = None
    if ft.lora_rank:
        from gpt.model.lora import apply_lora

        n = apply_lora(model, ft.lora_rank, ft.lora_alpha, ft.lora_dropout)
        lora = {"rank": ft.lora_rank, "alpha": ft.lora_alpha}
        log(f"LoRA rank {ft.lora_rank} on {n} projections; all other weights frozen")
        if new_tokens:
            # New tokens' rows must learn, or every template token would keep the same mean row
            # (as PEFT's modules_to_save does when tokens are added): the token table and the LM
            # head train in full beside the adapters.
            for p in {id(p): p for p in (_token_table(model).weight, model.lm_head.weight)}.values():
                p.requires_grad_(True)
            log("the token table and LM head train too: the chat template's new tokens need their own rows")
    frozen = []
    if ft.freeze_embeddings:
        for name in ("wte", "wpe"):
            if hasattr(model, "transformer") and name in model.transformer:
                model.transformer[name].weight.requires_grad_(False)
                frozen.append(name)
        if hasattr(model, "embedding"):
            model.embedding.weight.requires_grad_(False)
            frozen.append("embedding")
    if ft.freeze_layers:
        blocks = list(model.transformer.h) if hasattr(model, "transformer") else []
        if ft.freeze_layers > len(blocks):
            raise TinyGPTError(f"finetune.freeze_layers={ft.freeze_layers} but the model has {len(blocks)} transformer layers")
        for block in blocks[: ft.freeze_layers]:
            for p in block.parameters():
                p.requires_grad_(False)
        frozen.append(f"layers 0-{ft.freeze_layers - 1}")
    if frozen:
        log(f"frozen: {', '.join(frozen)}" + (" (the tied LM head too)" if "wte" in frozen else ""))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(f"trainable parameters: {trainable:,} of {sum(p.numel() for p in model.parameters()):,}")
    return lora


def resumed_finetune(ft: FinetuneSettings, resumed, log=print) -> FinetuneSettings:
    """The finetuning settings of a run resumed from `resumed` (a Checkpoint; None: a new run):
    a resumed LoRA run keeps training its adapters."""
    trained = (resumed.lora or {}).get("rank", 0) if resumed is not None else 0
    if trained and not ft.lora_rank:
        log(f"notice: resuming a LoRA finetune (rank {resumed.lora['rank']}) with its adapters")
        return replace(ft, lora_rank=resumed.lora["rank"], lora_alpha=resumed.lora["alpha"])
    if resumed is not None and trained != ft.lora_rank:
        raise TinyGPTError(
            f"the checkpoint was trained with finetune.lora_rank={trained}; "
            f"resume with that value, or start a new run from it with init_from"
        )
    return ft
