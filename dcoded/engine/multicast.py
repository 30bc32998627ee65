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
receiver knows exactly what it lacks, and its sender's sequence number. A step that waits asks
the sender again (a negative acknowledgement over the Dask comm, with the highest sequence
number it has had from that sender), but never while datagrams still wait unread in its own
socket. The way between two hosts keeps the order, so the sender, which keeps what it sent for
two steps, re-sends the missing datagrams to that receiver alone only once the receiver has
had a datagram sent after them: anything else is data still on its way, and gets a small
marker behind it instead (behind the message once it is made, for an ask that came before),
whose arrival makes the receiver ask again at once; without one, each ask of a message waits
twice as long as the one before. Asks and re-sends are counted by cause (:data:`CAUSES`).
``transport.test_drop`` drops a seeded fraction of the datagrams where they are received, to
test exactly that.

Every datagram ends in a message authentication code (keyed BLAKE2b, :data:`MAC` bytes) over
all that comes before it, under a random key the driver makes for the run and hands each worker
with its setup, over the Dask comms (so over TLS where the cluster has it). A receiver files a
datagram only if its code holds: one that fails it (``forged``), is too short or inconsistent
(``malformed``), carries another run's tag (``foreign``) or belongs to a step already over
(``stale``: a late copy, or a replay) is dropped and counted, and the real one comes, or is
asked for again, as for any lost datagram. The payloads themselves travel in clear.

Senders are paced (a sender thread per worker, the datagrams spread evenly in time) at
``transport.pace_mbit``, by default, per phase, the bottleneck's share for a sender when all
of the phase's senders send at once: the medium's rate over the senders on a bus, a receiver
link's rate over the most senders one receiver hears elsewhere (and an uplink's over the most
senders crossing it, on racks). That share holds at every moment only if each sender spreads
its bytes over its receivers as it goes, so the messages a sender has queued go out
interleaved (:func:`interleaved`), not one after another.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import fcntl
import hashlib
import hmac
import queue
import socket
import struct
import termios
import threading
import time

import numpy as np

from dcoded.engine.link import _LINKS, Link, pace_of
from dcoded.errors import PeerLost, PeerTimeout

#: The worker handler that receives negative acknowledgements.
NACK = "dcoded_nack"
#: UDP payload per datagram: an Ethernet frame of 1500 bytes less the IP and UDP headers.
DATAGRAM = 1472
#: run tag, sequence number, index, count, key length, sender rank, dtype code | flags
_HEAD = struct.Struct("!4sIIIHBB")
_SEQ = struct.Struct("!I")  # the sequence number, at offset 4: stamped as a datagram leaves
_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<u4")}
_CODES = {v: k for k, v in _DTYPES.items()}
#: Set in the dtype byte of a datagram sent again (so a receiver tells a repair from a late
#: original, and counts why it asked).
REPAIR = 0x80
#: Set in the dtype byte of a datagram without data that a sender puts behind everything it
#: has sent so far: its arrival tells the receiver that whatever it still lacks was lost.
MARKER = 0x40
#: Why a receiver got a datagram again: the test dropped the first copy on purpose
#: (``injected``), the first copy never came (``lost``), or it came after all (``late``).
CAUSES = ("injected", "lost", "late")
#: How long a receiver lets a message rest before it asks for the rest again, by default
#: (``transport.repair_after_ms``; on the emulated network its queues' depth). Each further ask
#: of the message waits twice as long as the one before, up to :data:`BACKOFF` times: a repair,
#: or the marker behind data still on its way, takes time to come, and asks every few
#: milliseconds from every receiver of a slow medium overran it (and the repairs with it).
REPAIR_AFTER_S = 0.05
BACKOFF = 64
#: How far a sender late on its pace (a thread not scheduled in time) may catch up at once.
CATCH_UP_S = 0.001
#: Bytes of the message authentication code that ends every datagram, and of the run's key.
MAC, KEY = 16, 32
#: Why a receiver dropped a datagram unfiled (counted in ``summary.json``'s ``repairs``).
DROPS = ("malformed", "forged", "foreign", "stale")


def authenticator(key: bytes):
    """The keyed BLAKE2b of a run's key: ``.copy()`` it for each datagram."""
    if len(key) != KEY:
        raise ValueError(f"a multicast key is {KEY} bytes, not {len(key)}")
    return hashlib.blake2b(key=key, digest_size=MAC)


