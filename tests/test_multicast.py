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
    link.repaired = link.asks_early = link.datagrams = 0
    link.again = dict.fromkeys(multicast.CAUSES, 0)
    link._cond = threading.Condition()
    link._asked, link._dropped, link._kept, link._transmitted = {}, set(), {}, {}
    link._outbox, link._marker_owed, link._send_lock = queue.Queue(), {}, threading.Lock()
    return link


def _next(link):
    """The one item of the next batch queued for the sender thread."""
    (item,) = link._outbox.get_nowait()
    return item


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
    # queued, not yet on the network: a marker goes behind it (the queue keeps the order)
    link.repair(key, np.array([2]), requester=1, heard=10)
    _, where, (marker,), _ = _next(link)
    assert where == "10.0.0.2" and _head(marker)[-1] == MARKER and link.asks_early == 1
    link._transmitted[key, None] = 40  # its last datagram had sequence number 40
    # the receiver had up to 39 from us: the tail may be on its way, so a marker follows it
    link.repair(key, np.array([2]), requester=1, heard=39)
    _, where, (marker,), _ = _next(link)
    assert where == "10.0.0.2" and _head(marker)[-1] == MARKER and link.repaired == 0
    link.repair(key, np.array([2]), requester=1, heard=-1)  # had nothing from us yet
    assert _head(_next(link)[2][0])[-1] == MARKER
    # it had 41: datagram 2 was lost for sure, and goes again (flagged), alone
    link.repair(key, np.array([2]), requester=2, heard=41)
    _, where, again, _ = _next(link)
    assert where == "10.0.0.3" and link.repaired == 1 and link.asks_early == 3
    assert _head(again[0])[2] == 2 and _head(again[0])[-1] == REPAIR | 0
    assert bytes(again[0])[multicast._HEAD.size :] == bytes(datagrams[2])[multicast._HEAD.size :]
    link.repair(key, np.zeros(0, np.int64), requester=2, heard=41)  # lacks it all
    assert len(_next(link)[2]) == 3 and link.repaired == 4


def test_an_ask_for_a_message_not_made_yet_is_answered_by_a_marker_behind_it():
    """A receiver that asked before the sender had made the message is owed a marker, queued
    right behind the message: it asks again the moment the marker comes (and not every few
    milliseconds until then, which on a slow bus was an ask storm that overran it)."""
    link = _link()
    link.sent, link.run_id = {"pkt": 0}, "run"
    key = "3/pkt/(0, 1, 2)/0"
    link.repair(key, np.array([], np.int64), requester=2, heard=-1)
    assert link._outbox.empty() and link.asks_early == 1 and link._marker_owed == {key: {2}}
    link.send([(1, key, "pkt", np.arange(1000, dtype="<f4"))])
    (_, where, datagrams, _), (_, where_marker, (marker,), _) = link._outbox.get_nowait()
    assert where == "10.0.0.2" and len(datagrams) == 3 and where_marker == "10.0.0.3"
    assert _head(marker)[-1] == MARKER and link._marker_owed == {}
    # an ask for a step long over owes nothing (its message will never be made)
    link._kept["9/pkt/x"] = ([], 9)
    link.repair("5/pkt/x", np.array([], np.int64), requester=1, heard=-1)
    assert link._marker_owed == {}


def test_what_went_to_one_receiver_does_not_make_another_wait():
    """Two receivers lacking the same message's tail: the marker and the repair one of them
    got moved on no number the other waits for. (When any datagram of the key counted, each
    marker made the other receiver's next ask look early: they were marked in turn, for ever,
    and 4 workers on a 5 Mbit/s bus sent 100,000 asks in 4 steps.)"""
    link = _link()
    key = "3/pkt/(0, 1, 2)/0"
    link._kept[key] = (multicast._fragments(link.tag, 0, key, np.arange(10, dtype="<f4")), 3)
    link._transmitted[key, None] = 40
    link._transmitted[key, 2] = 50  # a repair to rank 2 alone, sent as 50
    link.repair(key, np.array([0]), requester=1, heard=45)  # rank 1 had 45 > 40: lost
    assert _next(link)[0] == (key, 1) and link.asks_early == 0
    link.repair(key, np.array([0]), requester=2, heard=45)  # rank 2's repair may be on its way
    assert _next(link)[0] is None and link.asks_early == 1  # a marker, untracked
    link.repair(key, np.array([0]), requester=2, heard=51)
    assert _next(link)[0] == (key, 2) and link.repaired == 2


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


