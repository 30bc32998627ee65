"""Closed-form loads (units of ``d`` float32 values per worker per step) and the CLI table."""

from __future__ import annotations

import itertools
import subprocess
import sys
from fractions import Fraction
from math import comb
from pathlib import Path

import pytest

from dcoded.coding import (
    Load,
    allgather,
    best_m,
    coded_shuffle,
    cross_cluster_sum,
    exchange_table,
    hybrid_plan,
    hybrid_shuffle,
    load_table,
    parameter_server,
    ring_allreduce,
    segment_slices,
    shuffle,
    summed_shuffle,
    uncoded_shuffle,
)
from dcoded.coding.__main__ import main

KR = [(n, r) for n in range(1, 11) for r in range(1, n + 1)]


def close(load: Load, multicast, unicast) -> bool:
    return load.multicast == pytest.approx(float(multicast), abs=1e-15) and (
        load.unicast == pytest.approx(float(unicast), abs=1e-15)
    )


@pytest.mark.parametrize(
    ("n", "r", "mc", "uc"),
    [
        # K=4: a worker is in C(3, r) groups and sends one packet of (d/4)/r values in each.
        (4, 1, Fraction(3, 4), Fraction(3, 4)),
        (4, 2, Fraction(3, 8), Fraction(3, 4)),
        (4, 3, Fraction(1, 12), Fraction(1, 4)),
        (4, 4, 0, 0),
        (3, 1, Fraction(2, 3), Fraction(2, 3)),
        (3, 2, Fraction(1, 6), Fraction(1, 3)),
        (5, 2, Fraction(6, 10), Fraction(6, 5)),  # C(4,2)=6 groups
        (6, 2, Fraction(10, 12), Fraction(10, 6)),  # C(5,2)=10 groups
        (6, 3, Fraction(10, 18), Fraction(10, 6)),
        (1, 1, 0, 0),
    ],
)
def test_coded_shuffle_hand_values(n, r, mc, uc):
    assert close(coded_shuffle(n, r), mc, uc)


@pytest.mark.parametrize(
    ("n", "r", "value"),
    [
        (4, 1, Fraction(3, 4)),
        (4, 2, Fraction(3, 4)),
        (4, 3, Fraction(1, 4)),
        (4, 4, 0),
        (5, 2, Fraction(6, 5)),
        (6, 3, Fraction(10, 6)),
    ],
)
def test_uncoded_shuffle_hand_values(n, r, value):
    assert close(uncoded_shuffle(n, r), value, value)


@pytest.mark.parametrize(("n", "r"), KR)
def test_closed_forms(n, r):
    c = comb(n - 1, r)
    assert close(coded_shuffle(n, r), Fraction(c, n * r), Fraction(c, n))
    assert close(uncoded_shuffle(n, r), Fraction(c, n), Fraction(c, n))
    # The coded multicast count is the uncoded one divided by r: each packet serves r receivers.
    assert coded_shuffle(n, r).multicast * r == pytest.approx(uncoded_shuffle(n, r).multicast)
    assert close(summed_shuffle(n, r), Fraction(n - r, n), Fraction(n - r, n))


@pytest.mark.parametrize(("n", "r"), KR)
def test_cdc_optimum_identity(n, r):
    """Summed over the K workers, against all intermediate values.

    The map produces C(K, r) sub-batch gradients of d values each: C(K, r) * d intermediate
    values (K segments of d/K per sub-batch). Per worker the coded multicast count is
    C(K-1, r)/(K r) * d, so all workers together send C(K-1, r)/r * d, and since
    C(K-1, r) = C(K, r) (K-r)/K this is (1/r)(1 - r/K) * C(K, r) * d: a fraction (1/r)(1 - r/K)
    of all intermediate values, CDC's optimal communication load. The identity holds for the
    *multicast* count (each packet counted once, as in CDC's broadcast model); the unicast count
    is r times that, (1 - r/K) * C(K, r) * d summed, the same as the uncoded shuffle's
    (1 - r/K), which is CDC's uncoded load.
    """
    total = Fraction(comb(n, r))  # in units of d
    coded, uncoded = coded_shuffle(n, r), uncoded_shuffle(n, r)
    optimum = Fraction(1, r) * (1 - Fraction(r, n))
    assert n * coded.multicast == pytest.approx(float(optimum * total), abs=1e-12)
    assert n * coded.unicast == pytest.approx(float((1 - Fraction(r, n)) * total), abs=1e-12)
    assert n * uncoded.multicast == pytest.approx(float((1 - Fraction(r, n)) * total), abs=1e-12)
    assert n * coded.unicast == pytest.approx(r * n * coded.multicast, abs=1e-12)