def seal(datagram: bytearray, mac) -> None:
    """Write the code of everything before the last :data:`MAC` bytes into those bytes."""
    h = mac.copy()
    h.update(memoryview(datagram)[:-MAC])
    datagram[-MAC:] = h.digest()


def authentic(datagram: bytes, mac) -> bool:
    """Whether a datagram's last :data:`MAC` bytes are the code of the rest under ``mac``.

    >>> mac = authenticator(bytes(KEY))
    >>> d = bytearray(b"payload" + bytes(MAC)); seal(d, mac)
    >>> authentic(bytes(d), mac), authentic(b"Payload" + bytes(d[7:]), mac)
    (True, False)
    """
    h = mac.copy()
    h.update(memoryview(datagram)[:-MAC])
    return hmac.compare_digest(h.digest(), datagram[-MAC:])


def group_address(run_id: str, receivers) -> str:
    """The multicast group of a receiver set (global ranks, K <= 16)."""
    mask = sum(1 << r for r in receivers)
    tag = int(hashlib.blake2b(run_id.encode(), digest_size=2).hexdigest(), 16)
    return f"239.{64 + tag % 64}.{mask >> 8}.{mask & 255}"


def udp_port(run_id: str) -> int:
    return 20_000 + int(hashlib.blake2b(run_id.encode(), digest_size=2).hexdigest(), 16) % 20_000


