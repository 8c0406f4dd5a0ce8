"""gpt/evals/harness.py and `tinygpt harness`: lm-evaluation-harness on tinygpt models, offline, on a
task whose items the test writes. What it reports equals tinygpt's own measurements: multiple-
choice accuracy equal to gpt.evals.tasks, a document's log-likelihood equal to the harness's own rolling
windows scored with the model directly, generated text equal to gpt.generation's.
Run: pytest tests/test_harness.py"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from gpt.apps import harness as harness_app
from gpt.checkpoints import checkpoint, loading
from gpt.checkpoints.checkpoint import Checkpoint
from gpt.config import SamplingSettings, TaskSettings
from gpt.evals.scoring import score
from gpt.evals.tasks import evaluate_task, examples, requests
from gpt.generation import generate
from gpt.model import GPT, GPTConfig, registry
from gpt.tokenizers import ByteTokenizer, CharTokenizer
from helpers import REPO, assert_one_line_error, run_script

lm_eval = pytest.importorskip("lm_eval")  # the eval extra
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from gpt.evals.harness import TinyGPTLM  # noqa: E402

CPU = torch.device("cpu")
# ARC-like items in the Hub's format, written in characters a model trained on Tiny Shakespeare knows
ITEMS = [
    ("Which gas do plants take in?", ["oxygen", "carbon dioxide", "helium"], 1),
    ("What melts ice fastest?", ["salt", "sand", "a blanket", "nothing"], 0),
    ("Who wrote Hamlet?", ["Shakespeare", "a king", "nobody"], 0),
    ("Where does the sun rise?", ["in the east", "in the west", "at sea"], 0),
    ("What do bees make?", ["honey", "milk", "bread"], 0),
    ("Which is the largest?", ["a mouse", "a whale", "a cat"], 1),
    ("What falls from clouds?", ["rain", "stones", "gold"], 0),
    ("How many legs has a spider?", ["eight", "six", "four"], 0),
]
RECORDS = [
    {"id": f"q{i}", "question": q, "choices": {"text": c, "label": list("ABCD"[: len(c)])}, "answerKey": "ABCD"[gold]}
    for i, (q, c, gold) in enumerate(ITEMS)
]
TASK_YAML = """task: tiny_arc  # lm_eval's own arc_easy.yaml, on a local file
dataset_path: json
dataset_kwargs:
  data_files:
    test: {items}
  cache_dir: {cache}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices.text}}}}"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture
def task_dir(tmp_path):
    """A folder holding the task's YAML and its items (a JSON lines file): --include_path."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (folder / "tiny_arc.yaml").write_text(TASK_YAML.format(items=folder / "items.jsonl", cache=tmp_path / "hf_cache"))
    return folder


def save_model(path, tokenizer, text: str | None = None, block_size: int = 16):
    """A checkpoint of a tiny GPT, trained for a moment on `text` when given: enough to prefer some
    choices to others and to write more than one character over and over."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=block_size, n_layer=2, n_head=2, n_embd=32)
    model = GPT(config)
    if text is not None:
        data = torch.tensor(tokenizer.encode(text))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(100):
            starts = torch.randint(len(data) - block_size - 1, (16,)).tolist()
            x = torch.stack([data[i : i + block_size] for i in starts])
            y = torch.stack([data[i + 1 : i + block_size + 1] for i in starts])
            _, loss = model(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    ckpt = Checkpoint(model=model.state_dict(), model_config=registry.config_to_dict(config), tokenizer=tokenizer.to_dict())
    checkpoint.save(path, ckpt)
    return path


@pytest.fixture(scope="module")
def char_model(tmp_path_factory):
    """A char model that has read the items with their answers, and its tokenizer."""
    tokenizer = CharTokenizer.fit(json.dumps(RECORDS) + "Question:\nAnswer")
    text = "".join(f"Question: {q}\nAnswer: {choices[gold]}\n\n" for q, choices, gold in ITEMS)
    return save_model(tmp_path_factory.mktemp("model") / "model.pt", tokenizer, text), tokenizer


def adapter(path) -> TinyGPTLM:
    return TinyGPTLM(pretrained=str(path), device="cpu", batch_size=3)


def test_multiple_choice_scores_equal_tinygpt_tasks(tmp_path, task_dir, char_model):
    path, tokenizer = char_model
    # lm_eval passes its own device (cuda:0 unless told) and batch size; model_args win
    lm = TinyGPTLM.create_from_arg_string(f"pretrained={path},device=cpu", {"device": "cuda:0", "batch_size": 3})
    assert (lm.device, lm.batch_size) == (CPU, 3)

    out = lm_eval.simple_evaluate(
        model=lm, tasks=["tiny_arc"], task_manager=TaskManager(include_path=str(task_dir), include_defaults=False)
    )
    reported = out["results"]["tiny_arc"]

    items = examples(TaskSettings(name="arc_easy", path=str(task_dir / "items.jsonl")), tmp_path)
    own = evaluate_task(lm.model, tokenizer, "arc_easy", items, CPU)
    assert (reported["acc,none"], reported["acc_norm,none"]) == (own["acc"], own["acc_norm"])
    assert 0 < own["acc"] < own["acc_norm"] < 1  # the two normalisations disagree on some items: both are checked
    # item by item too: each choice's log-likelihood is tinygpt's score of it (contexts longer than
    # the model's 16 tokens, cut from the left)
    for sample in out["samples"]["tiny_arc"]:
        want = score(lm.model, requests(tokenizer, "arc_easy", [items[sample["doc_id"]]])[0], CPU)
        assert [r[0][0] for r in sample["resps"]] == pytest.approx([s.logprob for s in want], abs=1e-4)
        assert [r[0][1] for r in sample["resps"]] == [s.greedy for s in want]


def test_loglikelihood_moves_trailing_space_to_the_continuation_and_starts_an_empty_context(char_model):
    path, tokenizer = char_model
    lm = adapter(path)
    pairs = [("Question: Who wrote Hamlet?\nAnswer: ", "Shakespeare"), ("", "Question:")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)])
    encode = tokenizer.encode
    want = score(
        lm.model,
        [(encode("Question: Who wrote Hamlet?\nAnswer:"), encode(" Shakespeare")), (encode("\n"), encode("Question:"))],
        CPU,
    )
    assert [g[0] for g in got] == pytest.approx([w.logprob for w in want], abs=1e-4)
    assert [g[1] for g in got] == [w.greedy for w in want]


def rolling_reference(model, prefix: int, tokens: list[int]) -> float:
    """A document's log-likelihood by the harness's own windows (lm_eval.utils), each scored with
    one plain forward pass of the model."""
    block, total = model.config.block_size, 0.0
    for context, target in map(make_disjoint_window, get_rolling_token_windows(tokens, prefix, block, 1)):
        window = (context + target)[-(block + 1) : -1]
        logits, _ = model(torch.tensor([window]))
        logp = F.log_softmax(logits[0, -len(target) :], dim=-1)
        total += logp[torch.arange(len(target)), torch.tensor(target)].sum().item()
    return total


@pytest.mark.parametrize("kind", ["byte", "char", "char without newline"])
def test_document_loglikelihood_scores_every_token_once(tmp_path, kind):
    """The first token is predicted from end-of-text (byte), from a newline (a char vocabulary has
    no end-of-text), or is given and not scored (a vocabulary without either)."""
    texts = ["To be, or not to be", "T", "", "Whether 'tis nobler in the mind to suffer " * 3]  # the last: over 7 windows
    tokenizer = ByteTokenizer() if kind == "byte" else CharTokenizer.fit("".join(texts) + "\n" * (kind == "char"))
    lm = adapter(save_model(tmp_path / "model.pt", tokenizer))  # untrained: the sums are what is checked
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)])

    for text, logprob in zip(texts, got):
        ids = tokenizer.encode(text)
        if kind == "char without newline":
            want = rolling_reference(lm.model, ids[0], ids[1:]) if ids else 0.0
        else:
            want = rolling_reference(lm.model, tokenizer.eot_id if kind == "byte" else tokenizer.encode("\n")[0], ids)
        assert logprob == pytest.approx(want, abs=1e-4), text
    assert got[2] == 0.0 and got[0] < 0


