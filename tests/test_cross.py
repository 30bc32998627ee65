"""The cross-cluster sum of hierarchical CDC: a reduce-scatter and an all-gather among the
owners of one segment index, checked against a plain sum in cluster order, the closed-form
loads and a count of its messages."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dcoded.coding import (
    Placement,
    chunk_slices,
    cross_cluster_sum,
    cross_messages,
    cross_sum,
    cross_values,
    segment_slices,
    sum_in_order,
)

LAYOUTS = [(K, g) for K in (2, 4, 6, 8, 12, 16, 24, 32) for g in range(1, K + 1) if K % g == 0]


def test_a_plain_sum_in_cluster_order_is_what_every_chunk_holds():
    rng = np.random.default_rng(0)
    for m in (1, 2, 3, 4, 7):
        for length in (0, 1, m - 1, m, 5 * m + 2, 1001):
            parts = [rng.standard_normal(length).astype(np.float32) for _ in range(m)]
            want = sum_in_order(parts)  # the whole segment at once, left to right
            got = cross_sum(parts)
            assert got.dtype == np.float32 and got.shape == (length,)
            assert got.tobytes() == want.tobytes(), (m, length)


def test_the_cluster_order_is_kept_not_a_convenient_one():
    big, small = np.float32([1e8]), np.float32([1.0])
    # (1e8 + 1) - 1e8 = 0 in float32, (1e8 - 1e8) + 1 = 1
    assert cross_sum([big, small, -big])[0] == 0.0
    assert cross_sum([big, -big, small])[0] == 1.0


def test_chunks_cover_the_segment_in_order_and_differ_by_at_most_one():
    for length in range(0, 40):
        for m in range(1, 9):
            chunks = chunk_slices(length, m)
            assert len(chunks) == m
            assert [i for s in chunks for i in range(length)[s]] == list(range(length))
            sizes = [s.stop - s.start for s in chunks]
            assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(("K", "g"), LAYOUTS)
def test_the_messages_add_up_to_the_closed_form(K, g):
    p = Placement(K, 1, g)
    scatter, gather = cross_messages(p)
    m = K // g
    sent_once = [Fraction(0)] * K
    per_receiver = [Fraction(0)] * K
    got = [Fraction(0)] * K
    for sender, receivers, size in scatter + gather:
        size = Fraction(size).limit_denominator(10_000)
        assert all(p.local(k) == p.local(sender) and k != sender for k in receivers)
        sent_once[sender] += size
        per_receiver[sender] += size * len(receivers)
        for k in receivers:
            got[k] += size
    closed = cross_cluster_sum(K, g)
    for k in range(K):  # every worker the same, and each receives what it sends
        assert float(sent_once[k]) == pytest.approx(closed.multicast, abs=1e-12)
        assert float(per_receiver[k]) == pytest.approx(closed.unicast, abs=1e-12)
        assert got[k] == per_receiver[k]
    assert len(scatter) == K * (m - 1) and len(gather) == (K if m > 1 else 0)
    # the point of it: the per-worker cost falls with g, where the all-to-all's grew with K
    assert closed.unicast <= 2 / g
    assert closed.unicast < (m - 1) / g or m <= 2


@pytest.mark.parametrize(("K", "g", "d"), [(8, 4, 1000), (12, 4, 77), (16, 4, 5), (6, 2, 13)])
def test_what_an_owner_counts_is_the_chunks_it_sends(K, g, d):
    """``cross_values``, which the engine records, against the chunks themselves: the values
    each owner sends once and once per receiver, for segments that do not divide evenly."""
    p, m = Placement(K, 1, g), K // g
    for i, seg in enumerate(segment_slices(d, g)):
        n = seg.stop - seg.start
        for c in range(m):
            chunks = chunk_slices(n, m)
            size = [s.stop - s.start for s in chunks]
            scattered = sum(size[o] for o in range(m) if o != c)
            assert cross_values(n, m, c) == {
                "multicast": scattered + size[c],
                "unicast": scattered + size[c] * (m - 1),
            }, (i, c)
    assert cross_values(10, 1, 0) == {"multicast": 0, "unicast": 0}
    assert p.n_clusters == m