class MulticastLink(Link):
    """A :class:`~dcoded.engine.link.Link` whose messages travel as paced UDP datagrams."""

    def __init__(
        self,
        run_id,
        rank,
        peers,
        worker,
        groups,
        pace_mbit,
        key,
        drop=0.0,
        seed=0,
        repair_after_s=REPAIR_AFTER_S,
    ):
        super().__init__(run_id, rank, peers, worker)
        self.mac = authenticator(key)
        self.repair_after_s = self.poll_s = repair_after_s
        worker.handlers[NACK] = _on_nack
        self.ips = [_host(a) for a in peers]
        self.tag = hashlib.blake2b(run_id.encode(), digest_size=4).digest()
        self.port = udp_port(run_id)
        self.paces = {k: v * 1e6 / 8 for k, v in pace_mbit.items()}  # bytes/s by phase
        self.rng = np.random.default_rng([seed, rank]) if drop else None
        self.drop = drop
        self.repaired = 0  # datagrams sent again at a receiver's request
        self.datagrams = 0  # datagrams sent, repairs and markers included (the sender thread's)
        self.asks = 0  # negative acknowledgements this rank sent
        self.asks_early = 0  # asks it got for data not yet sent or still on its way
        self.dropped = dict.fromkeys(DROPS, 0)  # datagrams dropped unfiled, by why
        # datagrams this rank received again, by why it had asked (see CAUSES)
        self.again = dict.fromkeys(CAUSES, 0)
        self._asked: dict[str, dict] = {}  # key asked about -> {"seen", "first"} indices
        self._dropped: set[tuple[str, int]] = set()  # test_drop's victims
        self._kept: dict[str, tuple[list[bytearray], int]] = {}  # key -> datagrams, step
        self._partial: dict[str, dict] = {}  # key -> {"parts", "count", "seen", "asked"}
        self._outbox: queue.Queue = queue.Queue()
        self._done: collections.deque = collections.deque(maxlen=4096)  # keys filed
        # (key, None) -> the sequence number of the message's last datagram; (key, rank) -> that
        # of the last repair of it sent to that rank alone (markers are not data: not kept)
        self._transmitted: dict[tuple[str, int | None], int] = {}
        self._marker_owed: dict[str, set[int]] = {}  # key not made yet -> ranks that asked for it
        self._seq = 0  # the sequence number of the next datagram this rank puts on the network
        self._heard: dict[int, int] = {}  # sender -> the highest sequence number had from it
        self._rx = _receiving_socket(run_id, rank, self.port, groups, self.ips[rank])
        self._tx = _sending_socket(self.ips[rank])
        self._open = True
        for target in (self._receive, self._transmit):
            threading.Thread(target=target, daemon=True, name=f"dcoded udp {rank}").start()

    # ------------------------------------------------------------------ sending
    def send(self, messages, phase: str = "") -> None:
        """Queue each message once for all its receivers (grouped by key), at the pace of
        ``phase`` (``"params"``: the all-gather's) or else of its kind."""
        by_key: dict[str, tuple[str, np.ndarray, list[int]]] = {}
        for dest, key, kind, data in messages:
            by_key.setdefault(key, (kind, data, []))[2].append(dest)
        batch, markers = [], []
        with self._send_lock:  # the receiving thread answers requests for plain values
            for key, (kind, data, dests) in by_key.items():
                self.sent[kind] += data.nbytes  # once: what the medium carries
                datagrams = _fragments(self.tag, self.rank, key, data)
                self._kept[key] = (datagrams, _step_of(key))
                dest = self.ips[dests[0]] if len(dests) == 1 else None
                where = dest or group_address(self.run_id, dests)
                pace = self.paces[pace_of(kind, phase)]
                batch.append(((key, None), where, datagrams, pace))
                for requester in self._marker_owed.pop(key, ()):  # asked for before it was made
                    markers.append(self._marker(key, requester))
            # one batch: the sender thread interleaves all of it, however soon it wakes (a
            # marker goes behind every message of the batch, its own among them)
            self._outbox.put(batch + markers)
            self._forget_old()

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
        ``CATCH_UP_S`` of credit is saved up, so a burst never outruns the medium), the
        messages queued together interleaved (:func:`interleaved`)."""
        due = time.monotonic()
        while self._open:
            try:
                batches = [self._outbox.get(timeout=0.2)]
            except queue.Empty:
                continue
            while True:  # whatever else is queued by now goes out with it
                try:
                    batches.append(self._outbox.get_nowait())
                except queue.Empty:
                    break
            items = [item for batch in batches for item in batch]
            try:
                for sent_as, where, datagram, pace in interleaved(items):
                    _SEQ.pack_into(datagram, 4, self._seq)  # the wire's order, 2^32 a run
                    self._seq = (self._seq + 1) & 0xFFFFFFFF
                    seal(datagram, self.mac)
                    now = time.monotonic()
                    due = max(due, now - CATCH_UP_S)
                    if due - now > 0.001:
                        time.sleep(due - now)
                    try:
                        self._tx.sendto(datagram, (where, self.port))
                        self.datagrams += 1
                    except OSError as e:
                        if e.errno not in (errno.ENOBUFS, errno.EAGAIN):
                            raise
                        # a full queue dropped it: a receiver will ask again
                    due += len(datagram) / pace
                    if sent_as is not None:  # the message's last datagram
                        self._transmitted[sent_as] = (self._seq - 1) & 0xFFFFFFFF
            except OSError as e:
                self.fail(PeerLost(f"rank {self.rank} could not send datagrams: {e}"))
            finally:
                for _ in batches:
                    self._outbox.task_done()

    def repair(self, key: str, missing: np.ndarray, requester: int, heard: int) -> None:
        """A receiver lacks these datagrams of ``key`` (all if ``missing`` is empty), having
        had from this rank every datagram up to sequence number ``heard`` that came.

        The way from one host to another keeps the order (one queue after another), so what
        the receiver lacks was lost only if it has had a datagram sent after the message's
        last: then the lacking ones go again. If not, they may still be on their way: a
        marker goes behind them instead, and its arrival tells the receiver to ask again."""
        with self._send_lock:  # send() files a message and its deferred markers at once
            kept, last = self._kept.get(key), self._transmitted.get((key, None))
            mine = self._transmitted.get((key, requester))  # a repair for this receiver alone
            if last is not None and mine is not None and _before(last, mine):
                last = mine
            # (only what went to this receiver counts: a marker or a repair another receiver
            # asked for moved on no number this one waits for, or two receivers lacking the
            # same message's tail would ask and be marked in turn for ever)
            if kept is None or last is None or heard < 0 or _before(heard, last):
                # not sent yet, still queued here, maybe still on its way (or long forgotten)
                self.asks_early += 1
                if kept is not None:  # queued or sent: the marker goes behind it
                    self._mark(key, requester)
                elif _step_of(key) >= self._newest_kept() - 1:  # not made yet: once it is
                    self._marker_owed.setdefault(key, set()).add(requester)
                return
        datagrams = kept[0]
        again = [
            _as_repair(datagrams[i]) for i in (missing if len(missing) else range(len(datagrams)))
        ]
        self.repaired += len(again)
        self._outbox.put([((key, requester), self.ips[requester], again, self.paces["shuffle"])])

    def _mark(self, key: str, requester: int) -> None:
        """Queue a marker of ``key`` for ``requester`` behind all this rank has queued."""
        self._outbox.put([self._marker(key, requester)])

    def _marker(self, key: str, requester: int):
        """The outbox item of a marker of ``key`` for ``requester``."""
        marker = _HEAD.pack(self.tag, 0, 0, 0, len(key), self.rank, MARKER)
        return None, self.ips[requester], [bytearray(marker + key.encode() + bytes(MAC))], 1e9

    def _newest_kept(self) -> int:
        return max((step for _, step in self._kept.values()), default=0)

    def _forget_old(self) -> None:
        newest = self._newest_kept()
        for key in [k for k in self._marker_owed if _step_of(k) < newest - 1]:
            del self._marker_owed[key]
        for key in [k for k, (_, step) in self._kept.items() if step < newest - 1]:
            del self._kept[key]
        # a repair still queued when its message was forgotten files its key again
        for sent_as in [k for k in list(self._transmitted) if _step_of(k[0]) < newest - 1]:
            self._transmitted.pop(sent_as, None)
        with self._cond:  # what a receiver remembers of its asks, for as long
            for key in [k for k in self._asked if _step_of(k) < newest - 1]:
                del self._asked[key]
            self._dropped = {(k, i) for k, i in self._dropped if _step_of(k) >= newest - 1}

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
            dropped = self.rng is not None and self.rng.random() < self.drop  # seeded loss
            parsed = _parse(datagram, self.tag, self.mac)
            if isinstance(parsed, str):  # a datagram not to file (nor to die of)
                with self._cond:
                    self.dropped[parsed] += 1
                continue
            seq, index, count, sender, code, key, start = parsed
            with self._cond:
                if _step_of(key) < self._floor:  # a step over: a late copy, or a replay
                    self.dropped["stale"] += 1
                    continue
                if dropped:
                    self._dropped.add((key, index))
                    continue
                if sender not in self._heard or _before(self._heard[sender], seq):
                    self._heard[sender] = seq
                if code & MARKER:  # everything sent before it has come, or never will
                    entry = self._partial.get(key)
                    if entry is not None:
                        entry["marked"] = True
                        self._cond.notify_all()  # the step asks again at once
                    continue
                if key in self._asked:
                    self._count_again(key, index, code & REPAIR)
                code &= ~REPAIR
                entry = self._partial.get(key)
                if entry is None:
                    if key in self._box or key in self._done:
                        continue  # a repair of what is complete already
                    entry = self._partial[key] = {"parts": {}, "count": count, "asked": 0.0}
                entry["count"] = count
                entry["parts"][index] = datagram[start:-MAC]
                entry["seen"] = time.monotonic()
                if len(entry["parts"]) < count:
                    continue
                del self._partial[key]
                self._done.append(key)
                payload = b"".join(entry["parts"][i] for i in range(count))
            self.deliver(key, np.frombuffer(payload, dtype=_DTYPES[code]))

    def repair_counts(self) -> dict[str, int]:
        """What this rank's repairs have cost so far: the datagrams it sent in all (``sent``,
        repairs and markers included), those it sent again, asks it sent, asks it got too
        early, the datagrams it received again by cause, and those it dropped unfiled, by why
        (:data:`DROPS`)."""
        with self._cond:
            return {
                "sent": self.datagrams,
                "sent_again": self.repaired,
                "asks": self.asks,
                "asks_early": self.asks_early,
                **self.again,
                **self.dropped,
            }

    def _count_again(self, key: str, index: int, repair: int) -> None:
        """File why a datagram of a message this rank asked about came again (under the lock):
        a repair of an index already here, or whose original then comes, was only ``late``; one
        the test dropped, ``injected``; one whose original never came, ``lost``."""
        asked = self._asked[key]
        if not repair:
            if index in asked["first"]:  # the repair came first: the original was late
                asked["first"].discard(index)
                self.again["lost"] -= 1
                self.again["late"] += 1
        elif index in asked["seen"]:
            self.again["late"] += 1
        elif (key, index) in self._dropped:
            self.again["injected"] += 1
        else:
            self.again["lost"] += 1
            asked["first"].add(index)
        asked["seen"].add(index)

    def waiting(self, missing: dict[str, int]) -> None:
        """Ask each sender again for what has rested too long (called under the lock): for
        a message of which nothing came, from when the step began to wait; else from its
        last datagram; each ask of a message waits twice as long as the one before (up to
        :data:`BACKOFF` times), and a marker's arrival asks at once.
        Not while datagrams wait unread here: the receiving thread is only behind."""
        if self._unread():
            return
        now = time.monotonic()
        for key, sender in missing.items():
            entry = self._partial.get(key)
            if entry is None:
                entry = self._partial[key] = {"parts": {}, "count": None, "asked": now}
                entry["seen"] = now
                continue
            tries = entry.get("tries", 0)
            rested = now - max(entry["seen"], entry["asked"])
            wait = self.repair_after_s * min(1 << min(tries, 30), BACKOFF)
            if not entry.pop("marked", False) and rested < wait:
                continue
            entry["asked"], entry["tries"] = now, tries + 1
            have = entry["parts"]
            asked = self._asked.setdefault(key, {"seen": set(), "first": set()})
            asked["seen"].update(have)
            self.asks += 1
            lacking = [i for i in range(entry["count"]) if i not in have] if entry["count"] else []
            ask = np.array([self._heard.get(sender, -1), *lacking], np.int64)
            future = asyncio.run_coroutine_threadsafe(
                self._send(sender, key, "nack", ask, op=NACK), self.loop
            )
            future.add_done_callback(self._sent)

    def begin(self, step: int) -> None:
        """A new step: also forget the pieces of messages a late worker never finished."""
        super().begin(step)
        with self._cond:
            for key in [k for k in self._partial if _step_of(k) < step]:
                del self._partial[key]

    def _unread(self) -> int:
        """Bytes of the next datagram waiting unread in this rank's socket (0: none)."""
        try:
            raw = fcntl.ioctl(self._rx.fileno(), termios.FIONREAD, b"\0" * 4)
        except OSError:
            return 0
        return struct.unpack("i", raw)[0]

    def close(self, reason: str) -> None:
        self._open = False
        super().close(reason)
        for s in (self._rx, self._tx):
            try:
                s.close()
            except OSError:
                pass