@pytest.mark.parametrize(("n", "r"), [(n, r) for n in range(2, 8) for r in range(1, n)])
def test_summed_shuffle_covering(n, r):
    """Owner k lacks the r-subsets of the K-1 others; any K-r of those workers hold each of them
    (and K-r-1 do not suffice), so K-r pre-summed vectors of |segment k| values reach k."""
    for k in range(n):
        others = [w for w in range(n) if w != k]
        missing = list(itertools.combinations(others, r))
        for senders in itertools.combinations(others, n - r):
            assert all(set(t) & set(senders) for t in missing)
        if n - r - 1 >= 0:
            short = others[: n - r - 1]
            assert any(not set(t) & set(short) for t in missing)
    # Per worker: K owners each receive K-r sums of ~d/K values -> (K-r)/K of d per worker.
    d = 37
    sent = sum((n - r) * (s.stop - s.start) for s in segment_slices(d, n))
    assert Fraction(sent, n) == Fraction(n - r, n) * d
    assert summed_shuffle(n, r).unicast * d == pytest.approx(sent / n)


@pytest.mark.parametrize(("n", "r"), KR)
def test_summing_before_sending_beats_coded_unicast(n, r):
    """The honest caveat: a reduce-scatter that adds gradients before sending never moves more
    than the coded shuffle's unicast count, and strictly less for 2 <= r <= K-2."""
    rs, coded = summed_shuffle(n, r).unicast, coded_shuffle(n, r).unicast
    if r in (1, n - 1, n):
        assert rs == pytest.approx(coded)
    else:
        assert rs < coded


def test_summed_shuffle_values():
    assert close(summed_shuffle(4, 1), Fraction(3, 4), Fraction(3, 4))
    assert close(summed_shuffle(4, 2), Fraction(1, 2), Fraction(1, 2))
    assert close(summed_shuffle(4, 4), 0, 0)
    assert close(summed_shuffle(8, 3), Fraction(5, 8), Fraction(5, 8))


def test_other_schemes():
    assert close(allgather(4), Fraction(1, 4), Fraction(3, 4))
    assert close(allgather(1), 1, 0)
    assert close(ring_allreduce(4), Fraction(3, 2), Fraction(3, 2))
    assert close(ring_allreduce(1), 0, 0)
    up, down = parameter_server(4)
    assert close(up, 1, 1) and close(down, 1, 1)
    assert Load(0.375, 0.75).bytes(1000) == Load(1500.0, 3000.0)
    assert Load(0.5, 1.0).bytes(10, itemsize=8) == Load(40.0, 80.0)


@pytest.mark.parametrize(
    ("n", "g", "mc", "uc"),
    [
        # the m = K/g owners of an index: m - 1 chunks of d/K out (reduce-scatter), then the
        # summed chunk to the m - 1 others (all-gather): m/K once, 2(m - 1)/K per receiver
        (6, 6, 0, 0),
        (6, 3, Fraction(1, 3), Fraction(1, 3)),
        (6, 2, Fraction(1, 2), Fraction(2, 3)),
        (8, 2, Fraction(1, 2), Fraction(3, 4)),
        (8, 4, Fraction(1, 4), Fraction(1, 4)),
        (6, 1, 1, Fraction(5, 3)),
        (32, 4, Fraction(1, 4), Fraction(7, 16)),
    ],
)
def test_cross_cluster_sum(n, g, mc, uc):
    assert close(cross_cluster_sum(n, g), mc, uc)


