"""Placement: sub-batches, groups, segments, pieces, clusters and layout validation."""

from __future__ import annotations

import itertools
from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcoded.coding import (
    Placement,
    array_split_slices,
    check_layout,
    clusters,
    groups,
    label_without,
    piece_length,
    piece_slices,
    segment_slices,
    subsets,
    summed_plan,
    uncoded_sender,
)

LAYOUTS = [
    (n, r, g) for n in range(1, 9) for g in range(1, n + 1) if n % g == 0 for r in range(1, g + 1)
]


def assert_partition(slices: list[slice], length: int) -> None:
    """Consecutive, step-less slices covering ``range(length)`` with no gap or overlap, sizes
    non-increasing and within one of each other (array_split semantics)."""
    pos = 0
    for s in slices:
        assert s.step is None
        assert s.start == pos and s.stop >= s.start
        pos = s.stop
    assert pos == length
    sizes = [s.stop - s.start for s in slices]
    assert sizes == sorted(sizes, reverse=True)
    assert max(sizes) - min(sizes) <= 1


# --- splits -----------------------------------------------------------------------------------


@settings(deadline=None)  # a loaded machine's pause is not a failure
@given(st.integers(0, 2000), st.integers(1, 70))
def test_array_split_slices_matches_numpy(length, n):
    x = np.arange(length)
    ours = [x[s] for s in array_split_slices(length, n)]
    theirs = np.array_split(x, n)
    assert len(ours) == len(theirs) == n
    for a, b in zip(ours, theirs, strict=True):
        assert np.array_equal(a, b)
    assert_partition(array_split_slices(length, n), length)


@pytest.mark.parametrize("n", [0, -1])
def test_array_split_slices_rejects_bad_n(n):
    with pytest.raises(ValueError, match=f"n={n}"):
        array_split_slices(10, n)


@settings(deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))), st.data())
def test_segments_and_pieces_partition_the_vector(nr, data):
    n, r = nr
    # lengths that leave a remainder most of the time (and sometimes fewer elements than pieces)
    d = data.draw(st.integers(0, 300).filter(lambda v: v % (n * r) or v == 0), label="d")
    p = Placement(n, r)
    segs = p.segments(d)
    assert segs == segment_slices(d, n)
    assert len(segs) == n
    assert_partition(segs, d)
    vec = np.arange(d)
    assert np.array_equal(np.concatenate([vec[s] for s in segs]), vec)
    for S in p.groups:
        for k in S:
            seg = segs[k]
            pieces = p.pieces(d, S, k)
            holders = label_without(S, k)
            assert list(pieces) == list(holders)  # piece i <-> i-th member of S∖{k}, sorted
            assert list(pieces.values()) == piece_slices(seg.stop - seg.start, r)
            assert_partition(list(pieces.values()), seg.stop - seg.start)
            value = vec[seg]
            assert np.array_equal(np.concatenate([value[s] for s in pieces.values()]), value)
            for j, s in pieces.items():
                assert piece_length(segs, S, k, j) == s.stop - s.start


# --- sub-batches and groups -------------------------------------------------------------------


@pytest.mark.parametrize(("n", "r"), [(n, r) for n in range(1, 8) for r in range(1, n + 1)])
def test_subsets_and_groups(n, r):
    T = subsets(n, r)
    assert T == list(itertools.combinations(range(n), r)) and T == sorted(T)
    assert len(T) == comb(n, r)
    S = groups(n, r)
    assert S == list(itertools.combinations(range(n), r + 1))
    if r == n:
        assert S == []
    p = Placement(n, r)
    assert p.sub_batches == T and p.groups == S and p.n_sub_batches == len(T)
    for j in range(n):
        held = p.held_by(j)
        assert held == [t for t in T if j in t]
        assert len(held) == comb(n - 1, r - 1)
        assert len(p.groups_of(j)) == comb(n - 1, r)
    # Every needed value v(S,k) is known to every other member of S.
    for s in S:
        for k in s:
            label = label_without(s, k)
            assert label in T and k not in label and len(label) == r
            sender = uncoded_sender(s, k)
            assert sender in label and label in p.held_by(sender)
    # Worker k lacks exactly the sub-batches T with k not in T, each reached through S = T ∪ {k}.
    for k in range(n):
        missing = [t for t in T if k not in t]
        via = [label_without(s, k) for s in S if k in s]
        assert sorted(via) == missing


def test_placement_doc_example():
    p = Placement(4, 2)
    assert p.g == 4 and p.group_size == 4 and p.n_clusters == 1
    assert p.sub_batches == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert p.groups == [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)]
    assert p.held_by(0) == [(0, 1), (0, 2), (0, 3)]


# --- hierarchical placement -------------------------------------------------------------------


