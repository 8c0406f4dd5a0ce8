"""gpt/checkpoints/loading.py: one loader for a checkpoint, a run directory, a Hugging Face GPT-2 folder or
the newest run. Run: pytest tests/test_loading.py"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from gpt.chat.template import ChatTokenizer
from gpt.checkpoints import checkpoint, loading, runs
from gpt.checkpoints.checkpoint import Checkpoint
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.model.lora import apply_lora
from gpt.tokenizers import CharTokenizer
from gpt.training.claim import resumable
from gpt.training.finetune import add_chat_tokens
from helpers import export_hf

CHARS = list("abcdefgh")


def _run(tmp_path, lora: bool = False) -> tuple[GPT, str]:
    """A run directory with best.pt and one step checkpoint of a random model."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=8))
    run = tmp_path / "run"
    spec = {"kind": "char", "chars": CHARS}
    weights = Checkpoint(model=model.state_dict(), model_config=model.config.to_dict(), tokenizer=spec, step=4, best_val_loss=2.5)
    checkpoint.save(run / runs.CKPT_DIR / runs.BEST, weights)
    if lora:
        apply_lora(model, rank=2, alpha=4.0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".lora_B" in name:
                    p.normal_(0, 0.5)
    step = Checkpoint(
        model=model.state_dict(),
        model_config=model.config.to_dict(),
        tokenizer=spec,
        step=4,
        lora={"rank": 2, "alpha": 4.0} if lora else None,
    )
    checkpoint.save(run / runs.CKPT_DIR / runs.step_file(4), step)
    return model.eval(), str(run)


def test_a_run_dir_a_checkpoint_and_the_newest_run_load_the_same_model(tmp_path):
    model, run = _run(tmp_path)
    idx = torch.randint(0, 8, (2, 8))
    by_dir = loading.load(run)
    assert by_dir.source.endswith("checkpoints/best.pt") and by_dir.checkpoint.step == 4
    assert by_dir.tokenizer().decode([0, 7]) == "ah" and not by_dir.model.training
    newest = loading.load(loading.choose(runs_dir=tmp_path))
    by_file = loading.load(loading.choose(ckpt=by_dir.source))
    with torch.no_grad():
        for other in (newest, by_file):
            assert torch.equal(other.model(idx)[0], model(idx)[0])
    assert loading.choose(init_from="gpt2", ckpt="ignored.pt") == "gpt2"


def test_lora_adapters_are_folded_in_on_load(tmp_path):
    model, run = _run(tmp_path, lora=True)
    loaded = loading.load(str(runs.latest(run)))
    assert not any(".lora_" in k for k in loaded.model.state_dict())
    idx = torch.randint(0, 8, (2, 8))
    with torch.no_grad():
        assert (loaded.model(idx)[0] - model(idx)[0]).abs().max() < 1e-5


def test_a_hugging_face_folder_loads_with_its_tokenizer(tmp_path):
    model, run = _run(tmp_path)
    export_hf(model, CharTokenizer(CHARS), tmp_path / "hf")
    loaded = loading.load(str(tmp_path / "hf"), dropout=0.1)
    assert loaded.checkpoint is None and loaded.tokenizer_spec == {"kind": "char", "chars": CHARS}
    assert loaded.model.config.dropout == 0.1


def test_clear_errors(tmp_path):
    with pytest.raises(TinyGPTError, match="init_from=/nowhere is not a Hugging Face model"):
        loading.load("/nowhere")
    model, run = _run(tmp_path)
    bad = checkpoint.load(runs.latest(run))
    bad.model["transformer.wte.weight"] = torch.zeros(3, 3)
    checkpoint.save(tmp_path / "bad.pt", bad)
    with pytest.raises(TinyGPTError, match="weights do not fit its own model settings"):
        loading.load(str(tmp_path / "bad.pt"))


def test_a_resumable_checkpoint_is_one_whose_weights_fit_and_a_rewritten_one_is_checked_afresh(tmp_path, monkeypatch):
    """`resumable` builds the checkpoint's model once per look (how often a start looks is the
    claim's business: once, tests/apps/test_train.py); a file rewritten since it was seen to fit
    is refused if it no longer fits."""
    from gpt.checkpoints.checkpoint import TrainingState

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=8))
    spec = {"kind": "char", "chars": CHARS}
    path = tmp_path / runs.step_file(3)
    state = TrainingState({}, {}, {}, None, 0, 0)
    checkpoint.save(
        path, Checkpoint(model=model.state_dict(), model_config=model.config.to_dict(), tokenizer=spec, step=3, training=state)
    )
    built = []
    real = loading.model_from_checkpoint  # (claim imports it as it examines a checkpoint)
    monkeypatch.setattr(loading, "model_from_checkpoint", lambda *a, **k: built.append(1) or real(*a, **k))
    assert resumable(path).step == 3
    assert len(built) == 1
    wrong = {k: (v[:4] if k == "transformer.wte.weight" else v) for k, v in model.state_dict().items()}
    checkpoint.save(path, Checkpoint(model=wrong, model_config=model.config.to_dict(), tokenizer=spec, step=3, training=state))
    with pytest.raises(TinyGPTError, match="ckpt-0000003.pt"):
        resumable(path)
    assert len(built) == 2


