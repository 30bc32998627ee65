"""The XOR codec, checked by simulating whole coded shuffles in numpy.

Every worker only ever sees its own map output (a dict of the ``g_T`` with ``j`` in ``T``), so a
codec that used data a worker does not hold would fail with a ``KeyError`` here.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from math import comb

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcoded.coding import (
    Placement,
    as_bits,
    charged_value,
    coded_shuffle,
    decode_piece,
    decode_value,
    decode_value_piece,
    decode_values,
    encode_packet,
    encode_values,
    groups,
    hybrid_plan,
    hybrid_shuffle,
    label_without,
    piece_length,
    piece_slices,
    segment_slices,
    subsets,
    sum_in_order,
    uncoded_sender,
    uncoded_shuffle,
)

# Bit patterns that any arithmetic (or a careless float conversion) would change: NaNs with
# distinct payloads (quiet, signalling, negative), ±inf, -0.0, +0.0, the smallest and a negative
# subnormal, ±max float.
PATTERNS = np.array(
    [
        0x7FC00001,
        0x7F800001,
        0xFFC12345,
        0x7F800000,
        0xFF800000,
        0x80000000,
        0x00000000,
        0x00000001,
        0x807FFFFF,
        0x7F7FFFFF,
        0xFF7FFFFF,
    ],
    dtype=np.uint32,
)


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.dtype == np.float32 and b.dtype == np.float32
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


def make_grads(n: int, r: int, d: int, rng: np.random.Generator, special: bool = True):
    """One read-only float32 ``g_T`` of length ``d`` per sub-batch ``T`` (lexicographic).

    Values are normal with magnitudes spread over 12 decades, so summation order matters; with
    ``special`` every vector also carries the bit patterns above at random positions.
    """
    grads = {}
    for t, T in enumerate(subsets(n, r)):
        v = (rng.standard_normal(d) * 10.0 ** rng.uniform(-6, 6, d)).astype(np.float32)
        if special and d:
            m = min(d, len(PATTERNS))
            pos = rng.choice(d, size=m, replace=False)
            v.view(np.uint32)[pos] = np.roll(PATTERNS, -t)[:m]
        v.setflags(write=False)
        grads[T] = v
    return grads


def per_worker(grads, n: int):
    """Worker ``j``'s own map output: private read-only copies of the ``g_T`` with ``j in T``."""
    own = {}
    for j in range(n):
        own[j] = {}
        for T, v in grads.items():
            if j in T:
                c = v.copy()
                c.setflags(write=False)
                own[j][T] = c
    return own


def run_coded_shuffle(n: int, r: int, d: int, grads):
    """Encode every packet from its sender's dict, decode every value from its receiver's."""
    own = per_worker(grads, n)
    segs = segment_slices(d, n)
    packets = {(S, j): encode_packet(S, j, own[j], segs) for S in groups(n, r) for j in S}
    decoded = {}
    for S in groups(n, r):
        for k in S:
            mine = {j: packets[S, j] for j in S if j != k}
            decoded[S, k] = decode_value(S, k, mine, own[k], segs)
    return own, segs, packets, decoded


def small_ds(n: int, r: int) -> list[int]:
    """37 (divides by nothing here), 3 and ``K r - 1`` (< ``K r``: some pieces are empty) and
    ``2 K r`` (every piece the same length)."""
    return sorted({37, 3, max(1, n * r - 1), 2 * n * r})


CASES = [
    pytest.param(n, r, d, id=f"K{n}-r{r}-d{d}")
    for n in range(1, 8)
    for r in range(1, n + 1)
    for d in small_ds(n, r)
]


@pytest.mark.parametrize(("n", "r", "d"), CASES)
def test_coded_shuffle_is_bit_exact(n, r, d):
    rng = np.random.default_rng([n, r, d])
    grads = make_grads(n, r, d, rng)
    pristine = {T: v.copy() for T, v in grads.items()}
    own, segs, packets, decoded = run_coded_shuffle(n, r, d, grads)

    assert len(packets) == comb(n, r + 1) * (r + 1)
    if r == n:
        assert not packets  # one sub-batch computed by everybody: nothing to shuffle
    for S in groups(n, r):
        for j in S:
            pkt = packets[S, j]
            assert pkt.dtype == np.uint32 and pkt.ndim == 1
            lens = [piece_length(segs, S, k, j) for k in S if k != j]
            assert len(pkt) == max(lens)
            if r == 1:  # pairs: the packet is the other member's value itself, uncoded
                (k,) = (m for m in S if m != j)
                assert np.array_equal(pkt, grads[(j,)][segs[k]].view(np.uint32))
        for k in S:
            T = label_without(S, k)
            true_v = grads[T][segs[k]]
            cuts = piece_slices(len(true_v), r)
            for i, j in enumerate(T):
                got = decode_piece(S, j, k, packets[S, j], own[k], segs)
                assert bits_equal(got, true_v[cuts[i]]), (S, j, k)
            assert bits_equal(decoded[S, k], true_v), (S, k)
    # Nobody's input was touched.
    for T, v in grads.items():
        assert bits_equal(v, pristine[T])


