"""gpt/evals/tasks.py: zero-shot task accuracy equal to what a hand computation gives on fixture items
written in each task's official format.
Run: pytest tests/test_tasks.py"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.config import TaskSettings
from gpt.errors import TinyGPTError
from gpt.evals.scoring import score
from gpt.evals.tasks import TASKS, evaluate_task, examples
from gpt.model import GPTConfig
from gpt.tokenizers import ByteTokenizer, CharTokenizer, TiktokenTokenizer
from helpers import write_ranks

CPU = torch.device("cpu")

# official HellaSwag jsonl (github.com/rowanz/hellaswag): WikiHow items carry [title]/[step] markers
HELLASWAG = [
    {
        "ind": 4,
        "activity_label": "Removing ice from car",
        "ctx_a": "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles.",
        "ctx_b": "then",
        "ctx": "…",
        "split": "val",
        "split_type": "indomain",
        "label": 3,
        "endings": [
            ", the man adds wax to the windshield and cuts it.",
            ", a person board a ski lift, while two men supporting the head of the person wearing winter clothes snow as the we girls sled.",
            ", the man puts on a christmas coat, knitted with netting.",
            ", the man continues removing the snow on his car.",
        ],
        "source_id": "activitynet~v_-1IBHYS3L-Y",
    },
    {
        "ind": 92,
        "activity_label": "Home and Garden",
        "ctx_a": "[header] How to grow grass [title] Pick a spot. [step] Grass needs sun.",
        "ctx_b": "water it",
        "ctx": "…",
        "split": "val",
        "split_type": "zeroshot",
        "label": "0",  # the Hub's copy has labels as strings
        "endings": ["daily [title] for a week.", "with oil.", "never, ever.", "in the dark [step] or not at all."],
        "source_id": "wikihow~1",
    },
]
ARC_HUB = [
    {
        "id": "Mercury_1",
        "question": "Which gas do plants take in?",
        "choices": {"text": ["oxygen", "carbon dioxide", "helium"], "label": ["A", "B", "C"]},
        "answerKey": "B",
    },
    {
        "id": "MCAS_2",
        "question": "What melts ice fastest?",
        "choices": {"text": ["salt", "sand", "a blanket", "nothing"], "label": ["1", "2", "3", "4"]},
        "answerKey": "1",
    },
]
ARC_AI2 = [  # AI2's own jsonl puts the choices inside the question
    {
        "id": r["id"],
        "question": {"stem": r["question"], "choices": [{"text": t, "label": lab} for t, lab in zip(*r["choices"].values())]},
        "answerKey": r["answerKey"],
    }
    for r in ARC_HUB
]
LAMBADA = [
    {"text": "He looked at the clock and said it was time to go home"},
    {"text": "The cat sat on the mat and the dog sat on the rug"},
    {"text": "She opened the gate"},
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


class Bigram(nn.Module):
    """Logits set by the test: row t's logits are table[token t], so log p(next | prefix) is
    log_softmax(table[prev])[next], easy to compute by hand."""

    def __init__(self, vocab: int, block_size: int = 512):
        super().__init__()
        self.config = GPTConfig(vocab_size=vocab, block_size=block_size)
        self.table = nn.Parameter(torch.randn(vocab, vocab) * 3, requires_grad=False)

    def forward(self, idx):
        return self.table[idx], None


def _by_hand(model: Bigram, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    logp, greedy = 0.0, True
    prev = context[-1]
    for b in continuation:
        row = F.log_softmax(model.table[prev], dim=-1)
        logp += row[b].item()
        greedy &= int(row.argmax()) == b
        prev = b
    return logp, greedy


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
@pytest.mark.parametrize("name, rows", [("hellaswag", HELLASWAG), ("arc_easy", ARC_HUB), ("arc_challenge", ARC_AI2)])
def test_multiple_choice_accuracy_equals_the_hand_computation(tmp_path, name, rows, tokenizer):
    items = examples(TaskSettings(name, path=str(_jsonl(tmp_path / "t.jsonl", rows))), tmp_path)
    assert [e.gold for e in items] == [int(r["label"]) for r in rows] if name == "hellaswag" else [1, 0]
    hits = {"acc": 0, "acc_norm": 0}
    trials = 40
    # BPE: a choice's tokens are fewer than its characters, so a per-token normalisation would differ
    tok = ByteTokenizer() if tokenizer == "byte" else TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "r")))
    for seed in range(trials):  # many random models: each item's right/wrong changes, the figures must follow
        torch.manual_seed(seed)
        model = Bigram(tok.vocab_size)
        r = evaluate_task(model, tok, name, items, CPU, batch_size=3)
        acc = acc_norm = 0
        for e in items:
            lp = [_by_hand(model, tok.encode(e.context), tok.encode(" " + c))[0] for c in e.choices]
            norm = [v / len(c) for v, c in zip(lp, e.choices)]  # per character, as the harness's acc_norm
            acc += lp.index(max(lp)) == e.gold
            acc_norm += norm.index(max(norm)) == e.gold
        assert r["acc"] == acc / len(items) and r["acc_norm"] == acc_norm / len(items), seed
        hits["acc"] += r["acc"] != r["acc_norm"]
    assert hits["acc"] > 0  # the two normalisations differ on these items, so each is checked


def test_hellaswag_prompts_follow_the_harness():
    e = TASKS["hellaswag"].parse(HELLASWAG[1])
    assert e.context == "Home and Garden: How to grow grass. Pick a spot. Grass needs sun. Water it"
    assert e.choices == ("daily. for a week.", "with oil.", "never, ever.", "in the dark or not at all.")
    assert TASKS["arc_easy"].parse(ARC_HUB[0]).context == "Question: Which gas do plants take in?\nAnswer:"


def test_cloze_accuracy_and_perplexity_equal_the_hand_computation(tmp_path):
    (tmp_path / "tasks").mkdir()
    _jsonl(tmp_path / "tasks" / "lambada.jsonl", LAMBADA)  # the local copy under the data root is found
    items = examples(TaskSettings("lambada"), tmp_path)
    assert [e.choices for e in items] == [("home",), ("rug",), ("gate",)]
    torch.manual_seed(0)
    model = Bigram(257)
    with torch.no_grad():  # make one item's word the greedy choice: acc must count it
        for a, b in zip(b"e gate", b" gate"):
            model.table[a, b] = 50.0
    r = evaluate_task(model, ByteTokenizer(), "lambada", items, CPU, batch_size=2)
    by_hand = [_by_hand(model, list(e.context.encode()), list(b" " + e.choices[0].encode())) for e in items]
    assert r["acc"] == sum(g for _, g in by_hand) / 3 and 0 < r["acc"] < 1
    assert abs(math.log(r["perplexity"]) - -sum(lp for lp, _ in by_hand) / 3) < 1e-5  # float32 sums
    assert examples(TaskSettings("lambada", limit=2), tmp_path) == items[:2]


def test_task_items_load_from_a_saved_dataset(tmp_path):
    import datasets

    datasets.Dataset.from_list(ARC_HUB).save_to_disk(str(tmp_path / "arc"))
    items = examples(TaskSettings("arc_easy", path=str(tmp_path / "arc")), tmp_path)
    assert [e.gold for e in items] == [1, 0] and items[0].choices == ("oxygen", "carbon dioxide", "helium")


def test_task_mistakes_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(TinyGPTError, match="task='hellaswa' is unknown; use one of hellaswag"):
        examples(TaskSettings("hellaswa"), tmp_path)
    wrong = _jsonl(tmp_path / "w.jsonl", LAMBADA)
    with pytest.raises(TinyGPTError, match="task hellaswag: item 1 is not a hellaswag item .*its fields: text"):
        examples(TaskSettings("hellaswag", path=str(wrong)), tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(TinyGPTError) as offline:
        examples(TaskSettings("hellaswag"), tmp_path)
    message = str(offline.value)
    assert "\n" not in message and "cannot reach Hub dataset Rowan/hellaswag" in message
    assert f"{tmp_path / 'tasks' / 'hellaswag.jsonl'}" in message and "task.path=<file>" in message
    assert "data.source" not in message  # settings of training data, which tinygpt eval does not take
    with pytest.raises(TinyGPTError) as in_training:  # train.eval_tasks: there is no task.path to pass
        examples(TaskSettings("hellaswag"), tmp_path, path_setting=False)
    assert "data.source" not in str(in_training.value) and "task.path" not in str(in_training.value)
    assert f"{tmp_path / 'tasks' / 'hellaswag.jsonl'}" in str(in_training.value)
    chars = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz :\n?")))
    items = examples(TaskSettings("arc_easy", path=str(_jsonl(tmp_path / "a.jsonl", ARC_HUB))), tmp_path)
    with pytest.raises(
        TinyGPTError, match="task arc_easy item 1: text has characters outside this char-level vocabulary: 'A', 'Q', 'W'"
    ):
        evaluate_task(Bigram(len(chars.chars)), chars, "arc_easy", items, CPU)


def test_gpt2_124m_task_loglikelihoods_equal_transformers(tmp_path, gpt2_ranks):
    """GPT-2 (124M) shape from a random-init Hugging Face folder, imported by tinygpt: every
    choice's log-likelihood equals transformers' own forward pass on the same tokens."""
    transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
    from gpt.checkpoints import loading

    torch.manual_seed(0)
    # a wider init than GPT-2's 0.02 so the distributions are peaked: an off-by-one position or
    # a wrong token would move a log-likelihood by far more than the tolerance
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(initializer_range=0.1)).eval()
    hf.save_pretrained(tmp_path / "hf")
    loaded = loading.load(str(tmp_path / "hf"))
    assert sum(p.numel() for p in loaded.model.parameters()) == sum(p.numel() for p in hf.parameters())  # 124M
    tok = loaded.tokenizer()
    items = [TASKS["hellaswag"].parse(r) for r in HELLASWAG] + [TASKS["lambada"].parse(r) for r in LAMBADA]
    requests = [(tok.encode(e.context), tok.encode(" " + c)) for e in items for c in e.choices]
    ours = score(loaded.model, requests, CPU, batch_size=4)
    with torch.no_grad():
        for (ctx, cont), s in zip(requests, ours):
            logits = hf(torch.tensor([ctx + cont])).logits[0, len(ctx) - 1 : -1]
            expected = F.log_softmax(logits.double(), -1).gather(1, torch.tensor(cont)[:, None]).sum().item()
            assert abs(s.logprob - expected) <= 1e-4, (s.logprob, expected)
    spread = [s.logprob / s.tokens for s in ours]
    assert max(spread) - min(spread) > 0.1  # peaked enough that the comparison can tell tokens apart


@pytest.mark.parametrize(
    "record, says",
    [
        ({**HELLASWAG[1], "endings": ["[step]", "with oil."]}, "2 choice(s) (one of them empty)"),
        ({**HELLASWAG[1], "endings": []}, "0 choice(s)"),
        ({**HELLASWAG[1], "label": 7}, "4 choice(s) and the right one is number 8"),
    ],
)
def test_an_item_that_cannot_be_scored_is_a_one_line_error(tmp_path, record, says):
    path = _jsonl(tmp_path / "h.jsonl", [HELLASWAG[0], record])
    with pytest.raises(TinyGPTError, match=f"task hellaswag: item 2 cannot be scored: {re.escape(says)}"):
        examples(TaskSettings("hellaswag", path=str(path)), tmp_path)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TinyGPTError, match="empty.jsonl is empty; it should hold the task's items"):
        examples(TaskSettings("hellaswag", path=str(tmp_path / "empty.jsonl")), tmp_path)


def test_malformed_json_items_are_our_one_line_error_alone(tmp_path, capfd):
    """The datasets library logs 'Failed to load JSON from file ...' before raising; our error
    says the same, so that line is kept out of what the user sees."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ARC_HUB[0]) + "\n{not json\n")
    with pytest.raises(TinyGPTError, match="cannot read .*bad.jsonl line 2: not JSON"):
        examples(TaskSettings("arc_easy", path=str(bad)), tmp_path)
    out, err = capfd.readouterr()
    assert "Failed to load JSON" not in out + err, err