def _sealed(link, *fields, key=b"2/1", data=b"", mac=None):
    """A datagram of ``link``'s run with a code under ``mac`` (the link's, by default)."""
    d = bytearray(multicast._HEAD.pack(*fields) + key + data + bytes(multicast.MAC))
    multicast.seal(d, mac or link.mac)
    return bytes(d)


def test_short_forged_stale_and_inconsistent_datagrams_are_dropped_and_counted():
    """A datagram under 15 bytes made ``unpack_from`` raise and killed the receiver thread
    (the run then waited out its step timeout); a forged count near 2³² would have made the
    repair path build a list that long; a datagram with the run's tag, seen once on the wire,
    let anyone change a gradient. Each is dropped, counted by why, and what follows is filed;
    only the datagram whose code holds under the run's key is."""
    link = _link(rank=1)
    link.mac = multicast.authenticator(bytes(range(multicast.KEY)))
    other = multicast.authenticator(bytes(multicast.KEY))  # another key: an outsider's
    link.dropped, link.asks, link.rng, link.drop, link._open = {}, 0, None, 0.0, True
    link.dropped = dict.fromkeys(multicast.DROPS, 0)
    link._heard, link._partial, link._box, link._done, link._floor = {}, {}, {}, [], 1
    delivered = []
    link.deliver = lambda key, values: delivered.append((key, values.tolist()))
    value = np.float32([2.5]).tobytes()
    good = _sealed(link, b"tagx", 1, 0, 1, 3, 0, 0, data=value)
    changed = good[:-20] + np.float32([9.0]).tobytes() + good[-16:]  # the data altered
    link._rx = _Socket(
        link,
        [
            b"\x01" * 9,  # too short for the header
            good[:-1],  # one byte short: its code no longer holds
            changed,  # forged: its code no longer holds
            _sealed(link, b"tagx", 1, 0, 1, 3, 0, 0, data=np.float32([9.0]).tobytes(), mac=other),
            _sealed(link, b"othr", 1, 0, 1, 3, 0, 0, data=value),  # another run's tag
            _sealed(link, b"tagx", 1, 0, 1, 3, 0, 0, key=b"0/1", data=value),  # a step over
            _sealed(link, b"tagx", 1, 0, 2**32 - 1, 3, 0, 0),  # a count near 2^32
            _sealed(link, b"tagx", 1, 5, 2, 3, 0, 0),  # an index past its count
            _sealed(link, b"tagx", 1, 0, 1, 200, 0, 0),  # a key longer than the datagram
            _sealed(link, b"tagx", 1, 0, 1, 3, 0, 7),  # no such dtype
            _sealed(link, b"tagx", 1, 0, 1, 2, 0, 0, key=b"\xff\xfe"),  # a key not text
            _sealed(link, b"tagx", 1, 0, 1, 1, 0, 0, key=b"x"),  # a key without a step
            good,
            good,  # a replay of what is complete already: never filed twice
        ],
    )
    link._receive()
    assert delivered == [("2/1", [2.5])]
    want = {"malformed": 7, "forged": 3, "foreign": 1, "stale": 1}
    assert link.dropped == want
    assert {k: link.repair_counts()[k] for k in want} == want