def test_generation_is_greedy_and_ends_at_until(char_model):
    path, tokenizer = char_model
    lm = adapter(path)
    prompts = ["Question: Who wrote", "A", "", "Which gas do plants take in? Answer: ox"]  # "" starts from a newline
    free = [s[0] for s in generate(lm.model, tokenizer, prompts, SamplingSettings(max_new_tokens=12, temperature=0))]

    def asked(until, max_gen_toks=12):
        return [
            Instance("generate_until", {}, (p, {"until": until, "max_gen_toks": max_gen_toks}), i) for i, p in enumerate(prompts)
        ]

    assert lm.generate_until(asked([])) == free
    assert lm.generate_until(asked([], max_gen_toks=5)) == [t[:5] for t in free]  # a char is a token
    stop = free[0][3:5]  # a piece of the greedy text ends it there (not included)
    ended = lm.generate_until(asked(["never said", stop]))
    assert ended == [t[: t.index(stop)] if stop in t else t for t in free]
    assert len(ended[0]) < len(free[0])
    # sampled: repeats of one prompt (maj@k) differ, and a second run gives the same texts
    repeats = [
        Instance("generate_until", {}, (prompts[0], {"do_sample": True, "temperature": 1.0, "max_gen_toks": 20}), i)
        for i in range(3)
    ]
    drawn = lm.generate_until(repeats)
    assert len(set(drawn)) == 3 and lm.generate_until(repeats) == drawn


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_root):
    """A run of `python train.py debug=tiny`: a char model of Tiny Shakespeare, as a user trains it."""
    root, data_overrides = data_root
    cwd = tmp_path_factory.mktemp("work")
    proc = run_script("train.py", ["debug=tiny", *data_overrides], cwd, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (cwd / "outputs" / "runs").iterdir()
    return cwd, run_dir, root


def table(stdout: str) -> dict[str, float]:
    """metric -> value from the table lm_eval prints (a metric's row leaves the task column empty
    after the first)."""
    values = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[4] in ("acc", "acc_norm"):
            values[cells[4]] = float(cells[6])
    return values


def test_the_command_runs_lm_eval_on_a_trained_run(trained, task_dir, monkeypatch):
    cwd, run_dir, root = trained
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["--model_args", f"pretrained={run_dir}", "--tasks", "tiny_arc", "--include_path", str(task_dir), "--limit", "4"]
    proc = run_script("harness", args, cwd, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tiny_arc" in proc.stdout and "tinygpt" in proc.stdout, proc.stdout

    loaded = loading.load(str(run_dir))
    items = examples(TaskSettings(name="arc_easy", path=str(task_dir / "items.jsonl"), limit=4), root)
    own = evaluate_task(loaded.model, loaded.tokenizer(), "arc_easy", items, CPU)
    assert table(proc.stdout) == {"acc": own["acc"], "acc_norm": own["acc_norm"]}, proc.stdout


def test_a_run_that_does_not_exist_is_a_one_line_error(tmp_path, task_dir):
    args = ["--model_args", f"pretrained={tmp_path / 'nowhere'}", "--tasks", "tiny_arc", "--include_path", str(task_dir)]
    proc = run_script("harness", args, tmp_path, tmp_path)
    assert_one_line_error(proc, f"pretrained={tmp_path / 'nowhere'}", "checkpoint")


def test_mistakes_before_lm_eval_starts_are_one_line_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs under outputs/runs here
    path = save_model(tmp_path / "model.pt", ByteTokenizer())
    for argv, needle in [
        (["--model_args", f"pretrained={path},temperature=0", "--tasks", "x"], "tinygpt has no 'temperature'"),
        (["--tasks", "x"], "--model_args pretrained=<run directory"),  # no pretrained=, and no runs here
    ]:
        with pytest.raises(SystemExit) as stop:
            harness_app.main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and needle in err, err


def test_lm_eval_still_finds_its_own_models_after_tinygpt_registers(tmp_path):
    # a fresh process: lm_eval lists its built-in models only when nothing was registered before
    code = "import gpt.evals.harness; from lm_eval.api.registry import get_model; print(get_model('dummy').__name__)"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "DummyLM", proc.stderr[-2000:]


def test_without_lm_eval_a_one_line_error_says_how_to_install_it(monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now fails, as when it is not installed
    monkeypatch.delitem(sys.modules, "gpt.evals.harness")
    with pytest.raises(SystemExit) as stop:
        harness_app.main(["--tasks", "hellaswag"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: lm-evaluation-harness is not installed; pip install 'tinygpt[eval]'") and "\n" not in err
