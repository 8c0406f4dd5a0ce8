"""gpt/runtime/distributed.py's waits and the DDP wrapper's options: ranks waiting for local rank 0 to prepare a corpus survive
a wait far longer than the collective timeout, and that timeout is the one the process group got.
Two gloo processes on the CPU, the timeout shrunk to 2 s through TINYGPT_DIST_TIMEOUT_S.
Run: pytest tests/test_distributed_waits.py"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from helpers import free_port


def _worker(rank: int, port: int, patient: bool, out: str) -> None:
    from gpt.runtime import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TINYGPT_DIST_TIMEOUT_S="2")
    d = distributed.Dist(rank, rank, 2, 2)
    distributed.init(d, torch.device("cpu"))
    try:
        if rank == 0:
            time.sleep(5)  # local rank 0 tokenizing a corpus, for longer than a collective may wait
        distributed.barrier(d, patient=patient)
        result = "ok"
    except Exception as e:  # noqa: BLE001 - the outcome is what the test reads
        result = f"failed: {type(e).__name__}"
    Path(out, str(rank)).write_text(result)
    os._exit(0)  # a process group whose peer timed out may hang on the way out


@pytest.mark.parametrize("patient", [True, False])
def test_the_wait_for_data_preparation_outlasts_the_collective_timeout(tmp_path, patient):
    mp.start_processes(_worker, args=(free_port(), patient, str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    waited = (tmp_path / "1").read_text()
    if patient:
        assert waited == "ok" and (tmp_path / "0").read_text() == "ok"
    else:  # an ordinary collective gives up after the group's timeout: the reason for the patient one
        assert waited.startswith("failed"), waited


def _program_with_its_own_group(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from gpt.runtime import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)  # the program's, made before tinygpt's API is called
    d = distributed.Dist(rank, rank, 2, 2, launched=True)
    distributed.init(d, torch.device("cpu"))
    patient = distributed._patient_group is not None
    distributed.barrier(d, patient=True)
    distributed.shutdown()
    kept = dist.is_initialized()
    if kept:
        dist.barrier()  # the program's group still works
        dist.destroy_process_group()
    Path(out, str(rank)).write_text(f"patient={patient} kept={kept}")


def test_a_program_s_own_process_group_gets_the_patient_group_and_is_left_to_it(tmp_path):
    """A program that made its process group before calling tinygpt: the wait for data
    preparation still gets its patient group, and tinygpt's shutdown leaves the program's group."""
    mp.start_processes(_program_with_its_own_group, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    assert [(tmp_path / str(r)).read_text() for r in (0, 1)] == ["patient=True kept=True"] * 2


def test_ddp_neither_broadcasts_buffers_nor_copies_gradients(tmp_path):
    """The buffers are fixed tables equal on every rank (a broadcast before each forward would be a
    collective per step for nothing), and gradients live in DDP's buckets (no second copy)."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from gpt.model import GPT, GPTConfig
    from gpt.runtime.distributed import Dist
    from gpt.training.parallel import Parallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=8, pos_encoding="rope"))
        with warnings.catch_warnings(record=True) as said:  # the switch under the name torch asks for (2.13 renamed it)
            warnings.simplefilter("always")
            step_model, eval_model = Parallel("ddp", processes=2).forwards(
                model, SimpleNamespace(compile=False, device=torch.device("cpu")), Dist(0, 0, 2, 2)
            )
        assert not [w for w in said if "broadcast_buffers" in str(w.message)], [str(w.message) for w in said]
        assert step_model.broadcast_buffers is False and step_model.gradient_as_bucket_view is True

        assert eval_model is model
    finally:
        dist.destroy_process_group()