@pytest.mark.parametrize(("n", "r", "g"), LAYOUTS)
def test_hierarchical_layout(n, r, g):
    p = Placement(n, r, g)
    assert p.g == g and p.n_clusters == n // g
    cl = clusters(n, g)
    assert cl == [tuple(range(c * g, (c + 1) * g)) for c in range(n // g)]
    assert [w for c in cl for w in c] == list(range(n))
    for c, members in enumerate(cl):
        for loc, w in enumerate(members):
            assert p.cluster_of(w) == c and p.local(w) == loc and p.global_id(c, loc) == w
    assert p.sub_batches == subsets(g, r)  # local labels
    assert all(0 <= m < g for t in p.sub_batches for m in t)
    assert p.segments(100) == segment_slices(100, g)
    if g == n:
        assert Placement(n, r) == p


@settings(deadline=None)
@given(st.sampled_from(LAYOUTS), st.integers(0, 500))
def test_sub_batch_slices_cover_the_batch_in_order(layout, batch):
    n, r, g = layout
    p = Placement(n, r, g)
    out = p.sub_batch_slices(batch)
    assert len(out) == p.n_clusters
    assert all(len(c) == p.n_sub_batches for c in out)
    flat = [s for c in out for s in c]
    assert_partition(p.cluster_batch_slices(batch), batch)
    pos = 0
    for s in flat:  # cluster by cluster, sub-batch by sub-batch: consecutive, no gap, no overlap
        assert s.start == pos and s.stop >= s.start
        pos = s.stop
    assert pos == batch
    for part, subs in zip(p.cluster_batch_slices(batch), out, strict=True):
        assert subs[0].start == part.start and subs[-1].stop == part.stop
        sizes = [s.stop - s.start for s in subs]
        assert max(sizes) - min(sizes) <= 1
    need = p.n_clusters * p.n_sub_batches
    if batch >= need:
        p.check_batch(batch)
        assert all(s.stop > s.start for s in flat)
    else:
        with pytest.raises(ValueError, match=rf"batch_size={batch} .* >= {need}"):
            p.check_batch(batch)
        assert any(s.stop == s.start for s in flat)  # the check is exactly as strict as needed


def test_check_batch_message():
    p = Placement(6, 2, 3)
    p.check_batch(6)
    with pytest.raises(ValueError) as e:
        p.check_batch(5)
    msg = str(e.value)
    for part in ("batch_size=5", ">= 6", "redundancy=2", "group_size=3", "n_workers=6"):
        assert part in msg


# --- layout validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "r", "g", "bad", "allowed"),
    [
        (4, 0, None, "redundancy=0", "1..4"),
        (4, 5, None, "redundancy=5", "1..4"),
        (4, -1, None, "redundancy=-1", "1..4"),
        (6, 3, 2, "redundancy=3", "1..2"),
        (6, 4, 3, "redundancy=4", "1..3"),
        (4, 2.0, None, "redundancy=2.0", "1..4"),
        (4, 1, 3, "group_size=3", "[1, 2, 4]"),
        (6, 1, 4, "group_size=4", "[1, 2, 3, 6]"),
        (4, 1, 0, "group_size=0", "[1, 2, 4]"),
        (4, 1, 8, "group_size=8", "[1, 2, 4]"),
        (0, 1, None, "n_workers=0", ">= 1"),
        (-2, 1, None, "n_workers=-2", ">= 1"),
    ],
)
def test_check_layout_errors(n, r, g, bad, allowed):
    for call in (lambda: check_layout(n, r, g), lambda: Placement(n, r, g)):
        with pytest.raises(ValueError) as e:
            call()
        assert bad in str(e.value) and allowed in str(e.value)


def test_the_redundancy_limit_names_where_it_comes_from():
    with pytest.raises(ValueError, match=r"redundancy=2 is not allowed with n_workers=1:"):
        check_layout(1, 2)
    with pytest.raises(ValueError, match=r"redundancy=3 is not allowed with group_size=2:"):
        check_layout(4, 3, 2)


def test_check_layout_ok():
    assert check_layout(4, 2) == 4
    assert check_layout(6, 2, 3) == 3
    assert check_layout(1, 1) == 1
    assert check_layout(8, 2, 2) == 2
    for n, r, g in LAYOUTS:
        assert check_layout(n, r, g) == g


def test_clusters_rejects_bad_group_size():
    with pytest.raises(ValueError, match=r"group_size=3 .*\[1, 2, 4\]"):
        clusters(4, 3)


@pytest.mark.parametrize(("n", "r"), [(n, r) for n in range(1, 9) for r in range(1, n + 1)])
def test_uncoded_senders_are_balanced_holders(n, r):
    """Every v(S, k) goes from a holder of S∖{k}, and every worker sends exactly one value in
    each of the C(K-1, r) groups it belongs to (the lowest holder sent 6/4/2/0 at K=4, r=2)."""
    count = [0] * n
    for s in groups(n, r):
        senders = [uncoded_sender(s, k) for k in s]
        assert sorted(senders) == list(s)  # one value each inside the group
        for k, j in zip(s, senders, strict=True):
            assert j != k and j in label_without(s, k)
            count[j] += 1
    assert count == [comb(n - 1, r)] * n


@pytest.mark.parametrize(("n", "r"), [(n, r) for n in range(1, 10) for r in range(1, n + 1)])
def test_summed_plan_covers_once_and_balances(n, r):
    """Brute force: every T ∌ k is charged to exactly one sender, which holds it; k gets sums
    from exactly K-r senders; every worker sends to exactly K-r receivers."""
    sends = [0] * n
    for k in range(n):
        plan = summed_plan(n, r, k)
        charged = [t for ts in plan.values() for t in ts]
        assert sorted(charged) == [t for t in subsets(n, r) if k not in t]
        assert len(charged) == len(set(charged))
        assert len(plan) == n - r and all(plan.values())
        assert list(plan) == sorted(plan)
        for j, ts in plan.items():
            assert j != k and all(j in t for t in ts) and ts == sorted(ts)
            sends[j] += 1
    assert sends == [n - r] * n