def _mapped_ranges(path) -> list[tuple[int, int]]:
    """The addresses at which this process maps the file `path` (Linux's /proc/self/maps)."""
    ranges = []
    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def _hf_folder(tmp_path, family: str):
    """A small GPT-2 (tied head: its Conv1D weights transposed on load) or Llama (untied head:
    q, k and v stacked on load) folder saved in bf16, as Hub models are, with a char tokenizer."""
    transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
        hf = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=16, tie_word_embeddings=False,
        )  # fmt: skip
        hf = transformers.LlamaForCausalLM(config)
    folder = tmp_path / family
    hf.to(torch.bfloat16).save_pretrained(folder)
    chars = [chr(ord("0") + i) for i in range(64)]
    (folder / "tinygpt_tokenizer.json").write_text(json.dumps({"kind": "char", "chars": chars}))
    return folder, chars


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_mapped_load_holds_the_files_pages_and_computes_what_a_read_one_does(tmp_path, family):
    """loading.load(mapped=True), an FSDP2 start's rank 0: every weight the folder holds as it is
    (all but Llama's stacked q/k/v) is the file's mapped memory in the file's dtype, nothing
    copied; a tied head is still the embedding; in float32 it computes what the model read into
    float32 does, and the chat template's new rows (add_chat_tokens) are the same bits, drawn
    from no random generator."""
    folder, chars = _hf_folder(tmp_path, family)
    read = loading.load(str(folder)).model
    mapped = loading.load(str(folder), mapped=True).model
    ranges = _mapped_ranges(folder / "model.safetensors")
    assert ranges, "safetensors maps the file"
    for name, p in mapped.named_parameters():
        inside = any(start <= p.data_ptr() < end for start, end in ranges)
        assert p.dtype == torch.bfloat16 and inside != (family == "llama" and ".c_attn." in name), name
    assert (mapped.lm_head.weight is mapped.transformer.wte.weight) == (family == "gpt2")
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        assert torch.equal(copy.deepcopy(mapped).float()(idx)[0], read(idx)[0])

    tokenizer = ChatTokenizer(CharTokenizer(chars))
    for model in (read, mapped):
        before = torch.random.get_rng_state()
        add_chat_tokens(model, tokenizer, log=lambda _: None)
        # grown (the bf16 tables always) without drawing: LoRA's adapters, drawn next, do not
        # depend on how the base was loaded
        assert torch.equal(torch.random.get_rng_state(), before)
    for name, value in read.state_dict().items():
        assert torch.equal(mapped.state_dict()[name].float(), value), name
    assert mapped.transformer.wte.weight.dtype == torch.float32  # the grown table: no rounded means


def test_a_mapped_checkpoint_holds_its_files_pages(tmp_path):
    """A tinygpt run as init_from under FSDP2: its best.pt's weights are the mapped file's, tied."""
    model, run = _run(tmp_path)
    loaded = loading.load(run, mapped=True)
    ranges = _mapped_ranges(tmp_path / "run" / runs.CKPT_DIR / runs.BEST)
    assert ranges and all(any(a <= p.data_ptr() < b for a, b in ranges) for p in loaded.model.parameters())
    assert loaded.model.lm_head.weight is loaded.model.transformer.wte.weight
    idx = torch.randint(0, 8, (2, 8))
    with torch.no_grad():
        assert torch.equal(loaded.model(idx)[0], model(idx)[0])