def test_special_patterns_survive_the_shuffle():
    n, r, d = 4, 2, 2 * 4 * len(PATTERNS)
    rng = np.random.default_rng(7)
    grads = {}
    for T in subsets(n, r):  # every segment of every g_T carries every pattern
        v = rng.standard_normal(d).astype(np.float32)
        v.view(np.uint32)[:] = np.resize(PATTERNS, d)
        grads[T] = v
    *_, decoded = run_coded_shuffle(n, r, d, grads)
    seen = set(np.concatenate([v.view(np.uint32) for v in decoded.values()]).tolist())
    assert seen == set(PATTERNS.tolist())
    for (S, k), v in decoded.items():
        assert bits_equal(v, grads[label_without(S, k)][segment_slices(d, n)[k]])


# --- bytes on the wire ------------------------------------------------------------------------
#
# Bound for the coded shuffle. Let x = d/(K r). Segment lengths are floor(d/K) or ceil(d/K); a
# piece of a segment of length s is floor(s/r) or ceil(s/r) long, and floor(floor(d/K)/r) =
# floor(x), ceil(ceil(d/K)/r) = ceil(x), so every piece is floor(x) or ceil(x) long: the r pieces
# XORed into one packet differ by at most one element. A packet is as long as its longest piece,
# hence  mean(its pieces) <= len(P) <= mean(its pieces) + (r-1)/r.
# The pieces of all packets together are exactly every v(S,k) once: worker k is in C(K-1,r)
# groups and gets all of its segment in each, so they hold C(K-1,r) * d elements; the closed form
# per worker is theory = C(K-1,r)/(K r) (multicast, loads.coded_shuffle), i.e. total/K =
# C(K-1,r) d/(K r) if there were no padding. With K*C(K-1,r) packets in all (C(K-1,r) per worker):
#     0 <= measured_mc_per_worker - theory_mc * d <= C(K-1,r) * (r-1)/r
#     0 <= measured_uc_per_worker - theory_uc * d <= C(K-1,r) * (r-1)      (uc = r * mc)
# (per_worker = total/K), with equality when K r divides d. A single worker's own packets
# (C(K-1,r) of them, each within one element of x) satisfy |M_j - theory_mc d| < C(K-1,r).
# Uncoded: every v(S,k) is sent whole, once, so the total is exactly C(K-1,r) d whatever d is,
# and total/K equals loads.uncoded_shuffle * d exactly (stronger than "within a bound").


