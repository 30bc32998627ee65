"""The hybrid shuffle: CDC's XOR exchange on pre-summed values, in groups of ``m + 1``.

In a cluster of ``n`` workers with redundancy ``r``, choose ``1 <= m <= r`` and a family ``𝒮``
of ``(m+1)``-subsets such that for every ``(r+1)``-set ``R`` and every ``k ∈ R`` some
``S ∈ 𝒮`` has ``k ∈ S ⊆ R``. Every sub-batch ``T ∌ k`` is *charged* to one pair ``(S, k)``
with ``S ⊆ T ∪ {k}``, and

    v(S, k) = Σ_{T charged to (S, k)} seg_k(g_T)      (lexicographic order of T)

is known to every member of ``S∖{k}`` (each holds every such ``T``). Inside ``S`` the values
``v(S, ·)`` are exchanged as CDC exchanges single sub-batch values: ``v(S, k)`` is cut into ``m``
pieces, piece ``i`` carried by the ``i``-th member of ``S∖{k}``, and member ``j`` multicasts
``P(S, j) = XOR_{k ∈ S∖{j}, v(S, k) non-empty} piece_j(v(S, k))`` to the others. ``m = r``
with every ``(r+1)``-set is CDC; ``m = 1`` is a summed shuffle.

Owner ``k`` then forms ``G[k]`` as its own ``seg_k(g_T)`` (``T ∋ k``, lexicographic), then the
``v(S, k)`` in family order, every accumulator starting from its first term
(:func:`~dcoded.coding.codec.sum_in_order`); ``serial`` mirrors that order.

The family, the active pairs (those ``(S, k)`` that carry a value) and the charging rule (each
``T`` goes to the first active ``S`` in family order) are a pure function of ``(n, r, m)``:
read from the committed :mod:`dcoded.coding.family_table` (``n <= 9``), CDC's own family at
``m = r``, else solved once per process by :mod:`dcoded.coding.covering`. Per worker in units
of ``d/n``, the multicast load is at most ``(m+1)·|𝒮|/(n m)`` (exact when no ``v`` is empty).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from fractions import Fraction
from math import comb

import numpy as np

from dcoded.coding.codec import sum_in_order
from dcoded.coding.placement import Subset, subsets

Pair = tuple[Subset, int]

#: The charging rule, as recorded in ``summary.json``.
CHARGING_RULE = "each T to the first active group S ⊆ T ∪ {k} in family order"


def feasible_m(n: int, r: int) -> range:
    """The allowed ``m``: ``1..r`` (groups of ``2..r+1`` workers).

    >>> list(feasible_m(6, 4))
    [1, 2, 3, 4]
    """
    return range(1, r + 1)


def check_m(n: int, r: int, m) -> None:
    """Raise ``ValueError`` naming ``hybrid_m`` and the allowed range."""
    allowed = feasible_m(n, r)
    if isinstance(m, bool) or not isinstance(m, int) or m not in allowed:
        raise ValueError(
            f"hybrid_m={m!r} is not allowed with redundancy={r}: it must be an integer in "
            f"1..{r} (groups of m+1 workers, 2 <= m+1 <= r+1), or null for the least load"
        )


def covers(n: int, r: int, family) -> bool:
    """Brute force: every ``(r+1)``-set ``R`` and ``k ∈ R`` has some ``S ∈ family`` with
    ``k ∈ S ⊆ R``."""
    sets = [frozenset(s) for s in family]
    return all(
        any(k in s and s <= frozenset(big) for s in sets)
        for big in itertools.combinations(range(n), r + 1)
        for k in big
    )


@dataclass(frozen=True)
class HybridPlan:
    """The hybrid shuffle of one cluster: family, charges and who sends what.

    >>> p = hybrid_plan(6, 4, 2)
    >>> p.family
    ((0, 1, 2), (0, 3, 4), (1, 3, 5), (2, 4, 5))
    >>> p.charges[((0, 1, 2), 0)]
    ((1, 2, 3, 4), (1, 2, 3, 5), (1, 2, 4, 5))
    """

    n: int
    r: int
    m: int
    #: the groups, lexicographic
    family: tuple[Subset, ...]
    #: ``(S, k) -> T``s charged to it (lexicographic); only non-empty pairs, in family order
    charges: dict[Pair, tuple[Subset, ...]]

    def active(self, group: Subset) -> list[int]:
        """Members ``k`` of ``group`` with a non-empty ``v(S, k)``."""
        return [k for k in group if (group, k) in self.charges]

    def values_for(self, k: int) -> list[Subset]:
        """The groups whose ``v(S, k)`` owner ``k`` receives, in family order."""
        return [s for s in self.family if (s, k) in self.charges]

    def receivers(self, group: Subset, sender: int) -> list[int]:
        """Who needs ``P(S, j)``: the active members other than the sender (empty: no packet)."""
        return [k for k in self.active(group) if k != sender]

    def sends(self, j: int) -> list[tuple[Subset, list[int]]]:
        """``(S, receivers)`` of every packet worker ``j`` sends, in family order."""
        out = []
        for s in self.family:
            if j in s:
                receivers = self.receivers(s, j)
                if receivers:
                    out.append((s, receivers))
        return out

    def packets(self, j: int) -> int:
        return len(self.sends(j))

    def egress(self, j: int) -> Fraction:
        """What ``j`` multicasts, in units of ``d/n``: one piece of ``1/m`` per packet."""
        return Fraction(self.packets(j), self.m)

    def ingress(self, k: int) -> int:
        """What ``k`` receives, in units of ``d/n``: ``m`` pieces of each of its values."""
        return len(self.values_for(k))

    def bound(self) -> Fraction:
        """The issue's upper bound ``(m+1)·|𝒮|/(n m)`` per worker, units of ``d/n``."""
        return Fraction((self.m + 1) * len(self.family), self.n * self.m)

    def summary(self) -> dict:
        """What ``summary.json`` records: the family and the active pairs."""
        return {
            "m": self.m,
            "family": [list(s) for s in self.family],
            "active": [[list(s), k] for (s, k) in self.charges],
            "charging": CHARGING_RULE,
        }


