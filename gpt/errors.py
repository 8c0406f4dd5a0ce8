"""The one exception type for mistakes a user can fix.

Entry points print a `TinyGPTError` as a single line and exit with status 2; anything else is a
bug and keeps its traceback. Messages say what is wrong *and* how to fix it.
"""


class TinyGPTError(Exception):
    """A user-facing error: bad config, missing file, unreachable data, and so on."""


class RunRefused(TinyGPTError):
    """A training run refused while it was being set up, before it changed anything."""


def out_of_memory(error: BaseException) -> TinyGPTError | None:
    """A user-facing error for running out of memory (a model, batch or context too big for the
    device: a CUDA or MPS out-of-memory error, or the CPU allocator's), else None."""
    text = str(error)
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    oom = type(error).__name__ == "OutOfMemoryError" or isinstance(error, MemoryError)
    oom = oom or (isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text))
    if not oom:
        return None
    return TinyGPTError(
        f"out of memory ({first[:200]}); lower train.batch_size (raise train.grad_accum_steps to keep the batch), "
        f"model.block_size or the model's size"
    )
