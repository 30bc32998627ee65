"""The direct transport's links on their own: messages arrive bit for bit over Dask comms (TLS
included), a missing message times out naming its sender, tearing a run down wakes a waiting
step at once, and a dead peer is a clear error."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster, get_worker
from distributed.security import Security

from dcoded.engine.link import Link
from dcoded.errors import Aborted, PeerLost, PeerTimeout

RUN = "dctestlink"


def _open(rank: int, peers: list[str]) -> str:
    Link(RUN, rank, peers, get_worker())
    return get_worker().address


def _exchange(rank: int, peers: list[str], n: int, timeout: float) -> dict:
    """Send ``n`` values to every other rank, then take what they sent this rank."""
    from dcoded.engine.link import _LINKS

    link = _LINKS[(RUN, rank)]
    values = np.arange(n, dtype=np.float32) + rank
    values[0] = np.float32("-0.0") if rank == 0 else np.float32("nan")
    link.send([(j, f"0/x/{rank}", "x", values) for j in range(len(peers)) if j != rank])
    got = link.take({f"0/x/{j}": j for j in range(len(peers)) if j != rank}, timeout)
    link.flush(timeout)
    kinds = {type(c).__name__ for c in link._comms.values()}
    return {"got": got, "kinds": kinds, "sent": link.drain_sent()}


def _close(rank: int) -> None:
    from dcoded.engine.link import _LINKS

    _LINKS[(RUN, rank)].close("test over")


@pytest.fixture(params=["tcp", "tls"])
def cluster(request):
    kwargs = {"protocol": "tcp://"}
    if request.param == "tls":
        kwargs = {"protocol": "tls://", "security": Security.temporary()}
    with (
        LocalCluster(
            n_workers=3,
            threads_per_worker=1,
            processes=False,
            host="127.0.0.1",
            dashboard_address=None,
            **kwargs,
        ) as c,
        Client(c, security=kwargs.get("security")) as client,
    ):
        yield request.param, client


def test_messages_arrive_bit_for_bit_over_the_workers_comms(cluster):
    protocol, client = cluster
    peers = sorted(client.scheduler_info()["workers"])
    assert all(p.startswith(f"{protocol}://") for p in peers)
    for rank, address in enumerate(peers):
        assert client.submit(_open, rank, peers, workers=[address]).result() == address
    futures = [
        client.submit(_exchange, rank, peers, 1000, 30, workers=[a], pure=False)
        for rank, a in enumerate(peers)
    ]
    results = client.gather(futures)
    for rank, out in enumerate(results):
        for j in range(3):
            if j == rank:
                continue
            expected = np.arange(1000, dtype=np.float32) + j
            expected[0] = np.float32("-0.0") if j == 0 else np.float32("nan")
            got = out["got"][f"0/x/{j}"]
            assert got.tobytes() == expected.tobytes()
        # one connection per peer, of the cluster's own kind (TLS where the cluster is TLS)
        assert out["kinds"] == {"TLS" if protocol == "tls" else "TCP"}
        assert out["sent"] == {"x": 2 * 1000 * 4}
    for rank, address in enumerate(peers):
        client.submit(_close, rank, workers=[address]).result()


def _open_first(rank: int, peers: list[str]) -> list[int]:
    from dcoded.engine.link import _LINKS

    link = _LINKS[(RUN, rank)]
    link.open([j for j in range(len(peers)) if j != rank], timeout=30)
    return sorted(link._comms)


def test_connections_opened_before_the_steps_are_the_ones_the_messages_take(cluster):
    """:meth:`Link.open` at setup makes every connection a step would make on its first send,
    and the sends then use them: one connection per peer still, the messages bit for bit."""
    _, client = cluster
    peers = sorted(client.scheduler_info()["workers"])
    for rank, address in enumerate(peers):
        client.submit(_open, rank, peers, workers=[address]).result()
    opened = [
        client.submit(_open_first, rank, peers, workers=[a], pure=False).result()
        for rank, a in enumerate(peers)
    ]
    assert opened == [[1, 2], [0, 2], [0, 1]]
    futures = [
        client.submit(_exchange, rank, peers, 10, 30, workers=[a], pure=False)
        for rank, a in enumerate(peers)
    ]
    for rank, out in enumerate(client.gather(futures)):
        assert sorted(out["got"]) == [f"0/x/{j}" for j in range(3) if j != rank]
        assert out["sent"] == {"x": 2 * 10 * 4} and len(out["kinds"]) == 1
    for rank, address in enumerate(peers):
        client.submit(_close, rank, workers=[address]).result()


@pytest.mark.parametrize(
    ("K", "r", "g", "shuffle"),
    [
        (4, 2, 4, "coded"),
        (6, 1, 3, "summed"),
        (8, 2, 4, "hybrid"),
        (12, 3, 4, "pieces"),
        (8, 8, 8, "coded"),
        (16, 2, 4, "uncoded"),
    ],
)
def test_a_rank_connects_to_exactly_the_ranks_its_messages_go_to(K, r, g, shuffle):
    """The peers a rank connects to at setup, against every receiver of every message it
    sends in a step (the closed-form message list): none missing, none to spare."""
    import types

    from dcoded.coding import Placement
    from dcoded.coding.messages import algorithm_messages
    from dcoded.engine.direct import send_peers

    spec = types.SimpleNamespace(placement=Placement(K, r, g), replicated=r == K)
    phases = algorithm_messages("cdc", K, r, g, shuffle)
    for rank in range(K):
        want = {k for msgs in phases.values() for s, to, _ in msgs if s == rank for k in to}
        assert send_peers(spec, rank) == want, rank


def test_a_missing_message_times_out_naming_its_sender():
    link = _bare_link()
    t = time.monotonic()
    with pytest.raises(PeerTimeout, match=r"rank 0 waited .* from rank\(s\) \[2\]"):
        link.take({"3/seg/2": 2}, timeout=0.3)
    assert 0.3 <= time.monotonic() - t < 10  # the timeout, not a hang (10: a loaded machine)


def test_the_mailbox_files_only_keys_of_steps_and_keeps_the_first_of_each():
    """The mailbox stored any key from any sender (one without a step was never removed) and a
    later message with a key overwrote the earlier one."""
    link = _bare_link()
    link.deliver("junk", np.float32([1]))
    link.deliver("x/seg/1", np.float32([1]))
    link.deliver("3/done/x", np.float32([1]))
    link.deliver("3/seg/2", np.float32([7]))
    link.deliver("3/seg/2", np.float32([9]))  # the same key again: not filed
    assert link.look(3)[1] == {"3/seg/2"} and link.notices(3) == {}
    assert link.take({"3/seg/2": 2}, timeout=1)["3/seg/2"].tolist() == [7]
    link.begin(4)
    link.deliver("3/seg/1", np.float32([1]))  # a step over
    assert link.look(4)[1] == set()


def test_closing_wakes_a_waiting_step_at_once():
    link = _bare_link()
    errors, waiting = [], threading.Event()
    link.waiting = lambda missing: waiting.set()  # called inside take, once it waits

    def wait():
        try:
            link.take({"0/pkt/1": 1}, timeout=60)
        except Aborted as e:
            errors.append(e)

    thread = threading.Thread(target=wait)
    thread.start()
    assert waiting.wait(30)  # the step is waiting for real (not a sleep that hopes so)
    t = time.monotonic()
    link.close("the run was torn down")
    thread.join(30)
    # woken by the close, not by the 60 s timeout nor the 1 s poll's chance
    assert not thread.is_alive() and time.monotonic() - t < 10
    assert errors and "torn down" in str(errors[0])


def test_a_dead_peer_is_peer_lost():
    import asyncio

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        link = _bare_link(loop, peers=["tcp://127.0.0.1:9", "tcp://127.0.0.1:1"])
        link.connect_timeout = 1.0
        t = time.monotonic()
        link.send([(1, "0/seg/0", "seg", np.zeros(4, np.float32))])
        with pytest.raises(PeerLost, match=r"rank 1 \(tcp://127.0.0.1:1\) was lost"):
            link.take({"0/seg/1": 1}, timeout=30)
        assert time.monotonic() - t < 10
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()


def _bare_link(loop=None, peers=None) -> Link:
    """A link on a stand-in worker (no Dask worker needed for the mailbox itself)."""

    class Loop:
        asyncio_loop = loop

    class Worker:
        connection_args: dict = {}  # noqa: RUF012
        handlers: dict = {}  # noqa: RUF012

    Worker.loop = Loop()
    if loop is None:
        import asyncio

        Loop.asyncio_loop = asyncio.new_event_loop()
        Loop.asyncio_loop.close()
    return Link(RUN + "bare", 0, peers or ["a", "b", "c"], Worker())


def test_an_owner_cuts_each_reply_into_its_requests_plain_values():
    """A reply holds the plain values of the requests it answers, one after another: a term's
    slice, or a whole value (``j = -1``: the length of the owner's segment)."""
    from types import SimpleNamespace

    from dcoded.coding.placement import segment_slices
    from dcoded.engine.direct import _plain_values

    st = SimpleNamespace(local=0, segments=segment_slices(40, 4))  # owner 0: 10 values
    terms = [("g", (1, 2), 0, 10), ("g", (1, 3), 2, 5)]
    whole = ("v", (0, 1, 3), -1)
    replies = {"3/plain/2/0/0": (2, terms), "3/plain/3/0/1": (3, [whole])}
    got = {"3/plain/2/0/0": np.arange(13.0), "3/plain/3/0/1": np.arange(100.0, 110.0)}
    plain = _plain_values(st, got, replies)
    assert list(plain) == [*terms, whole]
    assert plain[terms[0]].tolist() == list(range(10))
    assert plain[terms[1]].tolist() == [10, 11, 12]
    assert plain[whole].tolist() == list(range(100, 110))


def test_a_peers_connection_holds_unacknowledged_data_for_the_step_timeout_not_30_s():
    """Dask gives every TCP connection 30 s of unacknowledged data before the kernel closes
    it; on links dropping packets by the thousand that closed a connection between two live
    ranks (K = 16, r = 3 at 25 Mbit/s: "rank 3 was lost ... its connection closed"). A link's
    own connections hold for its step timeout; a shorter one never lowers Dask's."""
    import socket
    import types

    from dcoded.engine.link import TCP_USER_TIMEOUT, unacked_for

    server = socket.create_server(("127.0.0.1", 0))
    sock = socket.create_connection(server.getsockname())
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT, 30_000)  # what Dask sets
        comm = types.SimpleNamespace(stream=types.SimpleNamespace(socket=sock))
        unacked_for(comm, 10.0)
        assert sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT) == 30_000
        unacked_for(comm, 300.0)
        assert sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT) == 300_000
        unacked_for(comm, None)
        unacked_for(types.SimpleNamespace(), 300.0)  # not a TCP comm: nothing to set
    finally:
        sock.close()
        server.close()
