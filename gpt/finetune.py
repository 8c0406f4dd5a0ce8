"""Starting from trained weights: load them (checked against the data's tokenizer), crop the
context, freeze parts, or attach LoRA adapters. Used by the trainer before the optimizer is
built."""

from __future__ import annotations

import torch

from gpt import architectures, loading
from gpt.config import FinetuneSettings
from gpt.errors import TinyGPTError
from gpt.lora import apply_lora
from gpt.tokenizer import require_same


def initial_model(source: str, data_tokenizer, ft: FinetuneSettings, dropout: float, log=print):
    """Weights to finetune from (GPT-2 or a checkpoint of ours), checked against the data."""
    loaded = loading.load(str(source), dropout=dropout)
    model = loaded.model.train()
    require_same(
        loaded.tokenizer_spec,
        data_tokenizer.to_dict(),
        f"init_from={source} was trained with another tokenizer than the data's",
        "pick data prepared with the same tokenizer",
    )
    crop = ft.block_size
    if crop and crop < model.config.block_size:
        if getattr(model.config, "pos_encoding", None) == "learned":  # keep the first `crop` positions
            model.transformer.wpe.weight = torch.nn.Parameter(model.transformer.wpe.weight[:crop].clone())
        model.config.block_size = crop
    log(f"initialised from {source}: {architectures.summary(model.config)}")
    return model


def prepare_finetune(model, ft: FinetuneSettings, log=print) -> dict | None:
    """Apply LoRA and freezing as configured; returns the LoRA settings (None without LoRA)."""
    if not (ft.freeze_embeddings or ft.freeze_layers or ft.lora_rank):
        return None
    lora = None
    if ft.lora_rank:
        n = apply_lora(model, ft.lora_rank, ft.lora_alpha, ft.lora_dropout)
        lora = {"rank": ft.lora_rank, "alpha": ft.lora_alpha}
        log(f"LoRA rank {ft.lora_rank} on {n} projections; all other weights frozen")
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