@pytest.mark.parametrize(("n", "r", "d"), CASES)
def test_packet_bytes_match_closed_forms(n, r, d):
    rng = np.random.default_rng([n, r, d, 1])
    grads = make_grads(n, r, d, rng)
    own, segs, packets, _ = run_coded_shuffle(n, r, d, grads)
    x = Fraction(d, n * r)
    lo, hi = x.numerator // x.denominator, -(-x.numerator // x.denominator)

    # Every piece is floor(x) or ceil(x) long (the premise of the bound).
    for S in groups(n, r):
        for k in S:
            for j in S:
                if j != k:
                    assert lo <= piece_length(segs, S, k, j) <= hi

    per_worker_mc = [Fraction(0)] * n
    for (_S, j), pkt in packets.items():
        assert pkt.nbytes % 4 == 0
        per_worker_mc[j] += Fraction(pkt.nbytes, 4)  # elements sent, each packet once
    total_mc = sum(per_worker_mc, Fraction(0))
    total_uc = r * total_mc  # each packet reaches the r other members of its group
    c = comb(n - 1, r)

    theory = coded_shuffle(n, r)
    exact_mc, exact_uc = Fraction(c, n * r), Fraction(c, n)
    assert theory.multicast == pytest.approx(float(exact_mc), abs=1e-15)
    assert theory.unicast == pytest.approx(float(exact_uc), abs=1e-15)

    pad_mc = total_mc / n - exact_mc * d
    pad_uc = total_uc / n - exact_uc * d
    assert 0 <= pad_mc <= Fraction(c * (r - 1), r)
    assert 0 <= pad_uc <= c * (r - 1)
    eps = 1e-9 * max(1, d)
    assert -eps <= float(total_mc / n) - theory.multicast * d <= c * (r - 1) / r + eps
    assert -eps <= float(total_uc / n) - theory.unicast * d <= c * (r - 1) + eps
    if d % (n * r) == 0:
        assert float(total_mc / n) == pytest.approx(theory.multicast * d, abs=eps)
        assert float(total_uc / n) == pytest.approx(theory.unicast * d, abs=eps)
    for j in range(n):
        assert len([1 for (S, s) in packets if s == j]) == c
        assert abs(per_worker_mc[j] - exact_mc * d) <= c * max(x - lo, hi - x)

    # Uncoded shuffle, same placement: v(S,k) whole from one holder, the same count each.
    per_worker_unc = [0] * n
    for S in groups(n, r):
        for k in S:
            T = label_without(S, k)
            sender = uncoded_sender(S, k)
            assert sender in T
            sent = own[sender][T][segs[k]]  # the sender holds T
            assert bits_equal(sent, grads[T][segs[k]])
            per_worker_unc[sender] += sent.nbytes // 4
    total = sum(per_worker_unc)
    assert total == c * d
    # balanced: each worker sends C(K-1, r) values of |segment| = d/K ± 1 elements
    assert max(per_worker_unc) - min(per_worker_unc) <= c
    unc = uncoded_shuffle(n, r)
    assert Fraction(total, n) == Fraction(c, n) * d
    assert total / n == pytest.approx(unc.multicast * d, rel=1e-12, abs=1e-12)
    assert total / n == pytest.approx(unc.unicast * d, rel=1e-12, abs=1e-12)


# --- reduce in a fixed order ------------------------------------------------------------------


def reference_segment_sum(grads, n: int, r: int, seg: slice, order) -> np.ndarray:
    """Plain-Python float32 sum, element by element, over the true ``g_T`` in ``order``."""
    out = np.empty(seg.stop - seg.start, dtype=np.float32)
    for e, i in enumerate(range(seg.start, seg.stop)):
        acc = np.float32(grads[order[0]][i])
        for T in order[1:]:
            acc = np.float32(acc + np.float32(grads[T][i]))
        out[e] = acc
    return out


def reduce_at(k: int, n: int, r: int, own, segs, decoded) -> np.ndarray:
    """``G[k]`` as worker ``k`` forms it: own map output when ``k in T``, else the decoded
    ``v(T ∪ {k}, k)``, in lexicographic order of ``T``, through ``sum_in_order``."""
    parts = []
    for T in subsets(n, r):
        if k in T:
            parts.append(own[k][T][segs[k]])
        else:
            parts.append(decoded[tuple(sorted((*T, k))), k])
    return sum_in_order(parts)


@pytest.mark.parametrize(
    ("n", "r"), [pytest.param(n, r, id=f"K{n}-r{r}") for n in range(1, 8) for r in range(1, n + 1)]
)
def test_reduced_segment_matches_brute_force(n, r):
    d = 37
    rng = np.random.default_rng([n, r, 2])
    grads = make_grads(n, r, d, rng, special=False)
    own, segs, _, decoded = run_coded_shuffle(n, r, d, grads)
    order = list(itertools.combinations(range(n), r))
    for k in range(n):
        got = reduce_at(k, n, r, own, segs, decoded)
        assert got.dtype == np.float32
        want = reference_segment_sum(grads, n, r, segs[k], order)
        assert bits_equal(got, want), k


def test_summation_order_is_observable():
    """The brute-force check above could fail: another order gives other bits on its data."""
    differs = 0
    for n, r in [(4, 2), (5, 2), (6, 3), (7, 3)]:
        d = 37
        grads = make_grads(n, r, d, np.random.default_rng([n, r, 2]), special=False)
        own, segs, _, decoded = run_coded_shuffle(n, r, d, grads)
        order = list(itertools.combinations(range(n), r))
        for k in range(n):
            got = reduce_at(k, n, r, own, segs, decoded)
            other = reference_segment_sum(grads, n, r, segs[k], order[::-1])
            differs += not bits_equal(got, other)
    assert differs > 0