def _cdc_family(n: int, r: int) -> tuple[tuple[Subset, ...], list[Pair]]:
    family = tuple(itertools.combinations(range(n), r + 1))
    return family, [(s, k) for s in family for k in s]


def _stored(n: int, r: int, m: int) -> tuple[tuple[Subset, ...], list[Pair]]:
    if r >= n:  # one sub-batch computed by everybody: nothing is shuffled
        return (), []
    if m == r:
        return _cdc_family(n, r)
    from dcoded.coding.family_table import FAMILIES

    entry = FAMILIES.get((n, r, m))
    if entry is None:
        from dcoded.coding.covering import solve

        found = solve(n, r, m)
        return tuple(found["family"]), found["active"]
    family = tuple(s for s, _ in entry)
    return family, [(s, k) for s, ks in entry for k in ks]


def charge(n: int, r: int, family, active) -> dict[Pair, tuple[Subset, ...]]:
    """Each ``(T, k)``, ``k ∉ T``, to the first active ``(S, k)`` in family order with
    ``S ⊆ T ∪ {k}``; only the pairs that got something, in family order, then ``k``."""
    live = set(active)
    got: dict[Pair, list[Subset]] = {}
    for label in subsets(n, r):
        for k in range(n):
            if k in label:
                continue
            big = {*label, k}
            for s in family:
                if (s, k) in live and big.issuperset(s):
                    got.setdefault((s, k), []).append(label)
                    break
            else:
                raise ValueError(f"no active group for sub-batch {label} at owner {k}")
    return {(s, k): tuple(got[(s, k)]) for s in family for k in s if (s, k) in got}


@functools.cache
def hybrid_plan(n: int, r: int, m: int) -> HybridPlan:
    """The plan of ``(n, r, m)``: always the same family and charges (the bits depend on it)."""
    check_m(n, r, m)
    family, active = _stored(n, r, m)
    if not covers(n, r, family):
        raise ValueError(f"the stored family of n={n}, r={r}, m={m} does not cover")
    return HybridPlan(n, r, m, family, charge(n, r, family, active))


def charged_value(plan: HybridPlan, group: Subset, k: int, grads, segments) -> np.ndarray:
    """``v(S, k)``: the charged ``seg_k(g_T)`` summed whole, in lexicographic order of ``T``
    (whole, then cut: numpy's float32 add takes NaN payloads differently in an array's tail)."""
    seg = segments[k]
    return sum_in_order([grads[t][seg] for t in plan.charges[(group, k)]])


@dataclass(frozen=True)
class Profile:
    """A gradient exchange per worker, units of ``d/n`` (one segment): ``egress`` what a
    worker sends (a multicast packet once), ``ingress`` what it receives, ``bus`` the sum of
    every worker's egress (one shared medium)."""

    egress_mean: Fraction
    egress_max: Fraction
    ingress_mean: Fraction
    ingress_max: Fraction
    bus: Fraction


def profile(n: int, r: int, scheme: str, m: int | None = None) -> Profile:
    """:class:`Profile` of ``coded``, ``summed`` or ``hybrid`` (at ``m``, default the best).

    >>> profile(8, 5, "coded").egress_mean, profile(8, 5, "summed").egress_mean
    (Fraction(21, 5), Fraction(3, 1))
    >>> float(profile(8, 5, "hybrid").egress_mean)
    1.5
    """
    if scheme == "coded":
        c = comb(n - 1, r)
        e = Fraction(c, r) if r < n else Fraction(0)
        return Profile(e, e, Fraction(c), Fraction(c), n * e)
    if scheme == "summed":
        e = Fraction(n - r)
        return Profile(e, e, e, e, n * e)
    if scheme != "hybrid":
        raise ValueError(f"no profile for scheme {scheme!r}")
    plan = hybrid_plan(n, r, best_m(n, r) if m is None else m)
    eg = [plan.egress(j) for j in range(n)]
    ing = [Fraction(plan.ingress(k)) for k in range(n)]
    return Profile(sum(eg) / n, max(eg), sum(ing) / n, max(ing), sum(eg))


@functools.cache
def best_m(n: int, r: int) -> int:
    """The ``m`` with the least load: least bus total (mean egress), then least busiest
    sender, then least mean ingress, then the smallest ``m``.

    >>> [best_m(8, r) for r in range(1, 8)]
    [1, 1, 1, 2, 2, 3, 7]
    """

    def cost(m: int):
        p = profile(n, r, "hybrid", m)
        return (p.bus, p.egress_max, p.ingress_mean, m)

    return min(feasible_m(n, r), key=cost)