@pytest.mark.parametrize(
    ("n", "r", "g"),
    [
        (n, r, g)
        for n in range(1, 9)
        for g in range(1, n + 1)
        if n % g == 0
        for r in range(1, g + 1)
    ],
)
def test_hierarchical_shuffle_is_inner_plus_cross(n, r, g):
    cross = cross_cluster_sum(n, g)
    for scheme, inner in (
        ("coded", coded_shuffle(g, r)),
        ("uncoded", uncoded_shuffle(g, r)),
        ("summed", summed_shuffle(g, r)),
    ):
        got = shuffle(n, r, g, scheme)
        assert close(got, inner.multicast + cross.multicast, inner.unicast + cross.unicast)
    if g == n:
        assert shuffle(n, r) == coded_shuffle(n, r)
        assert shuffle(n, r, scheme="uncoded") == uncoded_shuffle(n, r)
        assert shuffle(n, r, scheme="summed") == summed_shuffle(n, r)


def test_hierarchical_hand_value():
    # K=6, g=2, r=1: inner C(1,1)/2 = 1/2 both ways; cross (m = 3): two chunks of d/6 out,
    # then one summed chunk of d/6 to 2 others -> 1/2 once, 4/6 per receiver.
    assert close(shuffle(6, 1, 2), 1, Fraction(7, 6))


@pytest.mark.parametrize(
    "call",
    [
        lambda: coded_shuffle(4, 5),
        lambda: coded_shuffle(4, 0),
        lambda: uncoded_shuffle(0, 1),
        lambda: summed_shuffle(3, 4),
        lambda: allgather(0),
        lambda: ring_allreduce(0),
        lambda: parameter_server(0),
        lambda: cross_cluster_sum(4, 3),
        lambda: shuffle(4, 3, 2),
        lambda: shuffle(4, 1, 3),
        lambda: shuffle(4, 2, scheme="xor"),
        lambda: load_table(4, 3),
    ],
)
def test_invalid_layouts_raise(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize(("n", "g"), [(4, None), (6, 3), (8, 2), (1, None)])
def test_load_table(n, g):
    rows = load_table(n, g)
    gg = g or n
    assert [row["r"] for row in rows] == list(range(1, gg + 1))
    for row in rows:
        r = row["r"]
        coded, uncoded = shuffle(n, r, gg), shuffle(n, r, gg, scheme="uncoded")
        assert row["compute"] == pytest.approx(r / n)
        assert row["coded_mc"] == coded.multicast and row["coded_uc"] == coded.unicast
        assert row["uncoded_mc"] == uncoded.multicast and row["uncoded_uc"] == uncoded.unicast
        assert row["reduce_scatter"] == pytest.approx(
            summed_shuffle(gg, r).unicast + cross_cluster_sum(n, gg).unicast
        )
        assert row["allgather_mc"] == allgather(gg).multicast
        assert row["allgather_uc"] == allgather(gg).unicast
        assert row["ring_allreduce"] == ring_allreduce(n).unicast
        assert row["param_server_up"] == 1.0
        hybrid = shuffle(n, r, gg, scheme="hybrid")
        assert row["hybrid_m"] == best_m(gg, r)
        assert row["hybrid_mc"] == hybrid.multicast and row["hybrid_uc"] == hybrid.unicast


# --- CLI --------------------------------------------------------------------------------------


def table_rows(out: str, which: int = 0) -> list[list[str]]:
    """The rows of the ``which``-th markdown table printed (0: loads, 1: the exchanges)."""
    tables, current = [], []
    for ln in [*out.splitlines(), ""]:
        if ln.startswith("|"):
            current.append(ln)
        elif current:
            tables.append(current)
            current = []
    header, sep, *rows = tables[which]
    assert header.split("|")[1].strip() == "r" and set(sep) <= set("|-:")
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in rows]