def test_hierarchical_reduce_matches_brute_force():
    """K=6, r=2, g=3: each cluster shuffles its own sub-batches (local indices), then the owners
    of segment i in the two clusters sum their G[i] in cluster order."""
    p = Placement(6, 2, 3)
    d = 29
    rng = np.random.default_rng(11)
    per_cluster = [make_grads(p.g, p.redundancy, d, rng, special=False) for _ in range(2)]
    G = {}
    for c, grads in enumerate(per_cluster):
        own, segs, _, decoded = run_coded_shuffle(p.g, p.redundancy, d, grads)
        assert segs == p.segments(d)
        for i in range(p.g):
            G[c, i] = reduce_at(i, p.g, p.redundancy, own, segs, decoded)
    order = p.sub_batches
    for i, seg in enumerate(p.segments(d)):
        total = sum_in_order([G[c, i] for c in range(p.n_clusters)])
        want = reference_segment_sum(per_cluster[0], p.g, p.redundancy, seg, order)
        for c in range(1, p.n_clusters):
            part = reference_segment_sum(per_cluster[c], p.g, p.redundancy, seg, order)
            want = (want + part).astype(np.float32)
        assert bits_equal(total, want)


def test_sum_in_order():
    a = np.float32([1e8, -1.0, 0.5])
    b = np.float32([1.0, 1.0, 0.25])
    c = np.float32([-1e8, 2.0, 0.125])
    out = sum_in_order([a, b, c])
    assert out.dtype == np.float32
    assert bits_equal(out, np.float32([0.0, 2.0, 0.875]))  # (1e8 + 1) - 1e8 == 0 in float32
    assert bits_equal(sum_in_order([a, c, b]), np.float32([1.0, 2.0, 0.875]))
    assert out is not a and bits_equal(a, np.float32([1e8, -1.0, 0.5]))  # input not modified
    only = sum_in_order([a])
    assert bits_equal(only, a) and only is not a
    with pytest.raises(ValueError):
        sum_in_order([])


# --- arbitrary bits, property-based -----------------------------------------------------------


@st.composite
def shuffles(draw):
    n = draw(st.integers(2, 6))
    r = draw(st.integers(1, n))
    d = draw(st.integers(0, 45))
    labels = subsets(n, r)
    shape = (len(labels), d)
    if draw(st.booleans()):  # dense: every element an independent random bit pattern
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        bits = rng.integers(0, 2**32, size=shape, dtype=np.uint32)
    else:  # hypothesis' own arrays: a fill pattern with drawn (and shrinkable) elements
        bits = draw(hnp.arrays(np.uint32, shape, elements=st.integers(0, 2**32 - 1)))
    return n, r, d, {T: bits[i].view(np.float32) for i, T in enumerate(labels)}


@settings(max_examples=60, deadline=None)
@given(shuffles())
def test_roundtrip_arbitrary_bit_patterns(case):
    n, r, d, grads = case
    own, segs, packets, decoded = run_coded_shuffle(n, r, d, grads)
    p = Placement(n, r)
    for S in groups(n, r):
        for k in S:
            T = label_without(S, k)
            true_v = grads[T][segs[k]]
            assert bits_equal(decoded[S, k], true_v)
            for j, sl in p.pieces(d, S, k).items():
                got = decode_piece(S, j, k, packets[S, j], own[k], segs)
                assert bits_equal(got, true_v[sl])


# --- errors -----------------------------------------------------------------------------------


def _setup(n=3, r=2, d=10, seed=3):
    grads = make_grads(n, r, d, np.random.default_rng(seed))
    own, segs, packets, _ = run_coded_shuffle(n, r, d, grads)
    return grads, own, segs, packets


def test_flipped_padding_bit_is_detected():
    n, r, d = 5, 2, 23
    grads = make_grads(n, r, d, np.random.default_rng(5))
    own, segs, packets, _ = run_coded_shuffle(n, r, d, grads)
    found = 0
    for S in groups(n, r):
        for j in S:
            pkt = packets[S, j]
            for k in S:
                if k == j or piece_length(segs, S, k, j) == len(pkt):
                    continue
                bad = pkt.copy()
                bad[-1] ^= np.uint32(1 << 7)  # beyond k's piece: must decode to zero there
                with pytest.raises(ValueError, match="decode cleanly"):
                    decode_piece(S, j, k, bad, own[k], segs)
                found += 1
    assert found > 0


