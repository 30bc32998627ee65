"""The network's shape, read by the emulated network, the settings, the benchmark, the model
and the paper: membership, link loads, bounds and paces against counts made by hand."""

from __future__ import annotations

import itertools

import pytest

from dcoded import topology
from dcoded.coding import Placement
from dcoded.coding.messages import step_messages
from dcoded.topology import Shape


def test_each_host_knows_its_rack_and_pod_and_the_driver_sits_on_the_core():
    tree = Shape("fattree", rate_mbit=100, rack_size=2, pod_racks=2)
    assert tree.rack_of(8) == [0, 0, 1, 1, 2, 2, 3, 3, None]
    assert tree.pod_of(8) == [0, 0, 0, 0, 1, 1, 1, 1, None]
    assert (tree.n_racks(7), tree.queues_on_path()) == (4, 6)
    racks = Shape("racks", rate_mbit=100, rack_size=3, uplink_mbit=20)
    assert (racks.rack_of(5), racks.pod_of(5), racks.n_racks(5)) == ([0, 0, 0, 1, 1, None], None, 2)
    assert Shape("bus").rack_of(4) is None and Shape("bus").n_racks(4) == 0


def test_two_shapes_are_wired_alike_when_their_hosts_share_the_same_links():
    switch = Shape("switch", 100).wiring(4)
    assert Shape("switch", 40, rack_size=2, uplink_mbit=10).wiring(4) == switch
    racks = Shape("racks", 100, rack_size=2, uplink_mbit=10)
    assert racks.wiring(4) != switch
    assert racks.wiring(4) == Shape("racks", 50, rack_size=2, uplink_mbit=20).wiring(4)
    assert racks.wiring(4) != Shape("racks", 100, rack_size=1, uplink_mbit=10).wiring(4)
    tree = Shape("fattree", 100, rack_size=1, pod_racks=2)
    assert (tree.n_pods(4), tree.n_pods(5), tree.pod_of_rack(3), racks.pod_of_rack(3)) == (
        2,
        3,
        1,
        None,
    )
    assert tree.wiring(4) != Shape("fattree", 100, rack_size=1, pod_racks=1).wiring(4)


def test_a_parameter_server_step_is_bounded_by_the_drivers_link():
    """ssgd, K = 4 on a switch of 8 Mbit/s (10^6 bytes/s): 4 gradients of 4d bytes into the
    driver, then 4 thetas out of it, each phase 16d bytes through its one link."""
    d = 1000
    summary = {
        "environment": {"netem": {"topology": "switch", "bandwidth_mbit": 8}},
        "algorithm": "ssgd",
        "n_workers": 4,
        "redundancy": 1,
        "group_size": None,
        "shuffle": "coded",
        "n_params": d,
        "transport": "direct",
    }
    got = topology.phase_bounds(summary)
    assert got == pytest.approx({"shuffle": 16 * d / 1e6, "params": 16 * d / 1e6, "comm": 0.032})
    assert topology.phase_bounds({**summary, "environment": {}}) == {}


#: One network of each topology, its uplinks narrower than its hosts' links.
SHAPES = [
    Shape("switch", 100),
    Shape("bus", 100),
    Shape("racks", 100, rack_size=2, uplink_mbit=30),
    Shape("fattree", 100, rack_size=2, pod_racks=2, uplink_mbit=60, pod_uplink_mbit=25),
]


def _links_crossed(shape: Shape, sender: int, receivers, n_workers: int) -> set:
    """Every shaped link one multicast copy crosses, by walking its paths: the sender's own
    link, each receiver's, and the uplinks between their racks and pods (once each)."""
    rack = shape.rack_of(n_workers) or [None] * (n_workers + 1)
    pod = shape.pod_of(n_workers) or [None] * (n_workers + 1)
    crossed = {("out", sender)} | {("in", r) for r in receivers}
    if shape.kind == "bus":
        crossed.add("bus")
    for r in receivers:
        if rack[r] != rack[sender]:
            crossed |= {("up", rack[sender]), ("down", rack[r])}
        if pod[r] != pod[sender]:
            crossed |= {("pod_up", pod[sender]), ("pod_down", pod[r])}
    return {x for x in crossed if None not in (x if isinstance(x, tuple) else ())}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.kind)
