"""The multicast transport (``transport=multicast``): a message for several receivers is sent
once, as UDP multicast datagrams, where the network has IP multicast (``cluster=netem``, or a
LAN the user vouches for with ``transport.lan=true``).

It is the direct transport (:mod:`dcoded.engine.direct`: the same step loop, the same Dask comm
per pair of workers) with another way to move the exchange's messages: every message goes as
UDP datagrams, to the multicast group of its receiver set when it has several receivers (a
coded packet, an updated segment), to the receiver's own address when it has one. A group is
``239.X.Y.Z`` with ``Y.Z`` the bit mask of its receivers; every worker joins the groups of the
receiver sets it belongs to.

Nothing is lost: every datagram carries the message's key, its index and the count, so a
receiver knows exactly what it lacks; a step that waits asks the sender again (a negative
acknowledgement over the Dask comm), and the sender, which keeps what it sent for two steps,
sends the missing datagrams again to that receiver alone. ``transport.test_drop`` drops a
seeded fraction of the datagrams where they are received, to test exactly that.

Senders are paced (a sender thread per worker, the datagrams spread evenly in time) at
``transport.pace_mbit``, by default, per phase, the bottleneck's share for a sender when all
of the phase's senders send at once: the medium's rate over the senders on a bus, a receiver
link's rate over the most senders one receiver hears elsewhere (and an uplink's over the most
senders crossing it, on racks).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import hashlib
import queue
import socket
import struct
import threading
import time

import numpy as np

from dcoded.engine.link import _LINKS, Link
from dcoded.errors import PeerLost, PeerTimeout

#: The worker handler that receives negative acknowledgements.
NACK = "dcoded_nack"
#: UDP payload per datagram: an Ethernet frame of 1500 bytes less the IP and UDP headers.
DATAGRAM = 1472
_HEAD = struct.Struct("!4sIIHB")  # run tag, index, count, key length, dtype code
_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<u4")}
_CODES = {v: k for k, v in _DTYPES.items()}
#: How long a receiver lets a message rest before it asks for the rest again (twice as long
#: after the first ask, three times after the second...: a repair takes time to come).
REPAIR_AFTER_S = 0.05
#: How far a sender late on its pace (a thread not scheduled in time) may catch up at once.
CATCH_UP_S = 0.001


def group_address(run_id: str, receivers) -> str:
    """The multicast group of a receiver set (global ranks, K <= 16)."""
    mask = sum(1 << r for r in receivers)
    tag = int(hashlib.blake2b(run_id.encode(), digest_size=2).hexdigest(), 16)
    return f"239.{64 + tag % 64}.{mask >> 8}.{mask & 255}"


def udp_port(run_id: str) -> int:
    return 20_000 + int(hashlib.blake2b(run_id.encode(), digest_size=2).hexdigest(), 16) % 20_000


class MulticastLink(Link):
    """A :class:`~dcoded.engine.link.Link` whose messages travel as paced UDP datagrams."""

    poll_s = REPAIR_AFTER_S

    def __init__(self, run_id, rank, peers, worker, groups, pace_mbit, drop=0.0, seed=0):
        super().__init__(run_id, rank, peers, worker)
        worker.handlers[NACK] = _on_nack
        self.ips = [_host(a) for a in peers]
        self.tag = hashlib.blake2b(run_id.encode(), digest_size=4).digest()
        self.port = udp_port(run_id)
        self.paces = {k: v * 1e6 / 8 for k, v in pace_mbit.items()}  # bytes/s by phase
        self.rng = np.random.default_rng([seed, rank]) if drop else None
        self.drop = drop
        self.repaired = 0  # datagrams sent again at a receiver's request
        self._kept: dict[str, tuple[list[bytes], int]] = {}  # key -> datagrams, step
        self._partial: dict[str, dict] = {}  # key -> {"parts", "count", "seen", "asked"}
        self._outbox: queue.Queue = queue.Queue()
        self._done: collections.deque = collections.deque(maxlen=4096)  # keys filed
        self._transmitted: set[str] = set()  # keys whose every datagram has left
        self._rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:  # root may go past net.core.rmem_max
            self._rx.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
        except OSError:
            self._rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self._rx.bind(("", self.port))
        me = socket.inet_aton(self.ips[rank])
        for members in groups:
            group = socket.inet_aton(group_address(run_id, members))
            self._rx.setsockopt(
                socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, struct.pack("4s4s", group, me)
            )
        self._rx.settimeout(0.2)
        self._tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        self._tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
        self._tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, me)
        self._open = True
        for target in (self._receive, self._transmit):
            threading.Thread(target=target, daemon=True, name=f"dcoded udp {rank}").start()

    # ------------------------------------------------------------------ sending
    def send(self, messages) -> None:
        """Queue each message once for all its receivers (grouped by key)."""
        by_key: dict[str, tuple[str, np.ndarray, list[int]]] = {}
        for dest, key, kind, data in messages:
            by_key.setdefault(key, (kind, data, []))[2].append(dest)
        for key, (kind, data, dests) in by_key.items():
            self.sent[kind] += data.nbytes  # once: what the medium carries
            datagrams = _fragments(self.tag, key, data)
            self._kept[key] = (datagrams, _step_of(key))
            where = self.ips[dests[0]] if len(dests) == 1 else group_address(self.run_id, dests)
            self._outbox.put((key, where, datagrams, self._pace(kind)))
        self._forget_old()

    def _pace(self, kind: str) -> float:
        return self.paces["seg" if kind == "seg" else "shuffle"]

    def flush(self, timeout: float) -> None:
        """Wait until the sender thread has put every queued datagram on the network."""
        deadline = time.monotonic() + timeout
        while self._outbox.unfinished_tasks:
            if time.monotonic() > deadline:
                raise PeerTimeout(
                    f"rank {self.rank} could not send its datagrams within {timeout:g}s"
                )
            time.sleep(0.001)
        super().flush(timeout)

    def _transmit(self) -> None:
        """The sender thread: datagrams spread evenly in time at the pace (no more than
        ``CATCH_UP_S`` of credit is saved up, so a burst never outruns the medium)."""
        due = time.monotonic()
        while self._open:
            try:
                key, where, datagrams, pace = self._outbox.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                for datagram in datagrams:
                    now = time.monotonic()
                    due = max(due, now - CATCH_UP_S)
                    if due - now > 0.001:
                        time.sleep(due - now)
                    try:
                        self._tx.sendto(datagram, (where, self.port))
                    except OSError as e:
                        if e.errno not in (errno.ENOBUFS, errno.EAGAIN):
                            raise
                        # a full queue dropped it: a receiver will ask again
                    due += len(datagram) / pace
                self._transmitted.add(key)
            except OSError as e:
                self.fail(PeerLost(f"rank {self.rank} could not send datagrams: {e}"))
            finally:
                self._outbox.task_done()

    def repair(self, key: str, missing: np.ndarray, requester: int) -> None:
        """A receiver lacks these datagrams of ``key`` (all if ``missing`` is empty)."""
        kept = self._kept.get(key)
        if kept is None or key not in self._transmitted:  # still on its way, or long gone
            return
        datagrams = kept[0]
        again = [datagrams[i] for i in missing] if len(missing) else datagrams
        self.repaired += len(again)
        self._outbox.put((key, self.ips[requester], again, self._pace("shuffle")))

    def _forget_old(self) -> None:
        newest = max((step for _, step in self._kept.values()), default=0)
        for key in [k for k, (_, step) in self._kept.items() if step < newest - 1]:
            del self._kept[key]
            self._transmitted.discard(key)

    # ------------------------------------------------------------------ receiving
    def _receive(self) -> None:
        """The receiver thread: reassemble messages and file the complete ones."""
        while self._open:
            try:
                datagram = self._rx.recv(65_536)
            except TimeoutError:
                continue
            except OSError:
                return
            if self.rng is not None and self.rng.random() < self.drop:
                continue  # the test's seeded loss
            tag, index, count, n_key, code = _HEAD.unpack_from(datagram)
            if tag != self.tag:
                continue
            start = _HEAD.size + n_key
            key = datagram[_HEAD.size : start].decode()
            with self._cond:
                entry = self._partial.get(key)
                if entry is None:
                    if key in self._box or key in self._done:
                        continue  # a repair of what is complete already
                    entry = self._partial[key] = {"parts": {}, "count": count, "asked": 0.0}
                entry["count"] = count
                entry["parts"][index] = datagram[start:]
                entry["seen"] = time.monotonic()
                if len(entry["parts"]) < count:
                    continue
                del self._partial[key]
                self._done.append(key)
                payload = b"".join(entry["parts"][i] for i in range(count))
            self.deliver(key, np.frombuffer(payload, dtype=_DTYPES[code]))

    def waiting(self, missing: dict[str, int]) -> None:
        """Ask each sender again for what has rested too long (called under the lock)."""
        now = time.monotonic()
        for key, sender in missing.items():
            entry = self._partial.get(key)
            if entry is None:
                entry = self._partial[key] = {"parts": {}, "count": None, "asked": now}
                entry["seen"] = now
                continue
            tries = entry.get("tries", 0)
            if now - max(entry["seen"], entry["asked"]) < REPAIR_AFTER_S * (1 + tries):
                continue
            entry["asked"], entry["tries"] = now, tries + (entry["count"] is not None)
            have = entry["parts"]
            lacking = (
                np.array([i for i in range(entry["count"]) if i not in have], np.int32)
                if entry["count"]
                else np.zeros(0, np.int32)
            )
            future = asyncio.run_coroutine_threadsafe(
                self._send(sender, key, "nack", lacking, op=NACK), self.loop
            )
            future.add_done_callback(self._sent)

    def close(self, reason: str) -> None:
        self._open = False
        super().close(reason)
        for s in (self._rx, self._tx):
            try:
                s.close()
            except OSError:
                pass


def _on_nack(run=None, rank=None, src=None, key=None, data=None) -> None:
    """The worker handler ``dcoded_nack``: ``src`` lacks datagrams of ``key`` from ``rank``."""
    found = _LINKS.get((run, rank))
    if isinstance(found, MulticastLink):
        found.repair(key, np.asarray(data), src)


def _fragments(tag: bytes, key: str, data: np.ndarray) -> list[bytes]:
    raw = np.ascontiguousarray(data)
    code = _CODES[np.dtype(raw.dtype)]
    body = raw.view(np.uint8).tobytes()
    k = key.encode()
    room = DATAGRAM - _HEAD.size - len(k)
    count = max(1, -(-len(body) // room))
    return [
        _HEAD.pack(tag, i, count, len(k), code) + k + body[i * room : (i + 1) * room]
        for i in range(count)
    ]


def _step_of(key: str) -> int:
    return int(key.split("/", 1)[0])


def _host(address: str) -> str:
    return address.split("://", 1)[-1].rsplit(":", 1)[0]
