"""A Hugging Face tokenizer's own chat template (gpt/chat/hf_template.py): rendered as
transformers' `apply_chat_template` renders it, ids and all; the loss mask; message text that
spells a special token stays text; conversations prepared with it add no tokens.
Run: python -m pytest tests/chat/test_hf_template.py"""

from __future__ import annotations

import json
import random

import pytest

from gpt.chat.hf_template import HFChatTokenizer, template_of
from gpt.interop.hf import tokenizer_for
from gpt.tokenizers import tokenizer_from_dict
from gpt.tokenizers.hf import HFTokenizer
from helpers import data_settings, load, random_conversation, template_ids

transformers = pytest.importorskip("transformers")

# ChatML, as SmolLM2 and Qwen write it (a system message by default when none is given)
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = ["hello", "world", "What", "is", "2", "+", "37", "?", "naïve", "日本", "new\nline", "  spaces", "end."]


def chatml_folder(tmp_path):
    """A Hugging Face tokenizer folder: a small BPE with ChatML's special tokens, and the template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([" ".join(WORDS)] * 50 + ["system user assistant You are helpful."] * 20, trainer)
    tmp_path.mkdir(parents=True, exist_ok=True)
    tok.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_renders_as_apply_chat_template_does(tmp_path):
    folder = chatml_folder(tmp_path)
    spec = tokenizer_for(folder, 400)
    assert spec["chat"]["template"] == "hf" and spec["chat"]["eos"] == "<|im_end|>"
    tok = tokenizer_from_dict(spec)
    assert isinstance(tok, HFChatTokenizer) and tok.end_id == tok.base.tok.token_to_id("<|im_end|>")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    rng = random.Random(0)
    for _ in range(50):
        messages = random_conversation(rng, WORDS, 6)
        assert template_ids(hf.apply_chat_template(messages, tokenize=True)) == tok.render(messages)[0]
        asking = messages[:-1]
        assert template_ids(hf.apply_chat_template(asking, tokenize=True, add_generation_prompt=True)) == tok.prompt(asking)


def test_mask_is_the_replies_and_their_end_of_turn(tmp_path):
    tok = tokenizer_from_dict(tokenizer_for(chatml_folder(tmp_path), 400))
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]
    ids, mask = tok.render(messages)
    trained = [i for i, m in zip(ids, mask) if m]
    assert trained == tok.base.encode("world") + [tok.end_id]
    assert tok.decode(ids).startswith("<|im_start|>system\nYou are helpful.<|im_end|>")  # the template's default system


def test_message_text_spelling_a_special_token_stays_text(tmp_path):
    tok = tokenizer_from_dict(tokenizer_for(chatml_folder(tmp_path), 400))
    ids, _ = tok.render([{"role": "user", "content": "<|im_end|>"}, {"role": "assistant", "content": "ok"}])
    assert ids.count(tok.end_id) == 3  # the default system's, the user's and the reply's: not the one the user typed


def test_conversations_prepared_with_it_add_no_tokens(tmp_path):
    spec = tokenizer_for(chatml_folder(tmp_path / "tok"), 400)
    records = [
        {"messages": [{"role": "user", "content": f"What is {i}?"}, {"role": "assistant", "content": str(i)}]} for i in range(8)
    ]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    settings = data_settings("chats", {"kind": "local", "path": str(path)}, {"kind": "byte"})
    from gpt.data import load_data

    data = load_data(settings, tmp_path / "root", log=lambda *a: None, base_tokenizer=spec)
    assert (
        isinstance(data.tokenizer, HFChatTokenizer)
        and data.tokenizer.vocab_size == HFTokenizer(json_text=spec["json_text"]).vocab_size
    )
    assert data.meta["tokenizer"]["chat"]["jinja"] == CHATML
    own = load(settings, tmp_path / "root").tokenizer  # without a base: the data's tokenizer and tinygpt's template
    assert own.kind == "byte" and own.vocab_size == 257 + 4


def test_template_of_reads_the_config_forms():
    assert template_of({}) is None and template_of({"chat_template": ""}) is None
    named = template_of({"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "y"}]})
    assert named["jinja"] == "y"
    assert template_of({"chat_template": "t", "eos_token": {"content": "</s>"}})["eos"] == "</s>"
