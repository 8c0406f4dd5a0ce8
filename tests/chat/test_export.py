"""The chat template in a Hugging Face export (gpt/interop/hf.py): `apply_chat_template` on the
exported tokenizer gives tinygpt's ids for random conversations, and transformers' text-generation
pipeline chats with the exported model, replying what tinygpt replies.
Run: python -m pytest tests/chat/test_export.py"""

from __future__ import annotations

import random

import pytest
import torch

from gpt import interop
from gpt.chat.template import ChatTokenizer
from gpt.config import SamplingSettings
from gpt.generation import generate
from gpt.model import GPT, GPTConfig
from gpt.tokenizers import TiktokenTokenizer
from gpt.tokenizers.bpe import train_bpe
from helpers import random_conversation, template_ids

transformers = pytest.importorskip("transformers")

WORDS = [
    "hello",
    "world",
    "What",
    "is",
    "2",
    "+",
    "37",
    "?",
    "Ünïcødé",
    "naïve",
    "日本",
    "emoji 🙂",
    "tabs\t",
    "new\nline",
    "  spaces",
]


def export_chat_model(tok: ChatTokenizer, out) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=96, n_layer=2, n_head=2, n_embd=32)).eval()
    with torch.no_grad():  # large weights: every token of the prompt changes the reply
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(std=0.3)
    interop.export(model, tok, out)
    return model


@pytest.mark.parametrize("kind", ["gpt2", "bpe"])
def test_apply_chat_template_gives_tinygpt_ids_for_50_random_conversations(kind, tmp_path, request):
    if kind == "gpt2":
        base = TiktokenTokenizer("gpt2", ranks_file=str(request.getfixturevalue("gpt2_ranks")))
    else:
        base = train_bpe([" ".join(WORDS)] * 30, 320)
    tok = ChatTokenizer(base)
    export_chat_model(tok, tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    rng = random.Random(0)
    for _ in range(50):
        messages = random_conversation(rng, WORDS)
        assert template_ids(hf.apply_chat_template(messages, tokenize=True)) == tok.render(messages)[0]
        asking = messages[:-1]
        assert template_ids(hf.apply_chat_template(asking, tokenize=True, add_generation_prompt=True)) == tok.prompt(asking)


def test_a_transformers_pipeline_chats_with_the_export_as_tinygpt_does(tmp_path, gpt2_ranks):
    tok = ChatTokenizer(TiktokenTokenizer("gpt2", ranks_file=str(gpt2_ranks)))
    model = export_chat_model(tok, tmp_path)
    chat = transformers.pipeline("text-generation", model=str(tmp_path), device="cpu")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    out = chat(messages, max_new_tokens=12, do_sample=False)
    reply = out[0]["generated_text"][-1]
    ours = generate(model, tok, [tok.prompt(messages)], SamplingSettings(max_new_tokens=12, temperature=0))[0][0]
    assert reply["role"] == "assistant" and reply["content"] == ours
    without_start = generate(model, tok, [tok.prompt(messages)[1:]], SamplingSettings(max_new_tokens=12, temperature=0))
    assert without_start[0][0] != ours  # the reply depends on every prompt token (so a wrong template shows)
