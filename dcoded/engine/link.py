"""A rank's worker-to-worker connections and mailbox (``transport=direct``).

One Dask comm per pair of workers, opened at setup (:meth:`Link.open`; else on first use) and
kept for the run (Dask's own comm layer: its addressing, its serialisation and, with
``cluster.tls.*``, its TLS). A worker pushes a message as ``{"op": "dcoded_push", ...}``; the
receiving worker's handler files it in the run's mailbox, where the step loop waits for exactly
the messages it expects. A connection that breaks is :class:`~dcoded.errors.PeerLost` at once; a
message that does not come in time is :class:`~dcoded.errors.PeerTimeout`; a run torn down wakes
every wait (:class:`~dcoded.errors.Aborted`). :class:`~dcoded.engine.multicast.MulticastLink`
extends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
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
#: Linux's ``TCP_USER_TIMEOUT`` option: how long sent data may go unacknowledged before the
#: kernel closes the connection (18 where ``socket`` does not name it).
TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)
#: Linux's ``SO_MAX_PACING_RATE``: the most bytes a second the kernel lets a socket send
#: (it paces the packets evenly); 47 where ``socket`` does not name it.
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)


def pace_of(kind: str, phase: str = "") -> str:
    """The pace a message goes at (``spec.pace_mbit``'s key): θ's all-gather's (``seg``) for
    a segment, or anything sent in the ``params`` phase (the cross-cluster sum's summed
    chunks go with θ's), else the shuffle's.

    >>> pace_of("seg"), pace_of("red", "params"), pace_of("red"), pace_of("backup")
    ('seg', 'seg', 'shuffle', 'shuffle')
    """
    return "seg" if phase == "params" or kind == "seg" else "shuffle"


#: The links of this process, by ``(run_id, rank)``: where the handler files what arrives.
_LINKS: dict[tuple[str, int], Link] = {}


class Link:
    """One rank's connections to its peers (opened at setup or on first use, kept for the run)
    and its mailbox. Sends run on the worker's event loop; the step loop waits in :meth:`take`."""

    def __init__(self, run_id: str, rank: int, peers: list[str], worker):
        """Open the mailbox of ``rank`` on ``worker`` (registering the handler there); the
        connections open on first use. ``peers``: every rank's worker address."""
        self.run_id, self.rank, self.peers = run_id, rank, peers
        self.connection_args = worker.connection_args
        self.connect_timeout = CONNECT_TIMEOUT_S
        #: how long what this rank sent a peer may go unacknowledged before its connection is
        #: given up (``None``: Dask's ``distributed.comm.timeouts.tcp``); the step loop sets
        #: its step timeout here
        self.unacked_timeout_s: float | None = None
        self.loop = worker.loop.asyncio_loop
        self._cond = threading.Condition()
        self._box: dict[str, np.ndarray] = {}
        self._error: Exception | None = None
        self._comms: dict[int, object] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._inflight: list = []
        self._send_lock = threading.Lock()  # a step loop and a request's answer may both send
        self.sent: dict[str, int] = defaultdict(int)  # kind -> bytes, drained each step
        # coding.stragglers: step -> {rank: (what, when it came, what it says)} of the notices
        # "done" (saying how long the map took, in microseconds) and "gave-up"
        self._notices: dict[int, dict[int, tuple[str, float, int]]] = defaultdict(dict)
        self._version = 0  # counts what was filed, so a waiter sees any change
        self._floor = -1  # messages of steps before this one are dropped on arrival
        #: ``serve(step, asker, data)``: answers a plain-value request (set by the step loop)
        self.serve = None
        #: phase (``shuffle``, ``seg``) -> peer -> bytes a second its connection is paced at
        #: (:meth:`pace`); empty: unpaced
        self.tcp_paces: dict[str, dict[int, int]] = {}
        self._paced: dict[int, int] = {}  # peer -> the pace its connection has now
        worker.handlers[PUSH] = _on_push
        _LINKS[(run_id, rank)] = self

    # ------------------------------------------------------------------ receiving
    def deliver(self, key: str, data: np.ndarray) -> None:
        """Called by the handler, on the event loop: file one message. A notice (``done``,
        ``gave-up``) is kept by step and sender; a request (``ask``) is answered at once
        (:attr:`serve`); a message of a step already over is dropped (a late worker's)."""
        step, what, src = _parts(key)
        if step is None:  # not a key of this run's steps: nothing would ever remove it
            return
        if what == "ask":
            if self.serve is not None and step >= self._floor:
                self.serve(step, src, data)
            return
        with self._cond:
            if self._error is not None or step < self._floor:
                return
            if what in NOTICES:
                said = int(data[0]) if len(data) else 0
                self._notices[step][src] = (what, time.monotonic(), said)
            elif key not in self._box:  # the first of a key is kept; a second is not filed
                self._box[key] = data
            self._version += 1
            self._cond.notify_all()

    def begin(self, step: int) -> None:
        """A new step: what is left of earlier ones (a late worker's messages) is dropped."""
        with self._cond:
            self._floor = step
            for key in [k for k in self._box if _parts(k)[0] < step]:
                del self._box[key]
            for old in [s for s in self._notices if s < step]:
                del self._notices[old]

    def look(self, step: int) -> tuple[int, set[str], dict[int, tuple[str, float, int]]]:
        """``(version, keys filed, notices of step)``, as of now."""
        with self._cond:
            if self._error is not None:
                raise self._error
            return self._version, set(self._box), dict(self._notices.get(step, {}))

    def notices(self, step: int) -> dict[int, tuple[str, float, int]]:
        with self._cond:
            return dict(self._notices.get(step, {}))

    def wait_change(self, version: int, timeout: float) -> None:
        """Wait until something is filed after ``version`` was seen, or ``timeout``."""
        with self._cond:
            if self._version == version and self._error is None:
                self._cond.wait(max(timeout, 0.0))

    def take(self, expected: dict[str, int], timeout: float) -> dict[str, np.ndarray]:
        """Wait for every message in ``expected`` (key -> sender rank) and hand them over."""
        return self._await(expected, time.monotonic() + timeout, timeout, every=True)

    def take_any(self, expected: dict[str, int], deadline: float, timeout: float):
        """Wait until at least one message in ``expected`` (key -> sender rank) has come, by
        ``deadline`` (``time.monotonic()``; ``timeout``: the setting it stands for, to name),
        and hand over every one that has."""
        return self._await(expected, deadline, timeout, every=False)

    def _await(self, expected: dict[str, int], deadline: float, timeout: float, every: bool):
        """Hand over the messages of ``expected`` that have come once every one has
        (``every``) or any one has, waiting until ``deadline``; :meth:`waiting` is told what
        is missing each time the wait wakes up empty-handed."""
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                missing = [k for k in expected if k not in self._box]
                if not missing or (not every and len(missing) < len(expected)):
                    return {k: self._box.pop(k) for k in expected if k not in missing}
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

    def nudge(self, missing: dict[str, int]) -> None:
        """:meth:`waiting` from a step loop that waits by itself (:meth:`wait_change`)."""
        with self._cond:
            self.waiting(missing)

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
    def pace(self, mbit: dict[str, dict[int, float]]) -> None:
        """Pace each connection, per phase (``shuffle``, ``seg``), at ``mbit[phase][peer]``
        Mbit/s: its share of what this rank can send while every rank sends at once
        (:func:`dcoded.topology.sender_shares`). Unpaced, the ``K - 1`` connections of a rank
        each hand a whole message to its link at once, past what its queue holds; every
        dropped packet is sent again and the exchange takes twice its bound."""
        self.tcp_paces = {
            phase: {peer: max(int(v * 1e6 / 8), 1) for peer, v in by_peer.items()}
            for phase, by_peer in mbit.items()
        }

    def _set_pace(self, dest: int, comm, phase: str) -> None:
        """Pace the connection to ``dest`` for ``phase`` (``seg`` or ``shuffle``) before a
        message of it is written; a peer without a share in the phase keeps its pace."""
        rate = self.tcp_paces.get(phase, {}).get(dest)
        if rate is None or self._paced.get(dest) == rate:
            return
        sock = getattr(getattr(comm, "stream", None), "socket", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, min(rate, 2**32 - 1))
        self._paced[dest] = rate

    def send(self, messages: list[tuple[int, str, str, np.ndarray]], phase: str = "") -> None:
        """Push ``(rank, key, kind, array)`` messages without waiting; the sends to one peer
        go in order on its connection, those to different peers at once. ``phase``: the
        exchange they go in, where it is not their kind's (a paced transport's pace)."""
        with self._send_lock:
            for _, _, kind, data in messages:
                self.sent[kind] += data.nbytes
        future = asyncio.run_coroutine_threadsafe(self._send_all(messages, phase), self.loop)
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
        with self._send_lock:
            sent, self.sent = dict(self.sent), defaultdict(int)
        return sent

    def _sent(self, future) -> None:
        if future.cancelled():
            self.fail(Aborted(f"rank {self.rank}: a send was cancelled"))
        elif future.exception() is not None:
            self.fail(future.exception())

    async def _send_all(self, messages, phase: str = "") -> None:
        await asyncio.gather(*(self._send(*m, phase=phase) for m in messages))

    def open(self, dests, timeout: float) -> None:
        """Open the connections to ``dests`` now, before a step computes. A connection's
        handshake needs the peer's event loop, which a computing rank holds up (its map or
        encode holding the GIL): at K = 32 on two cores a peer's loop stalled 8 s and a first
        connection made in step 0 timed out after 10 s, a live rank "lost"."""
        future = asyncio.run_coroutine_threadsafe(self._open_all(sorted(dests)), self.loop)
        try:
            future.result(timeout)
        except TimeoutError:
            raise PeerTimeout(
                f"rank {self.rank} could not connect to its peers within {timeout:g}s"
            ) from None

    async def _open_all(self, dests: list[int]) -> None:
        async def one(dest: int) -> None:
            async with self._locks.setdefault(dest, asyncio.Lock()):
                await self._connection(dest)

        await asyncio.gather(*(one(d) for d in dests))

    async def _send(
        self, dest: int, key: str, kind: str, data: np.ndarray, op=PUSH, phase: str = ""
    ) -> None:
        async with self._locks.setdefault(dest, asyncio.Lock()):
            comm = await self._connection(dest)
            if self.tcp_paces:
                self._set_pace(dest, comm, pace_of(kind, phase))
            msg = {
                "op": op,
                "reply": False,
                "run": self.run_id,
                "rank": dest,
                "src": self.rank,
                "key": key,
                "data": to_serialize(data),
            }
            try:
                await comm.write(msg, on_error="raise")
            except (OSError, asyncio.TimeoutError) as e:
                raise self._lost(dest, e) from None

    async def _connection(self, dest: int):
        """The connection to ``dest`` (under its lock), opened on first use and kept."""
        comm = self._comms.get(dest)
        try:
            if comm is not None and comm.closed():  # it was open: the peer went away
                raise OSError("its connection closed")
            if comm is None:
                comm = await connect(
                    self.peers[dest], timeout=self.connect_timeout, **self.connection_args
                )
                comm.name = f"dcoded {self.run_id} rank {self.rank} -> {dest}"
                unacked_for(comm, self.unacked_timeout_s)
                self._comms[dest] = comm
        except (OSError, asyncio.TimeoutError) as e:
            raise self._lost(dest, e) from None
        return comm

    def _lost(self, dest: int, e: Exception) -> PeerLost:
        return PeerLost(
            f"rank {dest} ({self.peers[dest]}) was lost: rank {self.rank} could not send to it "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'closed'})"
        )

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


