"""Muon under DDP: two CPU processes (torchrun, gloo) that hold the same parameters and gradients
each run Newton-Schulz on their share of the matrices only, exchange the results (held to NCCL's
rules for what it sends, helpers.NCCL_RULES: gloo is laxer), and end with the parameters and the
optimizer state of one process stepping alone.
Run: pytest tests/training/test_muon_ddp.py (this file is also the workers' script:
torchrun --nproc_per_node=2 tests/training/test_muon_ddp.py <out-dir>)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from gpt.config import MuonSettings
from gpt.model import GPT, GPTConfig
from gpt.training import optim

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
LAYERS = 3  # 3 matrices of each of 4 shapes: shares of 2 and 1 per shape, which must even out over the shapes


def _device() -> torch.device:
    """The CPU (gloo), or with TINYGPT_MUON_DDP_BACKEND=nccl this rank's GPU (tests/test_cuda.py)."""
    if os.environ.get("TINYGPT_MUON_DDP_BACKEND") == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def _train() -> tuple[GPT, optim.Optimizers, list[int]]:
    """STEPS Muon + AdamW steps on seeded gradients (the same in every process, as after DDP's
    all-reduce): step(), then a step skipped by its flag (NaN gradients), then step_unless(0).
    Returns the model, the optimizer and how many matrices each step orthogonalised here."""
    torch.manual_seed(0)
    device = _device()
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=LAYERS, n_head=2, n_embd=32)).to(device)
    opt = optim.build_optimizer(model, MuonSettings(lr=1e-2, muon_lr=0.02, weight_decay=0.1), device)
    counted, real = [], optim.orthogonalize

    def counting(g, *args, **kwargs):
        counted[-1] += len(g)
        return real(g, *args, **kwargs)

    optim.orthogonalize = counting
    try:
        g = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=g).to(device)
            counted.append(0)
            if len(counted) == 1:
                opt.step()
            else:
                skipped = len(counted) == 2
                if skipped:
                    for p in model.parameters():
                        p.grad.fill_(float("nan"))
                opt.step_unless(torch.tensor(float(skipped), device=device))
    finally:
        optim.orthogonalize = real
    return model, opt, counted


def test_two_ranks_share_newton_schulz_and_step_like_one_process(tmp_path):
    from helpers import NCCL_RULES, hooked_pythonpath  # (here: the workers run this file without tests/ on their path)

    # gloo copies what it sends; its collectives held to NCCL's rules, as GPUs will hold them
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": hooked_pythonpath(tmp_path / "nccl-rules", NCCL_RULES)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__, str(tmp_path)]
    ddp = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    model, opt, counted = _train()
    matrices = 4 * LAYERS
    assert counted == [matrices] * STEPS  # one process: all of them
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True, map_location="cpu") for r in range(2)]
    for rank in ranks:
        assert rank["counted"] == [matrices // 2] * STEPS, [r["counted"] for r in ranks]  # half each, every step
        for name, p in model.state_dict().items():
            assert (rank["model"][name] - p.cpu()).abs().max() <= 1e-6, name
        # the momentum and AdamW's moments see gradients only: bitwise what one process holds
        for i, state in opt.state_dict()["state"].items():
            assert all(torch.equal(v.cpu(), rank["optimizer"]["state"][i][k]) for k, v in state.items())
    assert all(torch.equal(ranks[0]["model"][k], ranks[1]["model"][k]) for k in ranks[0]["model"])  # replicas stay equal


def _worker(out: Path) -> None:
    import torch.distributed as dist

    nccl = os.environ.get("TINYGPT_MUON_DDP_BACKEND") == "nccl"
    if nccl:
        torch.cuda.set_device(_device())
    dist.init_process_group("nccl" if nccl else "gloo")
    model, opt, counted = _train()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "counted": counted}
    torch.save(state, out / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
