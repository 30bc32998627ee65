"""The cluster's health, asked in one way everywhere: which workers the scheduler knows, a
blocking call that must not hold its caller for ever, and a wait for the scheduler to see a
loss.

A Dask call can block past any timeout it was given: a gather of data a dead worker held, a
``client.run`` on a frozen worker, a gloo all-reduce whose peer is gone. Each is run here in a
daemon thread of its own, and the caller keeps watching (the cluster, a deadline, a closing
event); the thread is left behind when the caller gives up.

>>> in_thread("adds", lambda a, b: a + b, 1, 2)
3
>>> import threading
>>> in_thread("waits", threading.Event().wait, watch=lambda: True) is GAVE_UP
True
>>> until(lambda: "found", within_s=1.0)
'found'
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: What :func:`in_thread` returns when its ``watch`` gave up on the call.
GAVE_UP = object()


def known_workers(
    client, timeout_s: float | None = None, stale_ok: bool = False
) -> dict[str, dict]:
    """Every worker the scheduler knows, by address (its info: ``nthreads``, ``last_seen``,
    ...), asked within ``timeout_s`` (a dead scheduler would otherwise hold the call for the
    client's whole connect timeout). ``stale_ok``: where the scheduler cannot be reached for
    a moment, the client's last answer instead of an error (Dask's ``scheduler_info``: what
    a recovery and a cluster's start go on with)."""
    if stale_ok:
        return dict(client.scheduler_info(n_workers=-1)["workers"])
    info = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout_s)
    return dict(info["workers"])


def address_order(address: str) -> tuple:
    """A sort key that puts Dask addresses in host order: an IPv4 host by its numbers
    (``10.0.0.2`` before ``10.0.0.10``, which a string sort puts after ``10.0.0.1``), then
    the port by its value; any other address after those, as a string.

    >>> addresses = ["tcp://10.0.0.10:80", "tcp://10.0.0.2:9000", "tcp://10.0.0.2:100"]
    >>> sorted(addresses, key=address_order)
    ['tcp://10.0.0.2:100', 'tcp://10.0.0.2:9000', 'tcp://10.0.0.10:80']
    """
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    numbers = host.split(".")
    if len(numbers) == 4 and all(n.isdigit() for n in numbers) and port.isdigit():
        return (0, tuple(int(n) for n in numbers), int(port), address)
    return (1, (), 0, address)


def in_thread(
    name: str,
    call: Callable,
    *args,
    watch: Callable[[], bool] | None = None,
    poll_s: float = 0.1,
    **kwargs,
):
    """``call(*args, **kwargs)`` in a daemon thread named ``name``: its value, or its error
    raised here. Every ``poll_s`` while it runs, ``watch()`` is asked: it may raise (the
    caller's reason to stop waiting) or return true to give up, which returns
    :data:`GAVE_UP` and leaves the thread to finish (or not) on its own."""
    box: dict = {}
    done = threading.Event()

    def target():
        try:
            box["value"] = call(*args, **kwargs)
        except BaseException as e:  # handed to the caller below
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, daemon=True, name=name).start()
    while not done.wait(poll_s):
        if watch is not None and watch():
            return GAVE_UP
    if "error" in box:
        raise box["error"]
    return box["value"]


def deadline(seconds: float) -> Callable[[], bool]:
    """A ``watch`` for :func:`in_thread` that gives up ``seconds`` from now."""
    end = time.monotonic() + seconds
    return lambda: time.monotonic() > end


def until(
    find: Callable, within_s: float, poll_s: float = 0.5, going: Callable[[], bool] | None = None
):
    """``find()`` again every ``poll_s`` until it returns something true (returned), for at
    most ``within_s`` and while ``going()`` holds (asked before each try); ``None`` if it never
    did. ``find`` may raise to stop the wait (the loss it was waiting for, told its own way).
    The scheduler notices a lost worker seconds after the worker's peers do: this is the wait
    for it."""
    end = time.monotonic() + within_s
    while going is None or going():
        found = find()
        if found:
            return found
        if time.monotonic() >= end:
            break
        time.sleep(poll_s)
    return None
