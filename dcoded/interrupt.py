"""Stopping a run from outside: Ctrl-C, and SIGTERM (what ``timeout``, Slurm and Kubernetes
send) treated the same way, so the run writes what it measured before it ends."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal; the message says what it kept and where.

    ``signum`` is the signal (``SIGINT`` for Ctrl-C); a process that ends on it exits with
    ``128 + signum``, as a shell reports a process killed by it.
    """

    def __init__(self, message: str = "", signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Interrupted("stopped by SIGTERM", signal.SIGTERM)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within this block SIGTERM raises :class:`Interrupted` in the main thread, as Ctrl-C
    raises ``KeyboardInterrupt``. Where the main thread is not ours or SIGTERM already has a
    handler (an outer block, the emulated network's, the caller's own), nothing changes."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Within this block Ctrl-C and SIGTERM are held, and delivered again (to the handlers
    they had) when it ends: for what must not be cut in half, such as starting a cluster that
    the code after the block knows how to close. Outside the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {s: signal.signal(s, lambda n, f: held.append(n)) for s in _STOPPING}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            os.kill(os.getpid(), held[0])


_STOPPING = (signal.SIGINT, signal.SIGTERM)