def test_wrong_length_is_detected():
    _, own, segs, packets = _setup()
    S, j, k = (0, 1, 2), 1, 2
    pkt = packets[S, j]
    assert len(pkt) == 2
    for bad in (
        np.concatenate([pkt, np.zeros(1, np.uint32)]),  # trailing zero: would decode "cleanly"
        np.concatenate([pkt, np.ones(1, np.uint32)]),
        pkt[:-1],
        pkt[:0],
    ):
        for receiver in (0, 2):
            with pytest.raises(ValueError):
                decode_piece(S, j, receiver, bad, own[receiver], segs)
    with pytest.raises(ValueError):
        decode_value(S, k, {0: packets[S, 0], 1: pkt[:-1]}, own[k], segs)


def test_bad_arguments():
    _, own, segs, packets = _setup()
    S = (0, 1, 2)
    pkt = packets[S, 0]
    with pytest.raises(TypeError):
        decode_piece(S, 0, 1, pkt.view(np.float32), own[1], segs)
    with pytest.raises(TypeError):
        decode_piece(S, 0, 1, pkt.reshape(1, -1), own[1], segs)
    with pytest.raises(ValueError):
        decode_piece(S, 1, 1, pkt, own[1], segs)  # sender == receiver
    with pytest.raises(ValueError):
        decode_piece(S, 0, 5, pkt, own[1], segs)  # receiver not in the group
    with pytest.raises(ValueError):
        encode_packet(S, 4, own[0], segs)
    with pytest.raises(KeyError):  # worker 0 does not hold (1, 2)
        encode_packet(S, 1, own[0], segs)
    with pytest.raises(TypeError):
        as_bits(np.zeros(3))


def test_as_bits_is_a_view_of_the_raw_bits():
    v = PATTERNS.view(np.float32)
    b = as_bits(v)
    assert b.dtype == np.uint32 and np.array_equal(b, PATTERNS)
    assert np.shares_memory(b, v)


# --- the hybrid shuffle: the same exchange on pre-summed values --------------------------------
#
# Every worker computes the v(S, k) it sends or decodes with from its own map output only (a
# KeyError here would mean a worker needs a sub-batch it does not hold). The references are
# computed from the true gradients, whole segments, in the scheme's own bracketing: own
# segments (lexicographic), then the v(S, k) in family order, each summed over its charged T in
# lexicographic order.


def run_hybrid_shuffle(n: int, r: int, m: int, d: int, grads):
    plan = hybrid_plan(n, r, m)
    own = per_worker(grads, n)
    segs = segment_slices(d, n)

    def known(j, S):  # what worker j sums itself: the non-empty v(S, k), k != j
        return {k: charged_value(plan, S, k, own[j], segs) for k in plan.active(S) if k != j}

    packets = {(S, j): encode_values(S, j, known(j, S)) for j in range(n) for S, _ in plan.sends(j)}
    decoded = {}
    for k in range(n):
        for S in plan.values_for(k):
            mine = {j: packets[S, j] for j in S if j != k}
            decoded[S, k] = decode_values(S, k, mine, known(k, S), segs[k].stop - segs[k].start)
    return plan, own, segs, packets, decoded


def hybrid_reference(plan, grads, segs, k: int) -> np.ndarray:
    """``G[k]`` from the true gradients in the scheme's bracketing (no codec)."""
    seg = segs[k]
    own = [grads[T][seg] for T in subsets(plan.n, plan.r) if k in T]
    vs = [sum_in_order([grads[T][seg] for T in plan.charges[S, k]]) for S in plan.values_for(k)]
    return sum_in_order(own + vs)


HYBRID_CASES = [
    pytest.param(n, r, m, d, id=f"K{n}-r{r}-m{m}-d{d}")
    for n in range(2, 10)
    for r in range(1, n + 1)
    for m in range(1, r + 1)
    for d in ((37, 2 * n * m) if n < 9 else (2 * n * m + 5,))
]