@pytest.mark.parametrize(("shuffle", "r"), [("coded", 1), ("coded", 2), ("summed", 3)])
def test_every_sender_at_its_pace_fills_the_busiest_link_and_overruns_none(shape, shuffle, r):
    """All senders at once, each spreading its phase's bytes evenly at the pace: no link
    carries more than 95% of its rate, and the busiest carries just that (or the senders' own
    links bind first)."""
    K = 8
    capacity = {"out": shape.rate_mbit, "in": shape.rate_mbit, "bus": shape.rate_mbit}
    capacity |= {"up": shape.uplink(), "down": shape.uplink()}
    capacity |= {"pod_up": shape.pod_uplink(), "pod_down": shape.pod_uplink()}
    phases = step_messages(Placement(K, r), shuffle, None)
    for phase, pace in shape.paces(phases).items():
        messages = phases[phase]
        sent = {s: sum(n for t, _, n in messages if t == s) for s, _, _ in messages}
        used: dict = {}
        for s, receivers, n in messages:
            for link in _links_crossed(shape, s, receivers, K):
                used[link] = used.get(link, 0.0) + pace * n / sent[s]
        busiest = max(
            u / capacity[link if isinstance(link, str) else link[0]] for link, u in used.items()
        )
        assert busiest <= 0.95 + 1e-9, (phase, busiest)
        assert busiest == pytest.approx(0.95), (phase, pace)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.kind)
@pytest.mark.parametrize(
    ("shuffle", "r", "g"), [("coded", 1, 8), ("coded", 2, 8), ("summed", 3, 4)]
)
def test_every_tcp_connection_at_its_share_of_the_pace_overruns_no_link(shape, shuffle, r, g):
    """Over TCP a message for several receivers leaves once for each: every connection of
    every sender at once, each at the sender's pace times that receiver's share of its bytes
    (:func:`topology.sender_shares`): no link carries more than the pace's share of its
    rate, and the busiest carries just that (or the senders' own links bind first)."""
    K, share = 8, topology.TCP_PACE_SHARE
    capacity = {"out": shape.rate_mbit, "in": shape.rate_mbit, "bus": shape.rate_mbit}
    capacity |= {"up": shape.uplink(), "down": shape.uplink()}
    capacity |= {"pod_up": shape.pod_uplink(), "pod_down": shape.pod_uplink()}
    phases = step_messages(Placement(K, r, g), shuffle, None)
    for phase, pace in shape.paces(phases, multicast=False, share=share).items():
        used: dict = {}
        for s in {s for s, _, _ in phases[phase]}:
            for receiver, part in topology.sender_shares(phases[phase], s).items():
                for link in _links_crossed(shape, s, [receiver], K):
                    used[link] = used.get(link, 0.0) + pace * part
        busiest = max(
            u / capacity[link if isinstance(link, str) else link[0]] for link, u in used.items()
        )
        assert busiest <= share + 1e-9, (phase, busiest)
        assert busiest == pytest.approx(share), (phase, pace)
    if shape.kind == "bus":  # every byte of all K senders crosses the one medium
        assert shape.paces(phases, multicast=False, share=1.0)["params"] == pytest.approx(100 / K)


def test_a_receivers_share_counts_every_copy_sent_to_it():
    messages = [(0, [1, 2], 3.0), (0, [2], 1.0), (1, [0], 5.0)]
    assert topology.sender_shares(messages, 0) == {1: 3 / 7, 2: 4 / 7}
    assert topology.sender_shares(messages, 2) == {}


def test_a_phase_that_sends_nothing_goes_at_the_senders_own_link():
    assert Shape("bus", 40).paces({"shuffle": []}) == {"shuffle": 0.95 * 40}


