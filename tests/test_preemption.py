"""gpt/preemption.py: how a signal ends what is running. Run: pytest tests/test_preemption.py"""

from __future__ import annotations


def test_a_forked_child_ends_on_sigterm_instead_of_stopping_cleanly():
    """Data-preparation workers are forked while the trainer's handler is installed; the pool ends
    them with SIGTERM. Raising the clean-stop exception in them hung the pool (a 131 MB corpus
    never finished preparing): in any process but the one that installed it, the handler lets the
    signal end the process."""
    import os
    import signal
    import time

    from gpt.preemption import StopRequest

    with StopRequest(log=lambda *a: None):
        pid = os.fork()
        if pid == 0:
            try:
                time.sleep(30)
            finally:
                os._exit(7)  # reached only if the signal did not end the child
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
