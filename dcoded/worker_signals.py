"""Preloaded into the worker processes of a local cluster: signals are the driver's to act on.

Ctrl-C in a terminal, and ``timeout``'s SIGTERM, go to the driver's whole process group, the
local workers included: they died at once, each with a traceback, and took the records of the
steps since the driver's last collection with them. The driver stops the run, collects what the
workers measured and closes them (its nanny's stop message, then SIGKILL); a worker whose
driver is gone exits by itself (distributed watches the parent).
"""

from __future__ import annotations

import signal


def dask_setup(worker) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
