"""Conversation data (gpt/data/chat.py): records in both shapes prepared once with the loss
mask, split by conversation, refused one line at a time without touching what was prepared;
batches whose loss is the hand-computed loss over the assistant's tokens only.
Run: python -m pytest tests/chat/test_data.py"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gpt.chat.template import ChatTokenizer
from gpt.data.chat import IGNORE, ChatSplit, ConversationBatches, conversation_of
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.tokenizers import ByteTokenizer
from helpers import data_settings, load


def chats(n: int = 12) -> list[dict]:
    out = []
    for i in range(n):
        if i % 3 == 2:  # Alpaca's shape, beside OpenAI's
            out.append({"instruction": f"Add {i} and 1.", "input": "Show the sum.", "output": str(i + 1)})
        else:
            out.append(
                {"messages": [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": str(i + 1)}]}
            )
    return out


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def settings(path: str, name: str = "chats", **kw):
    return data_settings(name, {"kind": "local", "path": path}, {"kind": "byte"}, **kw)


def test_jsonl_of_conversations_is_prepared_with_its_mask_and_split_by_conversation(tmp_path):
    path = write_jsonl(tmp_path / "chats.jsonl", chats())
    data = load(settings(path), tmp_path / "root")
    tok = data.tokenizer
    assert isinstance(tok, ChatTokenizer) and data.meta["kind"] == "chat"
    train, val = data.splits["train"], data.splits["val"]
    assert len(train) + len(val) == 12 and len(val) == 3  # val_fraction 0.25 of the conversations
    rendered = {tuple(tok.render(conversation_of(r, "r"))[0]) for r in chats()}
    for split in (train, val):
        for i in range(len(split)):
            ids, mask = split.conversation(i)
            assert tuple(ids.tolist()) in rendered  # each conversation whole, in one split
            assert ids[0] == tok.eot_id and ids[-1] == tok.end_id and mask[-1] == 1
            start = ids.tolist().index(tok.role_ids["assistant"])
            assert mask.tolist() == [0] * (start + 1) + [1] * (len(ids) - start - 1)
    alpaca = [tok.decode(split.conversation(i)[0].tolist()) for split in (train, val) for i in range(len(split))]
    assert any("<|user|>Add 2 and 1.\n\nShow the sum.<|end|><|assistant|>3<|end|>" in t for t in alpaca)


def test_prepared_once_and_again_when_the_file_changes(tmp_path):
    path = tmp_path / "chats.jsonl"
    write_jsonl(path, chats())
    root = tmp_path / "root"
    load(settings(str(path)), root)
    stamp = (root / "chats" / "meta.json").stat().st_mtime_ns
    load(settings(str(path)), root)
    assert (root / "chats" / "meta.json").stat().st_mtime_ns == stamp
    write_jsonl(path, chats(16))
    data = load(settings(str(path)), root)
    assert len(data.splits["train"]) + len(data.splits["val"]) == 16


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"prompt": "x", "completion": "y"}, 'record 5 has no "messages"'),
        ({"messages": [{"role": "robot", "content": "x"}]}, "record 5, message 1: unknown role 'robot'"),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": "assistant", "content": "c"},
                ]
            },
            "record 5, message 3: two assistant turns in a row",
        ),
        ({"messages": []}, "record 5 has no messages"),
    ],
)
def test_a_bad_record_is_named_and_earlier_data_survives(tmp_path, bad, needle):
    path = tmp_path / "chats.jsonl"
    write_jsonl(path, chats())
    root = tmp_path / "root"
    load(settings(str(path)), root)
    before = {p.name: p.read_bytes() for p in (root / "chats").iterdir()}
    records = chats()
    records[4] = bad
    write_jsonl(path, records)
    with pytest.raises(TinyGPTError) as e:
        load(settings(str(path), format="chat"), root)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert {p.name: p.read_bytes() for p in (root / "chats").iterdir()} == before


def test_no_conversation_with_a_reply_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "chats.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}] * 3)
    with pytest.raises(TinyGPTError, match=r"no conversations with an assistant turn \(3 without one\)"):
        load(settings(path), tmp_path / "root")


def toy_split(tok: ChatTokenizer) -> ChatSplit:
    conversations = [
        [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cde"}],
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "r"},
            {"role": "user", "content": "qq"},
            {"role": "assistant", "content": "rr"},
        ],
        [{"role": "user", "content": "a long question that does not fit"}, {"role": "assistant", "content": "x"}],
    ]
    rendered = [tok.render(c) for c in conversations]
    tokens = np.array([i for ids, _ in rendered for i in ids], dtype=np.uint16)
    mask = np.array([m for _, ms in rendered for m in ms], dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum([len(ids) for ids, _ in rendered])])
    return ChatSplit(tokens, mask, offsets)


def test_loss_is_the_mean_over_the_assistant_tokens_only_as_computed_by_hand():
    """The hand computation runs each conversation alone (no padding) and picks its targets from
    the template's structure (after <|assistant|>, through <|end|>), not from the stored mask: a
    mask that also trained prompt tokens, or padding that leaked into the loss, fails it."""
    tok = ChatTokenizer(ByteTokenizer())
    split = toy_split(tok)
    block = 24  # the third conversation is longer: left out
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=block, n_layer=1, n_head=2, n_embd=16)).eval()
    for p in model.parameters():  # large weights, so every position's loss differs visibly
        torch.nn.init.normal_(p, std=0.5)
    batches = ConversationBatches(split, block, batch_size=6, device=torch.device("cpu"), seed=1)
    assert batches.dropped == 1
    batch = batches.next()
    x, y = batch.x, batch.y
    _, loss = model(x, y)

    drawn = [
        int(batches.eligible[d]) for d in torch.randint(len(batches.eligible), (6,), generator=torch.Generator().manual_seed(1))
    ]
    total, count = 0.0, 0
    for i in drawn:
        ids = split.conversation(i)[0].tolist()
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0][0].float(), dim=-1)
        inside = False
        for t in range(len(ids) - 1):  # target ids[t + 1]
            if ids[t] == tok.role_ids["assistant"]:
                inside = True
            if inside:
                total -= logp[t, ids[t + 1]].item()
                count += 1
            if ids[t + 1] == tok.end_id:
                inside = False
    assert count == int((y != IGNORE).sum())
    assert math.isclose(loss.item(), total / count, rel_tol=1e-5)


def test_every_conversation_too_long_is_an_error():
    tok = ChatTokenizer(ByteTokenizer())
    with pytest.raises(TinyGPTError, match="every conversation is longer than the context"):
        ConversationBatches(toy_split(tok), 8, 2, torch.device("cpu"), seed=0)


def test_ranks_draw_slices_of_one_global_batch():
    tok = ChatTokenizer(ByteTokenizer())
    split = toy_split(tok)
    whole = ConversationBatches(split, 64, 4, torch.device("cpu"), seed=5)
    halves = [ConversationBatches(split, 64, 2, torch.device("cpu"), seed=5, rank=r, world_size=2) for r in (0, 1)]
    y = whole.next().y
    parts = [h.next() for h in halves]
    for r, part in enumerate(parts):
        xr, yr = part.x, part.y
        width = xr.size(1)
        assert torch.equal(yr, y[2 * r : 2 * r + 2, :width]) and (y[2 * r : 2 * r + 2, width:] == IGNORE).all()


def varied_split(tok: ChatTokenizer, n: int = 40) -> ChatSplit:
    rendered = [
        tok.render([{"role": "user", "content": "q" * (1 + i)}, {"role": "assistant", "content": "a" * (1 + (7 * i) % 13)}])
        for i in range(n)
    ]
    tokens = np.array([i for ids, _ in rendered for i in ids], dtype=np.uint16)
    mask = np.array([m for _, ms in rendered for m in ms], dtype=np.uint8)
    return ChatSplit(tokens, mask, np.concatenate([[0], np.cumsum([len(ids) for ids, _ in rendered])]))


def test_length_buckets_cut_padding_and_keep_every_conversation_equally_likely():
    tok = ChatTokenizer(ByteTokenizer())
    split = varied_split(tok)
    cpu = torch.device("cpu")
    plain, grouped = (ConversationBatches(split, 128, 8, cpu, seed=2, length_buckets=b) for b in (1, 5))
    assert len(grouped.buckets) == 5 and sorted(np.concatenate(grouped.buckets).tolist()) == list(range(40))
    padding = {}
    counts = np.zeros(40)
    inputs = [split.conversation(i)[0][:-1].astype(np.int64) for i in range(40)]

    def which(row) -> int:  # the conversation a row holds: its inputs, then padding (0)
        return next(i for i, ids in enumerate(inputs) if np.array_equal(row[: len(ids)], ids) and not row[len(ids) :].any())

    for name, batches in (("plain", plain), ("grouped", grouped)):
        shares = []
        for _ in range(400):
            x = batches.next().x
            shares.append(batches.padding)
            if name == "grouped":
                for row in x.numpy():
                    counts[which(row)] += 1
        padding[name] = float(np.mean(shares))
    assert padding["grouped"] < padding["plain"] / 2, padding
    expected = counts.sum() / 40  # 80 draws each
    assert counts.min() > expected * 0.6 and counts.max() < expected * 1.4, counts


def test_a_damaged_file_is_prepared_again_and_an_intact_one_is_not_reread(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "chats.jsonl", chats())
    root = tmp_path / "root"
    load(settings(path), root)
    import gpt.data.chat as chat_data

    reads = []
    real = chat_data.crc32
    monkeypatch.setattr(chat_data, "crc32", lambda p: reads.append(p.name) or real(p))
    load(settings(path), root)
    assert reads == []  # stamped when written: nothing reread
    shard = root / "chats" / "train.tokens.bin"
    damaged = bytearray(shard.read_bytes())
    damaged[3] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    stamp = (root / "chats" / "meta.json").stat().st_mtime_ns
    data = load(settings(path), root)
    assert "train.tokens.bin" in reads and (root / "chats" / "meta.json").stat().st_mtime_ns != stamp
    assert shard.read_bytes() != bytes(damaged) and len(data.splits["train"]) == 9  # prepared again, whole


def test_widths_come_in_steps_of_64_on_a_gpu_and_exact_on_a_cpu():
    """A compiled model on a GPU meets a handful of widths (each new one would recompile) and its
    matmuls stay aligned; on a CPU the extra columns would only be work. Either way the batch
    counts its real tokens and its trained targets."""
    tok = ChatTokenizer(ByteTokenizer())
    split = varied_split(tok)  # no byte 0 in it: a 0 in x is padding
    assert ConversationBatches(split, 128, 4, torch.device("cuda"), seed=0).width_step == 64
    exact = ConversationBatches(split, 128, 4, torch.device("cpu"), seed=0)
    stepped = ConversationBatches(split, 100, 4, torch.device("cpu"), seed=0, width_step=64)
    for batches in (exact, stepped):
        for _ in range(20):
            batch = batches.next()
            x, y = batch.x, batch.y
            longest = int((x != 0).sum(1).max())
            want = longest if batches is exact else min(100, -(-longest // 64) * 64)
            assert x.size(1) == want
            assert batch.tokens == int((x != 0).sum()) and batch.trained == int((y != IGNORE).sum())