@pytest.mark.filterwarnings("ignore:.*encountered in add:RuntimeWarning")  # inf, NaN on purpose
@pytest.mark.parametrize(("n", "r", "m", "d"), HYBRID_CASES)
def test_hybrid_shuffle_is_bit_exact(n, r, m, d):
    rng = np.random.default_rng([n, r, m, d])
    grads = make_grads(n, r, d, rng)
    pristine = {T: v.copy() for T, v in grads.items()}
    plan, own, segs, packets, decoded = run_hybrid_shuffle(n, r, m, d, grads)
    if r == n:
        assert not packets and not plan.family  # one sub-batch computed by everybody
    for (S, j), pkt in packets.items():
        assert pkt.dtype == np.uint32 and pkt.ndim == 1 and j in S and len(S) == m + 1
        receivers = plan.receivers(S, j)
        assert receivers
        lens = [
            piece_slices(segs[k].stop - segs[k].start, m)[label_without(S, k).index(j)]
            for k in receivers
        ]
        assert len(pkt) == max(s.stop - s.start for s in lens)
    for (S, k), got in decoded.items():
        true_v = sum_in_order([grads[T][segs[k]] for T in plan.charges[S, k]])
        cuts = piece_slices(len(true_v), m)
        for i, j in enumerate(label_without(S, k)):
            piece = decode_value_piece(
                S,
                j,
                k,
                packets[S, j],
                {i2: charged_value(plan, S, i2, own[k], segs) for i2 in plan.active(S) if i2 != k},
                len(true_v),
            )
            assert bits_equal(piece, true_v[cuts[i]]), (S, j, k)
        assert bits_equal(got, true_v), (S, k)
    for k in range(n):
        parts = [own[k][T][segs[k]] for T in subsets(n, r) if k in T]
        got = sum_in_order(parts + [decoded[S, k] for S in plan.values_for(k)])
        assert bits_equal(got, hybrid_reference(plan, grads, segs, k)), k
    for T, v in grads.items():  # nobody's input was touched
        assert bits_equal(v, pristine[T])


@pytest.mark.filterwarnings("ignore:.*encountered in add:RuntimeWarning")  # inf, NaN on purpose
def test_hybrid_special_patterns_survive():
    """Every segment of every g_T carries every pattern; the values are sums of several g_T,
    so NaN payloads, infinities and signed zeros go through the adds and then the XOR."""
    n, r, m = 6, 4, 2
    d = 2 * n * m * len(PATTERNS) + 3
    rng = np.random.default_rng(5)
    grads = {}
    for t, T in enumerate(subsets(n, r)):
        v = rng.standard_normal(d).astype(np.float32)
        v.view(np.uint32)[::2] = np.resize(np.roll(PATTERNS, t), len(v[::2]))
        grads[T] = v
    plan, _, segs, _, decoded = run_hybrid_shuffle(n, r, m, d, grads)
    assert all(len(ts) > 1 for ts in plan.charges.values())  # really sums
    for (S, k), got in decoded.items():
        assert bits_equal(got, sum_in_order([grads[T][segs[k]] for T in plan.charges[S, k]]))
    seen = {int(x) for v in decoded.values() for x in v.view(np.uint32)}
    assert {0x7F800000, 0xFF800000, 0x80000000} <= seen  # ±inf and -0.0 made it through
    assert any((x & 0x7F800000) == 0x7F800000 and x & 0x7FFFFF for x in seen)  # a NaN


def test_hybrid_skips_empty_values_and_keeps_minus_zero():
    """K=4, r=3, m=2: some v(S, k) are empty and skipped (no packet to nobody); an owner whose
    every term is -0.0 gets -0.0, not +0.0 (no accumulator starts from 0.0)."""
    n, r, m, d = 4, 3, 2, 8
    plan = hybrid_plan(n, r, m)
    empty = [(S, k) for S in plan.family for k in S if (S, k) not in plan.charges]
    assert empty
    grads = {T: np.full(d, -0.0, np.float32) for T in subsets(n, r)}
    _, own, segs, packets, decoded = run_hybrid_shuffle(n, r, m, d, grads)
    for S, k in empty:
        assert (S, k) not in decoded
        assert all(k not in plan.receivers(S2, j) for S2, j in packets if S2 == S)
    for k in range(n):
        parts = [own[k][T][segs[k]] for T in subsets(n, r) if k in T]
        got = sum_in_order(parts + [decoded[S, k] for S in plan.values_for(k)])
        assert np.all(got.view(np.uint32) == 0x80000000)
        assert np.all((np.float32(0.0) + got).view(np.uint32) == 0)  # what a 0.0 start does


