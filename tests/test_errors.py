"""gpt/errors.py: what counts as running out of memory (a user's to fix: a smaller batch or model)
and the one line an unexpected error is reduced to. Run: pytest tests/test_errors.py"""

from __future__ import annotations

import errno

import pytest
import torch

from gpt.errors import TinyGPTError, one_line, out_of_memory


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.11 GiB total capacity)"),
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB"),  # older torch: a plain RuntimeError
        RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.00 GB)"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        MemoryError(),
        OSError(errno.ENOMEM, "Cannot allocate memory"),
    ],
)
def test_running_out_of_memory_is_a_users_error_with_a_way_out(error):
    found = out_of_memory(error)
    assert isinstance(found, TinyGPTError) and str(found).startswith("out of memory (")
    assert "lower train.batch_size" in str(found) and "\n" not in str(found)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("Expected checkout of memory_format to be contiguous"),
        RuntimeError("the kernel ran out of shared memory slots"),
        ValueError("CUDA out of memory"),  # not an allocator's error type
        OSError(errno.ENOSPC, "No space left on device"),
        KeyError("memory"),
    ],
)
def test_other_errors_that_mention_memory_are_not_taken_for_it(error):
    assert out_of_memory(error) is None


def test_one_line_keeps_a_users_error_and_shortens_others():
    assert one_line(TinyGPTError("lower optim.lr")) == "lower optim.lr"
    assert one_line(ZeroDivisionError("division by zero")) == "ZeroDivisionError: division by zero"
    assert one_line(RuntimeError("first\nsecond")) == "RuntimeError: first"
    assert one_line(KeyError()) == "KeyError"
    assert len(one_line(RuntimeError("x" * 5000))) < 400


def test_a_full_disk_met_by_any_write_is_one_line_naming_the_folder(tmp_path, capsys):
    """A command that fills the disk outside a checkpoint (a log, summary.json, prepared data):
    `error: ...` and exit status 2, naming the folder; any other OSError stays a bug's traceback."""
    from gpt.apps.common import guard

    target = tmp_path / "run" / "summary.json.tmp-1"

    def fills():
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    with pytest.raises(SystemExit) as stopped:
        guard(fills)
    err = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and "\n" not in err
    assert err.startswith(f"error: cannot write into {tmp_path / 'run'} (No space left on device)"), err
    assert "free space, then run the command again" in err

    def denied():
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError, match="Input/output"):
        guard(denied)
