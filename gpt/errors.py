"""The one exception type for mistakes a user can fix.

Entry points print a `TinyGPTError` as a single line and exit with status 2; anything else is a
bug and keeps its traceback. Messages say what is wrong *and* how to fix it.
"""


class TinyGPTError(Exception):
    """A user-facing error: bad config, missing file, unreachable data, and so on."""


class RunRefused(TinyGPTError):
    """A training run refused while it was being set up, before it changed anything."""


# What allocators say when memory runs out (PyTorch's CUDA/HIP/MPS caching allocators, its CPU
# allocator, cuBLAS and cuDNN workspaces): matched as phrases, so that a message that merely
# mentions memory is not taken for one.
_OOM_PHRASES = (
    "CUDA out of memory",
    "HIP out of memory",
    "MPS backend out of memory",
    "DefaultCPUAllocator: can't allocate memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)


def one_line(error: BaseException) -> str:
    """A user's error as it is (one line already); anything else as '<type>: <its first line>'."""
    if isinstance(error, TinyGPTError):
        return str(error)
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}".rstrip(": ")


def out_of_memory(error: BaseException) -> TinyGPTError | None:
    """A user-facing error for running out of memory (a model, batch or context too big for the
    device), else None."""
    import errno

    text = str(error)
    oom = type(error).__name__ == "OutOfMemoryError" or isinstance(error, MemoryError)
    oom = oom or (isinstance(error, OSError) and error.errno == errno.ENOMEM)
    oom = oom or (isinstance(error, RuntimeError) and any(phrase in text for phrase in _OOM_PHRASES))
    if not oom:
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return TinyGPTError(
        f"out of memory ({first[:200]}); lower train.batch_size (raise train.grad_accum_steps to keep the batch), "
        f"model.block_size or the model's size"
    )
