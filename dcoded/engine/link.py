"""A rank's worker-to-worker connections and mailbox (``transport=direct``).

One Dask comm per pair of workers, opened on first use and kept for the run (Dask's own comm
layer: its addressing, its serialisation and, with ``cluster.tls.*``, its TLS). A worker pushes a
message as ``{"op": "dcoded_push", ...}``; the receiving worker's handler files it in the run's
mailbox, where the step loop waits for exactly the messages it expects. A connection that breaks
is :class:`~dcoded.errors.PeerLost` at once; a message that does not come in time is
:class:`~dcoded.errors.PeerTimeout`; a run torn down wakes every wait
(:class:`~dcoded.errors.Aborted`). :class:`~dcoded.engine.multicast.MulticastLink` extends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import defaultdict

import numpy as np
from distributed.comm import connect
from distributed.protocol import to_serialize

from dcoded.errors import Aborted, PeerLost, PeerTimeout

#: The worker handler that receives pushed messages.
PUSH = "dcoded_push"
#: How long the first connection to a peer may take (Dask retries a refused one until then).
CONNECT_TIMEOUT_S = 10.0

#: The links of this process, by ``(run_id, rank)``: where the handler files what arrives.
_LINKS: dict[tuple[str, int], Link] = {}


class Link:
    """One rank's connections to its peers (opened on first use, kept for the run) and its
    mailbox. Sends run on the worker's event loop; the step loop waits in :meth:`take`."""

    def __init__(self, run_id: str, rank: int, peers: list[str], worker):
        """Open the mailbox of ``rank`` on ``worker`` (registering the handler there); the
        connections open on first use. ``peers``: every rank's worker address."""
        self.run_id, self.rank, self.peers = run_id, rank, peers
        self.connection_args = worker.connection_args
        self.connect_timeout = CONNECT_TIMEOUT_S
        self.loop = worker.loop.asyncio_loop
        self._cond = threading.Condition()
        self._box: dict[str, np.ndarray] = {}
        self._error: Exception | None = None
        self._comms: dict[int, object] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._inflight: list = []
        self.sent: dict[str, int] = defaultdict(int)  # kind -> bytes, drained each step
        worker.handlers[PUSH] = _on_push
        _LINKS[(run_id, rank)] = self

    # ------------------------------------------------------------------ receiving
    def deliver(self, key: str, data: np.ndarray) -> None:
        """Called by the handler, on the event loop: file one message."""
        with self._cond:
            if self._error is None:
                self._box[key] = data
                self._cond.notify_all()

    def take(self, expected: dict[str, int], timeout: float) -> dict[str, np.ndarray]:
        """Wait for every message in ``expected`` (key -> sender rank) and hand them over."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                missing = [k for k in expected if k not in self._box]
                if not missing:
                    return {k: self._box.pop(k) for k in expected}
                left = deadline - time.monotonic()
                if left <= 0:
                    senders = sorted({expected[k] for k in missing})
                    raise PeerTimeout(
                        f"rank {self.rank} waited train.step_timeout_s={timeout:g}s for "
                        f"{len(missing)} message(s) from rank(s) {senders} (e.g. {missing[0]})"
                    )
                self.waiting({k: expected[k] for k in missing})
                self._cond.wait(min(left, self.poll_s))

    #: How often a waiting step wakes up to look at what is missing.
    poll_s = 1.0

    def waiting(self, missing: dict[str, int]) -> None:
        """Called (under the mailbox lock) each time a step wakes up with messages missing."""

    def repair_counts(self) -> dict[str, int]:
        """Running counts of lost-data repairs (nothing to repair on TCP)."""
        return {}

    def fail(self, error: Exception) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    # ------------------------------------------------------------------ sending
    def send(self, messages: list[tuple[int, str, str, np.ndarray]]) -> None:
        """Push ``(rank, key, kind, array)`` messages without waiting; the sends to one peer
        go in order on its connection, those to different peers at once."""
        for _, _, kind, data in messages:
            self.sent[kind] += data.nbytes
        future = asyncio.run_coroutine_threadsafe(self._send_all(messages), self.loop)
        future.add_done_callback(self._sent)
        self._inflight.append(future)

    def flush(self, timeout: float) -> None:
        """Wait until every message pushed so far has left (raises what a send raised)."""
        inflight, self._inflight = self._inflight, []
        for future in inflight:
            try:
                future.result(timeout)
            except TimeoutError:
                raise PeerTimeout(
                    f"rank {self.rank} could not hand its messages to the network within "
                    f"train.step_timeout_s={timeout:g}s"
                ) from None
        with self._cond:
            if self._error is not None:
                raise self._error

    def drain_sent(self) -> dict[str, int]:
        sent, self.sent = dict(self.sent), defaultdict(int)
        return sent

    def _sent(self, future) -> None:
        if future.cancelled():
            self.fail(Aborted(f"rank {self.rank}: a send was cancelled"))
        elif future.exception() is not None:
            self.fail(future.exception())

    async def _send_all(self, messages) -> None:
        await asyncio.gather(*(self._send(*m) for m in messages))

    async def _send(self, dest: int, key: str, kind: str, data: np.ndarray, op=PUSH) -> None:
        lock = self._locks.setdefault(dest, asyncio.Lock())
        async with lock:
            address = self.peers[dest]
            try:
                comm = self._comms.get(dest)
                if comm is not None and comm.closed():  # it was open: the peer went away
                    raise OSError("its connection closed")
                if comm is None:
                    comm = await connect(
                        address, timeout=self.connect_timeout, **self.connection_args
                    )
                    comm.name = f"dcoded {self.run_id} rank {self.rank} -> {dest}"
                    self._comms[dest] = comm
                msg = {
                    "op": op,
                    "reply": False,
                    "run": self.run_id,
                    "rank": dest,
                    "src": self.rank,
                    "key": key,
                    "data": to_serialize(data),
                }
                await comm.write(msg, on_error="raise")
            except (OSError, asyncio.TimeoutError) as e:
                raise PeerLost(
                    f"rank {dest} ({address}) was lost: rank {self.rank} could not send to it "
                    f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'closed'})"
                ) from None

    def close(self, reason: str) -> None:
        """Wake the step loop (it raises :class:`Aborted`) and close the connections."""
        _LINKS.pop((self.run_id, self.rank), None)
        self.fail(Aborted(f"rank {self.rank}: {reason}"))
        if not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(self._close_comms(), self.loop)

    async def _close_comms(self) -> None:
        comms, self._comms = list(self._comms.values()), {}
        for comm in comms:
            with contextlib.suppress(Exception):
                await comm.close()


def _on_push(run=None, rank=None, src=None, key=None, data=None) -> None:
    """The worker handler ``dcoded_push`` (on the event loop): file the message for its
    rank, or drop it when the run is gone from this worker."""
    link = _LINKS.get((run, rank))
    if link is not None:
        link.deliver(key, data)