@pytest.mark.parametrize(
    ("links", "allowed", "says"),
    [
        ({"topology": "ring"}, topology.EMULATED, "cluster.topology='ring' is not known"),
        ({"topology": "fattree", "rack_size": 2}, topology.EMULATED, "cluster.pod_racks=None"),
        ({"topology": "racks"}, topology.EMULATED, "cluster.rack_size=None is not allowed"),
        ({"topology": "racks", "rack_size": 4}, topology.EMULATED, r"in 1\.\.3"),
        ({"topology": "racks", "rack_size": True}, topology.EMULATED, "rack_size=True"),
        ({"topology": "torus"}, topology.TOPOLOGIES, "'torus' is not known"),
    ],
)
def test_an_impossible_shape_is_refused_naming_the_setting(links, allowed, says):
    with pytest.raises(ValueError, match=says):
        topology.check(links, 4, allowed)


def test_every_possible_shape_passes():
    for kind, size in itertools.product(topology.TOPOLOGIES, (1, 2, 3)):
        topology.check(
            {"topology": kind, "rack_size": size, "pod_racks": 1}, 4, topology.TOPOLOGIES
        )


def test_the_bound_puts_each_rank_on_the_host_it_ran_on():
    """After a recovery a rank may sit on any host (the ranks are the workers in address
    order, ``10.0.0.10`` after ``10.0.0.9``): the bound follows each rank's IP to its host. DDP's
    ring on racks of 2, K = 4, ``d = 1000``: each rank sends ``2 (K-1)/K · 4d = 6000`` bytes to
    the next; in rack order one hop leaves each rack, with ranks 1 and 2 swapped every hop does;
    on a network of 5 hosts with rank 0 on the last, that host carries rank 0's bytes."""
    net = {"topology": "racks", "bandwidth_mbit": 100.0, "rack_size": 2, "uplink_mbit": 50.0}
    ips = [f"10.0.0.{i}" for i in range(2, 7)]

    def summary(hosts, n_ips=4):
        workers = [f"tcp://{ips[h]}:{9000 - h}" for h in hosts]
        env = {"netem": net, "worker_ips": ips[:n_ips], "workers": workers}
        layout = dict.fromkeys(("redundancy", "group_size", "shuffle"))
        return {"algorithm": "ddp", "n_workers": 4, "n_params": 1000, **layout, "environment": env}

    in_order, swapped = summary([0, 1, 2, 3]), summary([0, 2, 1, 3])
    assert topology.rank_hosts(swapped) == [0, 2, 1, 3]
    assert topology.link_loads(in_order)["rack0 up"] == 6000.0
    assert topology.link_loads(swapped)["rack0 up"] == 12000.0
    assert topology.phase_bounds(swapped)["comm"] == 2 * topology.phase_bounds(in_order)["comm"]
    moved = topology.link_loads(summary([4, 1, 2, 3], n_ips=5))
    assert (moved["w4 out"], moved["w0 out"], moved["rack2 up"]) == (6000.0, 0.0, 6000.0)
    del in_order["environment"]["worker_ips"]  # a summary that does not say: rank k on w{k}
    assert topology.rank_hosts(in_order) == [0, 1, 2, 3]


def test_the_cross_sums_all_gather_is_bounded_with_thetas():
    """Hierarchical cdc, K = 8 in racks of 4 behind 25 Mbit/s uplinks (g = 4 = r, summed,
    multicast, d = 1000): the reduce-scatter ends the shuffle (each owner's 500-byte chunk to
    the other rack: 2000 bytes up each uplink, 0.64 ms); the summed chunks go back with θ's
    all-gather (2000 more bytes up each uplink, while each worker takes in 3 segments of 1000
    bytes and one chunk of 500: 1.12 ms). One after the other they took 1.28 + 0.96 ms."""
    net = {"topology": "racks", "bandwidth_mbit": 25.0, "rack_size": 4, "uplink_mbit": 25.0}
    summary = {
        "algorithm": "cdc", "n_workers": 8, "n_params": 1000, "redundancy": 4, "group_size": 4,
        "shuffle": "summed", "transport": "multicast", "environment": {"netem": net},
    }  # fmt: skip
    phases = topology.phase_bounds(summary)
    assert phases["shuffle"] == pytest.approx(0.64e-3)
    assert phases["params"] == pytest.approx(1.12e-3)
    loads = topology.link_loads(summary)
    assert loads["rack0 up"] == loads["rack1 down"] == 4000.0
    assert loads["w0 in"] == 3000.0 + 500.0 + 500.0  # θ's segments, a chunk, a summed chunk