def test_a_tied_weight_is_named_once_and_copied_once(monkeypatch):
    """meta.tied_names: the LM head tied to the embedding, nothing in an untied model; adopt(copy=True)
    makes one private copy of a tied table even when the file holds it as two tensors (torch.load's)."""
    from gpt.model import meta

    tied = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=8))
    untied = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=8, tie_embeddings=False))
    assert meta.tied_names(tied) == {"lm_head.weight": "transformer.wte.weight"} and meta.tied_names(untied) == {}
    state = {k: v.clone() for k, v in tied.state_dict().items()}  # two tensor objects for the tie
    made = []
    real_to = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        if kwargs.get("copy"):
            made.append(self.shape)
        return real_to(self, *args, **kwargs)

    with torch.device("meta"):
        model = GPT(tied.config)
    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    meta.adopt(model, state, copy=True)
    monkeypatch.undo()
    assert len(made) == len(state) - 1 and model.lm_head.weight is model.transformer.wte.weight
    assert model.transformer.wte.weight.data_ptr() != state["transformer.wte.weight"].data_ptr()


@pytest.mark.parametrize("pos_encoding, lora", [("rope", False), ("sinusoidal", True)])
def test_sampling_from_a_checkpoint_imports_no_compiler_and_no_sharded_checkpoint_reader(tmp_path, pos_encoding, lora):
    """`python sample.py` builds the model as shapes and takes the checkpoint's weights: building
    on the meta device draws no initial values and computes its position tables on the CPU, and
    a whole checkpoint needs no DCP; torch._dynamo and torch.distributed.checkpoint/tensor (0.8 s
    of a 2.5 s start, together) stay unimported. The text is the model's: the tables are right."""
    import subprocess
    import sys

    from helpers import REPO

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=8, pos_encoding=pos_encoding)
    model = GPT(config)
    if lora:
        apply_lora(model, rank=2, alpha=4.0)
    spec = {"kind": "char", "chars": CHARS}
    state = Checkpoint(
        model=model.state_dict(),
        model_config=config.to_dict(),
        tokenizer=spec,
        step=1,
        lora={"rank": 2, "alpha": 4.0} if lora else None,
    )
    checkpoint.save(tmp_path / "run" / runs.CKPT_DIR / runs.BEST, state)
    watch = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('LOADED', sorted(m for m in ('torch._dynamo', 'torch.distributed.checkpoint', "
        "'torch.distributed.tensor') if m in sys.modules)))\n"
        f"sys.argv = ['sample.py', 'run_dir={tmp_path / 'run'}', 'num_samples=1', 'max_new_tokens=12', 'temperature=0', "
        "'prompt=ab', 'device=cpu']\n"
        f"runpy.run_path({str(REPO / 'sample.py')!r}, run_name='__main__')\n"
    )
    out = subprocess.run([sys.executable, "-c", watch], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LOADED []" in out.stdout, out.stdout[-2000:]
    with torch.no_grad():  # greedy: the same 12 characters the model in this process writes
        idx = torch.tensor([[0, 1]])
        for _ in range(12):
            idx = torch.cat([idx, model(idx)[0][:, -1:].argmax(-1)], dim=1)
    assert "ab" + "".join(CHARS[i] for i in idx[0, 2:].tolist()) in out.stdout


def test_a_lora_model_of_shapes_only_merges_without_importing_the_compiler():
    """A sharded LoRA checkpoint loads as shapes first (loading.model_from_checkpoint): its adapters
    are folded away on the meta device with nothing computed, and torch._dynamo stays unimported."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from gpt.model import GPT, GPTConfig, meta\n"
        "from gpt.model.lora import apply_lora, merge_lora\n"
        "with meta.building():\n"
        "    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=8))\n"
        "    apply_lora(model, 2, 4.0)\n"
        "    merge_lora(model)\n"
        "print(sorted(model.state_dict())[:2], all(t.is_meta for t in model.state_dict().values()), 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("True False"), out.stdout
    assert "lora" not in out.stdout