def test_cli_k4(capsys):
    assert main(["-K", "4"]) == 0
    out = capsys.readouterr().out
    assert "K=4, g=4" in out
    rows = table_rows(out)
    assert [int(row[0]) for row in rows] == [1, 2, 3, 4]  # one row per r
    coded_mc = [float(row[2]) for row in rows]
    assert coded_mc == [0.75, 0.375, 0.0833, 0.0]
    for row, ref in zip(rows, load_table(4), strict=True):
        assert float(row[3]) == pytest.approx(ref["coded_uc"], abs=5e-5)
        assert float(row[6]) == pytest.approx(ref["reduce_scatter"], abs=5e-5)
    assert float(rows[1][6]) == 0.5  # summed reduce-scatter at K=4, r=2: (K-r)/K


def test_cli_group_size_and_bytes(capsys):
    assert main(["--workers", "6", "--group-size", "3"]) == 0
    assert [int(row[0]) for row in table_rows(capsys.readouterr().out)] == [1, 2, 3]
    assert main(["-K", "4", "-d", "1000"]) == 0
    out = capsys.readouterr().out
    assert "bytes for d=1000" in out
    assert table_rows(out)[1][2] == "1,500"  # 3/8 * 1000 values * 4 bytes


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-K", "4", "-g", "3"], "group_size=3"),
        (["-K", "4", "-g", "0"], "group_size=0"),
        (["-K", "0"], "n_workers=0"),
    ],
)
def test_cli_errors_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error:") and needle in captured.err