@pytest.mark.filterwarnings("ignore:.*encountered in add:RuntimeWarning")  # inf, NaN on purpose
def test_hybrid_sums_whole_segments_before_cutting():
    """numpy's float32 add takes a NaN's payload from one operand in its vectorised blocks and
    may take it from the other in an array's tail, so summing piece by piece can differ from
    summing the whole segment and then cutting it. Both sides of the scheme sum whole segments;
    the decoded values equal that, and (where this numpy shows the effect) not the per-piece
    sums."""
    n, r, m, d = 6, 4, 2, 6 * 37  # segments of 37 values, pieces of 19 and 18
    grads = _nan_grads(n, r, d)
    plan, _, segs, _, decoded = run_hybrid_shuffle(n, r, m, d, grads)
    mixed = 0
    for (S, k), got in decoded.items():
        terms = [grads[T][segs[k]] for T in plan.charges[S, k]]
        whole = sum_in_order(terms)
        assert bits_equal(got, whole)
        cut = piece_slices(len(whole), m)
        pieces = np.concatenate([sum_in_order([t[c] for t in terms]) for c in cut])
        mixed += not bits_equal(pieces, whole)
    probe = sum_in_order(list(grads.values())[:2])
    if len(set(probe.view(np.uint32).tolist())) > 1:  # this numpy mixes payloads
        assert mixed > 0


def _nan_grads(n: int, r: int, d: int) -> dict:
    """Every element of ``g_T`` a quiet NaN whose payload names ``T``."""
    grads = {}
    for i, T in enumerate(subsets(n, r)):
        v = np.empty(d, np.float32)
        v.view(np.uint32)[:] = 0x7FC00001 + i
        v.setflags(write=False)
        grads[T] = v
    return grads


@pytest.mark.parametrize(("n", "r", "m", "d"), HYBRID_CASES)
def test_hybrid_packet_bytes_match_the_formula(n, r, m, d):
    """The bytes of the packets actually built equal the closed form: exactly when ``n m``
    divides ``d``, else within one element per packet (pieces are floor or ceil of d/(n m))."""
    grads = make_grads(n, r, d, np.random.default_rng([n, r, m, d, 1]), special=False)
    plan, _, _, packets, _ = run_hybrid_shuffle(n, r, m, d, grads)
    load = hybrid_shuffle(n, r, m)
    x = Fraction(d, n * m)
    mc = Fraction(sum(len(p) for p in packets.values()), n)  # elements per worker
    uc = Fraction(sum(len(p) * len(plan.receivers(S, j)) for (S, j), p in packets.items()), n)
    n_packets = sum(plan.packets(j) for j in range(n))
    n_received = sum(len(plan.receivers(S, j)) for (S, j) in packets)
    assert n_packets == len(packets)
    assert Fraction(load.multicast).limit_denominator(10**6) * d == x * n_packets / n
    assert Fraction(load.unicast).limit_denominator(10**6) * d == x * n_received / n
    assert abs(mc - x * n_packets / n) < max(1, n_packets) and 0 <= mc - x * n_packets / n
    assert abs(uc - x * n_received / n) < max(1, n_received)
    if d % (n * m) == 0:
        assert mc == x * n_packets / n and uc == x * n_received / n
    if r < n and len(plan.charges) == (m + 1) * len(plan.family):  # no empty v: the bound
        assert n_packets == (m + 1) * len(plan.family)
    # and never above the bound (m+1)|S|/(K m) per worker, units of d/K
    assert Fraction(n_packets, n * m) <= plan.bound()


def test_hybrid_order_is_observable():
    """The hybrid's bracketing gives other bits than the coded shuffle's lexicographic sum on
    some data, so `serial` must follow the scheme (the comparison above could fail)."""
    differs = 0
    for n, r, m in [(4, 2, 1), (6, 4, 2), (7, 4, 2), (8, 5, 2)]:
        d = 37
        grads = make_grads(n, r, d, np.random.default_rng([n, r, 9]), special=False)
        plan = hybrid_plan(n, r, m)
        segs = segment_slices(d, n)
        for k in range(n):
            lexicographic = sum_in_order([grads[T][segs[k]] for T in subsets(n, r)])
            differs += not bits_equal(lexicographic, hybrid_reference(plan, grads, segs, k))
    assert differs > 0
