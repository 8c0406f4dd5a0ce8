"""The chat template (gpt/chat/template.py): fixed conversations to fixed ids for every tokenizer
kind, the loss mask, ordinary text that spells a special token, and the refusals.
Run: python -m pytest tests/chat/test_template.py"""

from __future__ import annotations

import pytest

from gpt.chat.template import SPECIAL_TOKENS, ChatTokenizer, check_messages, jinja_template
from gpt.errors import TinyGPTError
from gpt.tokenizers import ByteTokenizer, CharTokenizer, TiktokenTokenizer, tokenizer_from_dict, tokenizer_identity
from gpt.tokenizers.bpe import train_bpe
from gpt.tokenizers.hf import HFTokenizer

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello world"},
    {"role": "assistant", "content": "Hi there!"},
]


def test_byte_ids_by_hand():
    tok = ChatTokenizer(ByteTokenizer())
    system, user, assistant, end = 257, 258, 259, 260  # right after the 257 byte-level ids
    expected = [256, system, *b"Be brief.", end, user, *b"Hello world", end, assistant, *b"Hi there!", end]
    ids, mask = tok.render(CONVERSATION)
    assert ids == expected
    assert mask == [0] * (len(expected) - len(b"Hi there!") - 1) + [1] * (len(b"Hi there!") + 1)
    assert tok.prompt(CONVERSATION[:2]) == expected[: expected.index(assistant) + 1]
    assert (
        tok.vocab_size == 261
        and tok.decode(ids[1:]) == "<|system|>Be brief.<|end|><|user|>Hello world<|end|><|assistant|>Hi there!<|end|>"
    )


def test_char_ids_by_hand():
    base = CharTokenizer.fit("Be brief.Hello worldHi there!")
    tok = ChatTokenizer(base)
    n = base.vocab_size  # no end-of-text: nothing opens the conversation
    ids, mask = tok.render(CONVERSATION)
    c = base.encode
    assert ids == [n, *c("Be brief."), n + 3, n + 1, *c("Hello world"), n + 3, n + 2, *c("Hi there!"), n + 3]
    assert sum(mask) == len("Hi there!") + 1 and mask[-1] == 1


def test_gpt2_bpe_fixed_ids(gpt2_ranks):
    tok = ChatTokenizer(TiktokenTokenizer("gpt2", ranks_file=str(gpt2_ranks)))
    ids, mask = tok.render(CONVERSATION)
    # 50256 <|endoftext|>; the template's tokens are 50257-50260; "Hello" 15496, " world" 995, "Hi" 17250
    assert ids == [50256, 50257, 3856, 4506, 13, 50260, 50258, 15496, 995, 50260, 50259, 17250, 612, 0, 50260]
    assert mask == [0] * 11 + [1] * 4


def _bpe():
    return train_bpe(["Hello world. Hi there! Be brief, hello again."] * 20, 300)


def test_trained_bpe_and_hf_keep_their_ids(tmp_path):
    bpe = _bpe()
    for base in (bpe, HFTokenizer(json_text=bpe.json_text)):
        tok = ChatTokenizer(base)
        n, eot = base.vocab_size, base.eot_id
        ids, _ = tok.render(CONVERSATION)
        e = base.encode
        assert ids == [eot, n, *e("Be brief."), n + 3, n + 1, *e("Hello world"), n + 3, n + 2, *e("Hi there!"), n + 3]
        assert all(i < n for i in e("Hello world"))  # ordinary text: the base's own ids


@pytest.mark.parametrize("text", [*SPECIAL_TOKENS, "<|endoftext|>", "a <|assistant|> b <|end|>"])
def test_text_spelling_a_special_token_stays_ordinary(text):
    tok = ChatTokenizer(ByteTokenizer())
    ids, mask = tok.render([{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}])
    structural = [i for i in ids if i in tok.special_ids]
    assert structural == [tok.role_ids["user"], tok.end_id, tok.role_ids["assistant"], tok.end_id]
    assert tok.decode(ids[2 : 2 + len(text.encode())]) == text


def test_mask_covers_every_assistant_turn_and_its_end():
    tok = ChatTokenizer(ByteTokenizer())
    turns = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "bc"},
        {"role": "user", "content": "d"},
        {"role": "assistant", "content": "ef"},
    ]
    ids, mask = tok.render(turns)
    trained = [i for i, m in zip(ids, mask) if m]
    assert trained == [*b"bc", tok.end_id, *b"ef", tok.end_id]
    assert len(ids) == len(mask)


@pytest.mark.parametrize(
    "messages, needle",
    [
        ([], "has no messages"),
        ("hello", "has no messages"),
        ([{"role": "bot", "content": "x"}], "unknown role 'bot'"),
        (
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "assistant", "content": "z"}],
            "message 3: two assistant turns in a row",
        ),
        ([{"role": "assistant", "content": "x"}], "an assistant turn before any user turn"),
        ([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "a system message can only come first"),
        ([{"role": "user", "content": 3}], "content must be text"),
        ([{"role": "user"}], 'write it as {"role": ..., "content": ...}'),
    ],
)
def test_refusals_name_the_message(messages, needle):
    with pytest.raises(TinyGPTError, match="record 7") as e:
        check_messages(messages, "record 7")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_reply_needs_the_user_to_speak_last():
    tok = ChatTokenizer(ByteTokenizer())
    with pytest.raises(TinyGPTError, match="the last message must be the user's"):
        tok.prompt(CONVERSATION)


def test_char_vocabulary_refuses_unknown_characters_naming_the_record():
    tok = ChatTokenizer(CharTokenizer.fit("abc"))
    with pytest.raises(TinyGPTError, match=r"record 2: text has characters outside .*'z'"):
        tok.render([{"role": "user", "content": "abz"}, {"role": "assistant", "content": "a"}], "record 2")


def test_dict_form_records_the_template_and_changes_the_identity():
    base = ByteTokenizer()
    tok = ChatTokenizer(base)
    rebuilt = tokenizer_from_dict(tok.to_dict())
    assert isinstance(rebuilt, ChatTokenizer) and rebuilt.render(CONVERSATION) == tok.render(CONVERSATION)
    assert tokenizer_identity(tok.to_dict()) != tokenizer_identity(base.to_dict())
    with pytest.raises(TinyGPTError, match="chat template 'other' is not one this tinygpt knows"):
        tokenizer_from_dict({**base.to_dict(), "chat": {"template": "other"}})


def test_prompt_within_drops_the_oldest_turns_and_keeps_the_system_message():
    tok = ChatTokenizer(ByteTokenizer())
    history = [{"role": "system", "content": "S"}]
    for i in range(5):
        history += [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
    history.append({"role": "user", "content": "last"})
    full = tok.prompt(history)
    ids, dropped = tok.prompt_within(history, len(full) - 1)
    assert dropped == 2 and ids == tok.prompt(history[:1] + history[3:])
    ids, dropped = tok.prompt_within(history, 5)  # nothing fits: only the newest user message stays
    assert dropped == 10 and ids == tok.prompt([history[0], history[-1]])


def test_jinja_template_renders_the_same_text():
    jinja2 = pytest.importorskip("jinja2")
    tok = ChatTokenizer(ByteTokenizer())
    template = jinja2.Environment().from_string(jinja_template("<|endoftext|>"))
    text = template.render(messages=CONVERSATION[:2], add_generation_prompt=True)
    assert text == "<|endoftext|>" + tok.decode(tok.prompt(CONVERSATION[:2])[1:])