def test_cli_as_module():
    root = Path(__file__).resolve().parents[1]
    ok = subprocess.run(
        [sys.executable, "-m", "dcoded.coding", "-K", "4"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert len(table_rows(ok.stdout)) == 4
    bad = subprocess.run(
        [sys.executable, "-m", "dcoded.coding", "-K", "4", "-g", "3"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
    )
    assert bad.returncode == 2 and "group_size=3" in bad.stderr


# --- the hybrid shuffle beside CDC and the summed shuffle -------------------------------------


@pytest.mark.parametrize(("n", "r"), [(n, r) for n in range(2, 10) for r in range(1, n + 1)])
def test_hybrid_load_is_the_plans_packets(n, r):
    """Per worker, in units of d: one piece of d/(K m) per packet sent, one segment d/K per
    value received; at most (m+1)|S|/(K^2 m), and CDC's count at m = r.

    The packets and values are counted here from the charges alone (checked by brute force in
    test_hybrid), not through the plan's own ``packets``/``ingress``, which the load is
    computed from: member j of S sends a packet when another member k has a non-empty
    v(S, k); every non-empty v(S, k) is one segment received by k."""
    for m in range(1, r + 1):
        plan = hybrid_plan(n, r, m)
        load = hybrid_shuffle(n, r, m)
        sent = sum(
            1 for S in plan.family for j in S if any((S, k) in plan.charges for k in S if k != j)
        )
        got = len(plan.charges)
        assert close(load, Fraction(sent, n * n * m), Fraction(got, n * n))
        assert Fraction(sent, n * m) <= plan.bound()
        if m == r:
            assert close(load, coded_shuffle(n, r).multicast, coded_shuffle(n, r).unicast)
    assert shuffle(n, r, scheme="hybrid") == hybrid_shuffle(n, r, best_m(n, r))


def test_hybrid_with_clusters_adds_the_cross_cluster_sum():
    got, inner, cross = (
        shuffle(12, 4, 6, "hybrid", 2),
        hybrid_shuffle(6, 4, 2),
        cross_cluster_sum(12, 6),
    )
    assert close(got, inner.multicast + cross.multicast, inner.unicast + cross.unicast)
    with pytest.raises(ValueError, match="hybrid_m=5"):
        shuffle(6, 4, scheme="hybrid", hybrid_m=5)
    with pytest.raises(ValueError, match="no cached family"):
        hybrid_shuffle(10, 5, 2)  # beyond the table: an error that names the command, no solve


def test_exchange_table_k8():
    rows = {row["r"]: row for row in exchange_table(8)}
    r5 = rows[5]
    assert r5["coded"].egress_mean == Fraction(21, 5) and r5["summed"].egress_mean == 3
    assert r5["hybrid_m"] == 2 and r5["hybrid"].egress_mean == Fraction(3, 2)
    assert r5["hybrid"].ingress_mean == 3 == r5["summed"].ingress_mean  # K - r: the least
    assert r5["best_bus"] == "hybrid" and r5["best_switch"] == "summed=hybrid"
    for row in rows.values():  # on a switch nothing beats the summed shuffle
        assert row["best_switch"].startswith("summed")
        assert row["coded"].bus == 8 * row["coded"].egress_mean


def test_cli_prints_the_exchange_table(capsys):
    assert main(["-K", "8"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out, 1)
    assert [int(row[0]) for row in rows] == list(range(1, 9))
    r5 = rows[4]
    assert r5[1] == "4.20" and r5[4] == "3.00" and r5[7] == "2" and r5[8] == "8"
    assert r5[9] == "1.50 (1.50)" and r5[10] == "3.00 (3.00)" and r5[-1] == "hybrid"
    # the first table has the hybrid's counts in units of d: 1.5/8 sent, 3/8 received
    first = table_rows(out, 0)[4]
    assert float(first[7]) == pytest.approx(0.1875) and float(first[8]) == pytest.approx(0.375)
    assert main(["-K", "6", "-d", "1200"]) == 0  # bytes: 1.00 segment of 200 values
    assert table_rows(capsys.readouterr().out, 1)[3][9] == "800 (800)"


def test_step_bounds_match_the_topology_table():
    """Issue 11's table at K = 4, in units of d: busiest host on a switch, total on a bus."""
    from dcoded.coding.loads import step_bounds

    want = {
        (2, "DDP ring all-reduce"): (1.5, 6.0),
        (2, "parameter server"): (4.0, 8.0),
        (2, "cdc coded, unicast"): (1.5, 6.0),
        (2, "cdc coded, multicast"): (1.5, 2.5),
        (2, "summed, multicast all-gather"): (1.25, 3.0),
        (3, "cdc coded, multicast"): (1.0, 4 / 3),
        (4, "cdc coded, multicast"): (0.0, 0.0),  # r = K: nothing is sent at all
    }
    got = {(row["r"], row["scheme"]): row for r in (2, 3, 4) for row in step_bounds(4, r)}
    for key, (switch, bus) in want.items():
        assert got[key]["switch"] == pytest.approx(switch) and got[key]["bus"] == pytest.approx(bus)


def test_bounds_of_messages_on_each_topology():
    """The same messages cost what each topology says: multicast helps on a bus, not a
    receiver's link on a switch, and crosses an uplink once on racks."""
    from dcoded.coding import bounds

    msgs = [(0, [1, 2, 3], 10.0), (2, [3], 10.0)]
    racks = [0, 0, 1, 1]
    uni, multi = (bounds.link_bytes(msgs, 4, m, racks) for m in (False, True))
    assert uni["egress"][0] == 30 and multi["egress"][0] == 10
    assert uni["ingress"] == multi["ingress"] == [0, 10, 10, 20]
    assert uni["medium"] == 40 and multi["medium"] == 20
    assert dict(uni["up"]) == {0: 20} and dict(multi["up"]) == {0: 10}
    net = {"rate": 10.0, "uplink": 5.0}
    assert bounds.seconds({**net, "kind": "switch"}, multi) == 2.0  # host 3 receives 20
    assert bounds.seconds({**net, "kind": "bus"}, multi) == 2.0
    assert bounds.seconds({**net, "kind": "bus"}, uni) == 4.0
    assert bounds.seconds({**net, "kind": "racks"}, uni) == 4.0  # 20 up rack 0 at 5
    with pytest.raises(ValueError, match="ring"):
        bounds.seconds({**net, "kind": "ring"}, uni)


def test_the_readmes_make_loads_and_its_twin_print_the_same_table():
    """``make loads ARGS="-K 6 -g 3"`` and its README twin ``... -d 17226`` printed different
    units (a fraction of d, and bytes): each line's twin now takes the same arguments."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    pairs = re.findall(
        r'^make loads ARGS="([^"]*)" +# or: \S+ -m dcoded\.coding (.*)$', readme, re.M
    )
    assert pairs, "the README's make loads line"
    for make_args, twin_args in pairs:
        assert make_args.split() == twin_args.split()
