"""The multicast transport's repair rules, without a network: when a sender re-sends, when it
sends a marker instead, and why a receiver says it got a datagram again."""

from __future__ import annotations

import queue
import threading

import numpy as np

from dcoded.engine import multicast
from dcoded.engine.multicast import MARKER, REPAIR, MulticastLink


def _link(rank=0):
    """A MulticastLink's repair state, no sockets or threads."""
    link = object.__new__(MulticastLink)
    link.rank, link.tag, link.ips = rank, b"tagx", ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    link.paces = {"shuffle": 1e6, "seg": 1e6}
    link.repaired = link.asks_early = 0
    link.again = dict.fromkeys(multicast.CAUSES, 0)
    link._cond = threading.Condition()
    link._asked, link._dropped, link._kept, link._transmitted = {}, set(), {}, {}
    link._outbox = queue.Queue()
    return link


def _head(datagram):
    return multicast._HEAD.unpack_from(bytes(datagram))


def test_sequence_numbers_order_across_the_wrap():
    assert multicast._before(5, 6) and not multicast._before(6, 5)
    assert not multicast._before(7, 7)
    assert multicast._before(0xFFFFFFFF, 0) and not multicast._before(0, 0xFFFFFFFF)


def test_a_sender_re_sends_only_what_the_receiver_had_later_datagrams_after():
    link = _link()
    key = "3/pkt/(0, 1, 2)/0"
    datagrams = multicast._fragments(link.tag, 0, key, np.arange(1000, dtype="<f4"))
    assert len(datagrams) == 3
    link._kept[key] = (datagrams, 3)
    # not yet on the network: nothing, not even a marker (the data itself will come)
    link.repair(key, np.array([2]), requester=1, heard=10)
    assert link._outbox.empty() and link.asks_early == 1
    link._transmitted[key] = 40  # its last datagram had sequence number 40
    # the receiver had up to 39 from us: the tail may be on its way, so a marker follows it
    link.repair(key, np.array([2]), requester=1, heard=39)
    _, where, (marker,), _ = link._outbox.get_nowait()
    assert where == "10.0.0.2" and _head(marker)[-1] == MARKER and link.repaired == 0
    link.repair(key, np.array([2]), requester=1, heard=-1)  # had nothing from us yet
    assert _head(link._outbox.get_nowait()[2][0])[-1] == MARKER
    # it had 41: datagram 2 was lost for sure, and goes again (flagged), alone
    link.repair(key, np.array([2]), requester=2, heard=41)
    _, where, again, _ = link._outbox.get_nowait()
    assert where == "10.0.0.3" and link.repaired == 1 and link.asks_early == 3
    assert _head(again[0])[2] == 2 and _head(again[0])[-1] == REPAIR | 0
    assert bytes(again[0])[multicast._HEAD.size :] == bytes(datagrams[2])[multicast._HEAD.size :]
    link.repair(key, np.zeros(0, np.int64), requester=2, heard=41)  # lacks it all
    assert len(link._outbox.get_nowait()[2]) == 3 and link.repaired == 4


def test_a_receiver_says_why_it_got_a_datagram_again():
    link = _link()
    key = "1/seg/0"
    link._asked[key] = {"seen": {0}, "first": set()}
    link._dropped.add((key, 1))
    link._count_again(key, 1, REPAIR)  # the test dropped the first copy
    link._count_again(key, 0, REPAIR)  # it had come: only late
    link._count_again(key, 2, REPAIR)  # never came so far: lost...
    assert link.again == {"injected": 1, "lost": 1, "late": 1}
    link._count_again(key, 2, 0)  # ...until the original came after all: late
    assert link.again == {"injected": 1, "lost": 0, "late": 2}
    link._count_again(key, 3, REPAIR)
    link._count_again(key, 3, REPAIR)  # a second copy of a repair already here
    assert link.again == {"injected": 1, "lost": 1, "late": 3}


class _Socket:
    """A receiving socket that hands out these datagrams, then ends the receiver's loop."""

    def __init__(self, link, datagrams):
        self.link, self.datagrams = link, list(datagrams)

    def recv(self, n):
        if not self.datagrams:
            self.link._open = False
            raise TimeoutError
        return self.datagrams.pop(0)


def test_short_forged_and_inconsistent_datagrams_are_dropped_and_counted():
    """A datagram under 15 bytes made ``unpack_from`` raise and killed the receiver thread
    (the run then waited out its step timeout); a forged count near 2³² would have made the
    repair path build a list that long. Each is dropped, counted, and what follows is filed."""
    link = _link(rank=1)
    link.malformed, link.asks, link.rng, link.drop, link._open = 0, 0, None, 0.0, True
    link._heard, link._partial, link._box, link._done = {}, {}, {}, []
    delivered = []
    link.deliver = lambda key, values: delivered.append((key, values.tolist()))
    head = multicast._HEAD.pack
    good = head(b"tagx", 1, 0, 1, 3, 0, 0) + b"k/1" + np.float32([2.5]).tobytes()
    link._rx = _Socket(
        link,
        [
            b"\x01" * 9,  # too short for the header
            head(b"tagx", 1, 0, 2**32 - 1, 3, 0, 0) + b"k/1",  # a forged count
            head(b"tagx", 1, 5, 2, 3, 0, 0) + b"k/1",  # an index past its count
            head(b"tagx", 1, 0, 1, 200, 0, 0) + b"k/1",  # a key longer than the datagram
            head(b"tagx", 1, 0, 1, 3, 0, 7) + b"k/1",  # no such dtype
            head(b"tagx", 1, 0, 1, 2, 0, 0) + b"\xff\xfe",  # a key that is not text
            head(b"othr", 1, 0, 1, 3, 0, 0) + b"k/1",  # another run's: ignored, not counted
            good,
        ],
    )
    link._receive()
    assert link.malformed == 6 and delivered == [("k/1", [2.5])]
    assert link.repair_counts()["malformed"] == 6
