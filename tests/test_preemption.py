"""gpt/runtime/preemption.py: how a signal ends what is running. Run: pytest tests/test_preemption.py"""

from __future__ import annotations


def test_a_forked_child_ends_on_sigterm_instead_of_stopping_cleanly():
    """Data-preparation workers are forked while the trainer's handler is installed; the pool ends
    them with SIGTERM. Raising the clean-stop exception in them hung the pool (a 131 MB corpus
    never finished preparing): in any process but the one that installed it, the handler lets the
    signal end the process."""
    import os
    import signal
    import time

    from gpt.runtime.preemption import StopRequest

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


def test_a_signal_while_a_distributed_command_starts_is_kept_for_the_run():
    """Under torchrun a SIGTERM may reach one rank while its command is still importing and
    composing: it must not end that rank alone. It is kept, and the run's StopRequest answers it:
    with the flag under torchrun (every rank stops at the loop's first check), with Preempted
    alone; a deferred request only flags signals that come during set-up too."""
    import os
    import signal

    import pytest

    from gpt.runtime import preemption
    from gpt.runtime.preemption import Preempted, StopRequest

    before = signal.getsignal(signal.SIGTERM)
    try:
        preemption.defer_until_the_run_listens()
        os.kill(os.getpid(), signal.SIGTERM)  # would end this process without the deferral
        with StopRequest(log=lambda *a: None, deferred=True) as stop:
            assert stop.requested and stop.reason == "SIGTERM"
            os.kill(os.getpid(), signal.SIGTERM)  # during set-up: still only the flag
        assert signal.getsignal(signal.SIGTERM) is preemption._keep  # kept again: a signal between two jobs waits
        preemption.defer_until_the_run_listens()
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(Preempted, match="SIGTERM received outside the training loop"):
            StopRequest(log=lambda *a: None).__enter__()
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, signal.default_int_handler)