def _receiving_socket(run_id: str, rank: int, port: int, groups, ip: str) -> socket.socket:
    """Rank ``rank``'s socket for the datagrams of run ``run_id``: bound to ``port``, a member
    of each multicast group of ``groups`` on the interface of ``ip``, its address."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:  # root may go past net.core.rmem_max
        rx.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
    except OSError:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    try:  # no SO_REUSEADDR: a port another process holds is an error, not a shared port
        rx.bind(("", port))
    except OSError as e:
        rx.close()
        raise PeerLost(
            f"rank {rank} could not take UDP port {port} for the multicast transport "
            f"({e.strerror}): another process holds it"
        ) from None
    try:  # a group it cannot join frees the port at once, not when the error is collected
        me = socket.inet_aton(ip)
        for members in groups:
            group = socket.inet_aton(group_address(run_id, members))
            membership = struct.pack("4s4s", group, me)
            rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
    except OSError:
        rx.close()
        raise
    rx.settimeout(0.2)
    return rx


def interleaved(items):
    """Each datagram of the queued ``items`` (``(sent_as, where, datagrams, pace)``) as
    ``(sent_as, where, datagram, pace)``, ``sent_as`` given with a message's last datagram
    only. A run of new messages is interleaved, each message's datagrams spread evenly over
    the run, so that at every moment a sender puts on each link the share of its bytes the
    pace assumes (one message after another, every sender sent to the same few receivers at
    once: in the order of the groups, the lowest ranks first); a repair or a marker keeps
    its place, behind all queued before it, which the receivers rely on.

    >>> items = [(("a", None), "g1", [b"a0", b"a1"], 1.0), (("b", None), "g2", [b"b0"], 1.0),
    ...          (("a", 2), "h2", [b"r0"], 1.0), (("c", None), "g3", [b"c0"], 1.0)]
    >>> [(d, s) for s, _, d, _ in interleaved(items)]  # doctest: +NORMALIZE_WHITESPACE
    [(b'a0', None), (b'b0', ('b', None)), (b'a1', ('a', None)), (b'r0', ('a', 2)),
     (b'c0', ('c', None))]
    """
    run: list = []
    for item in [*items, None]:
        if item is not None and item[0] is not None and item[0][1] is None:
            run.append(item)  # a new message: interleaved with the others of its run
            continue
        spread = sorted(
            ((i + 0.5) / len(datagrams), m, i)
            for m, (_, _, datagrams, _) in enumerate(run)
            for i in range(len(datagrams))
        )
        for _, m, i in spread:
            sent_as, where, datagrams, pace = run[m]
            yield (sent_as if i == len(datagrams) - 1 else None), where, datagrams[i], pace
        run = []
        if item is not None:
            sent_as, where, datagrams, pace = item
            for i, datagram in enumerate(datagrams):
                yield (sent_as if i == len(datagrams) - 1 else None), where, datagram, pace


def _sending_socket(ip: str) -> socket.socket:
    """The socket a rank sends its datagrams from: out of the interface of ``ip``, its
    address, to this network alone, and not looped back to itself."""
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(ip))
    return tx


def _on_nack(run=None, rank=None, src=None, key=None, data=None) -> None:
    """The worker handler ``dcoded_nack``: ``src`` lacks datagrams of ``key`` from ``rank``;
    ``data``: the highest sequence number ``src`` has had from ``rank`` (-1: none), then the
    indices it lacks (none: all)."""
    found = _LINKS.get((run, rank))
    if isinstance(found, MulticastLink):
        ask = np.asarray(data)
        found.repair(key, ask[1:], src, int(ask[0]))


def _fragments(tag: bytes, sender: int, key: str, data: np.ndarray) -> list[bytearray]:
    """The datagrams of one message (the sequence numbers are stamped, and the codes
    written, as they leave)."""
    raw = np.ascontiguousarray(data)
    code = _CODES[np.dtype(raw.dtype)]
    body = raw.view(np.uint8).tobytes()
    k = key.encode()
    room = DATAGRAM - _HEAD.size - len(k) - MAC
    count = max(1, -(-len(body) // room))
    return [
        bytearray(
            _HEAD.pack(tag, 0, i, count, len(k), sender, code)
            + k
            + body[i * room : (i + 1) * room]
            + bytes(MAC)
        )
        for i in range(count)
    ]


def _before(a: int, b: int) -> bool:
    """Sequence number ``a`` was sent before ``b`` (counting modulo 2^32)."""
    return 0 < (b - a) & 0xFFFFFFFF < 1 << 31


def _as_repair(datagram: bytearray) -> bytearray:
    again = bytearray(datagram)
    again[_HEAD.size - 1] |= REPAIR  # the dtype byte
    return again


#: The most datagrams one message may claim (a forged count near 2³² would make the repair
#: path build a list that long); a message of 2³⁰ floats needs about 3 million.
MAX_PARTS = 1 << 22


def _parse(datagram: bytes, tag: bytes, mac):
    """``(seq, index, count, sender, code, key, start)`` of an authentic datagram of this
    run (its data: ``datagram[start:-MAC]``), or why it is dropped (one of :data:`DROPS` but
    ``stale``, which needs the receiver's step): too short or inconsistent, a code that does
    not hold, another run's tag.

    >>> mac = authenticator(bytes(KEY))
    >>> d = bytearray(_HEAD.pack(b"abcd", 7, 0, 1, 3, 2, 0) + b"5/x" + bytes(4 + MAC))
    >>> seal(d, mac); d = bytes(d)
    >>> _parse(d, b"abcd", mac)[:6], _parse(d, b"wxyz", mac)
    ((7, 0, 1, 2, 0, '5/x'), 'foreign')
    >>> _parse(d[:20] + b"!" + d[21:], b"abcd", mac), _parse(b"short", b"abcd", mac)
    ('forged', 'malformed')
    """
    if len(datagram) < _HEAD.size + MAC:
        return "malformed"
    got, seq, index, count, n_key, sender, code = _HEAD.unpack_from(datagram)
    if got != tag:
        return "foreign"
    if not authentic(datagram, mac):
        return "forged"
    start = _HEAD.size + n_key
    data = not code & MARKER
    if start > len(datagram) - MAC or (data and not (index < count <= MAX_PARTS)):
        return "malformed"
    if data and code & ~REPAIR not in _DTYPES:
        return "malformed"
    try:
        key = datagram[_HEAD.size : start].decode()
        _step_of(key)
    except (UnicodeDecodeError, ValueError):
        return "malformed"
    return seq, index, count, sender, code, key, start


def _step_of(key: str) -> int:
    return int(key.split("/", 1)[0])


def _host(address: str) -> str:
    return address.split("://", 1)[-1].rsplit(":", 1)[0]