def test_every_datagram_a_sender_puts_on_the_wire_carries_a_code_that_holds():
    """Data, repairs and markers alike: the code is written after the sequence number, the
    last thing stamped, so a repair (its flag set) still holds, and one flipped bit does not."""
    link = _link()
    link.mac = multicast.authenticator(bytes(multicast.KEY))
    link.port, link._open, link._seq, link.run_id = 9, True, 0, "run"
    sent = []

    class Tx:
        def sendto(self, datagram, where):
            sent.append(bytes(datagram))
            if len(sent) == 3:
                link._open = False

    link._tx = Tx()
    datagrams = multicast._fragments(link.tag, 0, "1/seg/0", np.arange(600, dtype="<f4"))
    link._outbox.put([(("1/seg/0", None), "10.0.0.2", datagrams, 1e9)])
    link._outbox.put([(("1/seg/0", 1), "10.0.0.2", [multicast._as_repair(datagrams[0])], 1e9)])
    link._transmit()
    assert len(sent) == 3 and _head(sent[2])[-1] & REPAIR
    for i, d in enumerate(sent):
        assert multicast._parse(d, link.tag, link.mac)[:3] == (i, i % 2, 2)
        flipped = bytearray(d)
        flipped[len(d) // 2] ^= 1
        assert multicast._parse(bytes(flipped), link.tag, link.mac) == "forged"


def test_a_receiving_socket_that_cannot_join_its_groups_frees_its_port_at_once():
    """An address it cannot join on fails the link's setup; the port it bound is free again
    before the error is handled, not when the failed task's traceback is collected."""
    import socket

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("", 0))
    port = probe.getsockname()[1]
    probe.close()
    try:
        multicast._receiving_socket("run", 0, port, [(0, 1)], "not an address")
    except OSError:
        again = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        again.bind(("", port))  # no SO_REUSEADDR: fails if the first socket still holds it
        again.close()
    else:
        raise AssertionError("an address that is not one was joined")


def test_queued_messages_go_out_interleaved_each_at_its_share():
    """New messages queued together go out interleaved: after any number of datagrams, each
    message has sent its share of them to within one datagram (so each receiver's link gets
    the share the pace assumes at every moment); a repair or marker keeps its place behind
    what was queued before it, and each message's last datagram carries its key."""
    sizes = [7, 1, 30, 12, 5]
    items = [((f"m{i}", None), f"g{i}", [bytes([i, j]) for j in range(n)], 1.0) for i, n in
             enumerate(sizes)]  # fmt: skip
    repair = (("m0", 2), "h2", [b"r"], 1.0)
    out = list(multicast.interleaved([*items, repair, (("late", None), "g9", [b"z"], 1.0)]))
    total = sum(sizes)
    assert [d for _, _, d, _ in out[total:]] == [b"r", b"z"]
    sent = [0] * len(sizes)
    for t, (sent_as, where, datagram, _) in enumerate(out[:total], 1):
        i = datagram[0]
        assert where == f"g{i}" and datagram[1] == sent[i]  # each message's own order
        sent[i] += 1
        assert sent_as == ((f"m{i}", None) if sent[i] == sizes[i] else None)
        for k, n in enumerate(sizes):
            assert abs(sent[k] - n * t / total) <= 1 + 1e-9, (t, k, sent)
    assert sent == sizes


def test_one_send_goes_out_interleaved_however_soon_the_sender_wakes():
    """The messages of one ``send`` are one batch: a sender thread that wakes between two of
    them (it did, and sent the first message alone, to one group at the full pace) still
    interleaves all of them."""
    link = _link()
    link.sent, link.run_id = {"pkt": 0}, "run"
    link.mac = multicast.authenticator(bytes(multicast.KEY))
    link.port, link._open, link._seq = 9, True, 0
    link._forget_old = lambda: None
    put, woke = link._outbox.put, []

    def put_and_wake(batch):  # the sender thread takes each batch the moment it is queued
        put(batch)
        woke.append(link._outbox.get_nowait())
        link._outbox.task_done()

    link._outbox.put = put_and_wake
    messages = [(d, f"3/pkt/{d}", "pkt", np.arange(700 * (d + 1), dtype="<f4")) for d in (1, 2)]
    link.send(messages)
    assert len(woke) == 1 and [item[1] for item in woke[0]] == ["10.0.0.2", "10.0.0.3"]
    order = [where for _, where, _, _ in multicast.interleaved(woke[0])]
    assert len(order) > 4 and set(order[: len(order) // 2]) == {"10.0.0.2", "10.0.0.3"}