#: The notices of ``coding.stragglers``: a worker's map is done, or it gave it up.
NOTICES = ("done", "gave-up")


def unacked_for(comm, seconds: float | None) -> None:
    """Let what is sent on ``comm`` go unacknowledged for up to ``seconds`` before the kernel
    closes the connection (Linux's ``TCP_USER_TIMEOUT``), where that is longer than what Dask
    set (``distributed.comm.timeouts.tcp``, 30 s). On links that drop packets by the thousand
    (16 ranks sending to each other at once at 25 Mbit/s), one segment's retransmissions backed
    off past 30 s and the kernel closed a connection between two live ranks: the run ended
    with a peer "lost". The step's own timeout is the one bound a peer is held to."""
    sock = getattr(getattr(comm, "stream", None), "socket", None)
    if seconds is None or sock is None or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):
        now = sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT)
        if int(seconds * 1000) > now:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT, int(seconds * 1000))


def _parts(key) -> tuple[int | None, str, int]:
    """``(step, what, sender)`` of a key ``step/what/sender/...`` (``what``: ``done``,
    ``gave-up``, ``ask``; the sender is -1 for every other message); the step is ``None`` for
    what is no key of a step (such a message is not filed: no step would ever take it).

    >>> _parts("7/done/2"), _parts("7/seg/1"), _parts("junk")[0], _parts("x/done/y")[0]
    ((7, 'done', 2), (7, 'seg', -1), None, None)
    """
    parts = key.split("/") if isinstance(key, str) else [""]
    what = parts[1] if len(parts) > 2 else ""
    if not parts[0].lstrip("-").isdigit():
        return None, what, -1
    if what in (*NOTICES, "ask"):
        if not parts[2].isdigit():
            return None, what, -1
        return int(parts[0]), what, int(parts[2])
    return int(parts[0]), what, -1


def _on_push(run=None, rank=None, src=None, key=None, data=None) -> None:
    """The worker handler ``dcoded_push`` (on the event loop): file the message for its
    rank, or drop it when the run is gone from this worker."""
    link = _LINKS.get((run, rank))
    if link is not None:
        link.deliver(key, data)
