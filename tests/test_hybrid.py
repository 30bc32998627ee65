"""The hybrid shuffle's families and charges, checked by brute force for every K <= 9."""

from __future__ import annotations

import itertools
import time
from fractions import Fraction
from math import comb

import pytest

from dcoded.coding import best_m, check_m, covers, hybrid_plan, profile, subsets
from dcoded.coding.covering import link_bound, read_table, solve, write_table
from dcoded.coding.family_table import FAMILIES, PROVEN

NRM = [
    pytest.param(n, r, m, id=f"K{n}-r{r}-m{m}")
    for n in range(2, 10)
    for r in range(1, n + 1)
    for m in range(1, r + 1)
]


def brute_covers(n: int, r: int, family) -> bool:
    """Independently of ``covers``: every (r+1)-set R and k in R has k in S, S inside R."""
    for big in itertools.combinations(range(n), r + 1):
        for k in big:
            if not any(k in s and set(s) <= set(big) for s in family):
                return False
    return True


@pytest.mark.parametrize(("n", "r", "m"), NRM)
def test_family_covers_and_charges_are_sound(n, r, m):
    plan = hybrid_plan(n, r, m)
    fam = plan.family
    assert list(fam) == sorted(set(fam)) and all(len(s) == m + 1 for s in fam)
    assert all(list(s) == sorted(s) and max(s) < n for s in fam)
    assert brute_covers(n, r, fam) and covers(n, r, fam)
    # every T without k is charged once, to a pair (S, k) with k in S inside T + {k}
    seen = {}
    for (S, k), labels in plan.charges.items():
        assert S in fam and k in S and labels
        assert list(labels) == sorted(labels)  # summed in lexicographic order of T
        for T in labels:
            assert k not in T and set(S) <= {*T, k}
            assert all(j in T for j in S if j != k)  # every other member holds T
            assert (T, k) not in seen
            seen[T, k] = S
    assert len(seen) == n * comb(n - 1, r) if r < n else not seen
    # the rule: the first group of the family, among the active pairs, that fits
    active = set(plan.charges)
    for (T, k), S in seen.items():
        first = next(s for s in fam if (s, k) in active and set(s) <= {*T, k})
        assert S == first
    # the sum-aware bound on the receive side: nobody gets fewer than K - r segments
    for k in range(n):
        assert plan.ingress(k) >= n - r


def test_the_bound_is_exact_without_empty_values():
    for n, r, m in [(4, 2, 2), (6, 4, 2), (7, 4, 2), (8, 5, 2)]:
        plan = hybrid_plan(n, r, m)
        assert len(plan.charges) == (m + 1) * len(plan.family)  # no empty v(S, k)
        assert sum(plan.egress(j) for j in range(n)) / n == plan.bound()


def test_m_equal_r_is_cdc_and_m_one_needs_degree_k_minus_r():
    for n in range(2, 10):
        for r in range(1, n):
            cdc = hybrid_plan(n, r, r)
            assert cdc.family == tuple(itertools.combinations(range(n), r + 1))
            assert all(
                labels == (tuple(x for x in S if x != k),) for (S, k), labels in cdc.charges.items()
            )
            pairs = hybrid_plan(n, r, 1)
            for k in range(n):  # k's partners must meet every r-subset of the others
                assert sum(k in s for s in pairs.family) >= n - r
            assert link_bound(n, r, 1) == n - r


def test_plans_are_a_pure_function_and_fast():
    """Same family, same charges, every time (the bits of θ depend on them), read from the
    committed table in well under a second a plan."""
    before = {(n, r, m): hybrid_plan(n, r, m) for n, r, m in FAMILIES}
    hybrid_plan.cache_clear()
    t0 = time.perf_counter()
    after = {(n, r, m): hybrid_plan(n, r, m) for n, r, m in FAMILIES}
    elapsed = time.perf_counter() - t0
    assert before == after
    assert elapsed < 10.0, elapsed
    assert {(n, r, m) for n in range(3, 10) for r in range(2, n) for m in range(1, r)} == set(
        FAMILIES
    )
    # the generator proved nearly every stage optimal; which were not is on record
    assert set(PROVEN) == set(FAMILIES)


@pytest.mark.parametrize(
    ("n", "r", "m"), [(n, r, m) for n in range(3, 7) for r in range(2, n) for m in range(1, r)]
)
def test_table_matches_the_solver(n, r, m):
    """A fresh solve (small K) finds a family of the same size and pairs of the same cost;
    the table, not the solver, fixes which of equal optima a run uses."""
    found = solve(n, r, m)
    plan = hybrid_plan(n, r, m)
    assert len(found["family"]) == len(plan.family)
    assert PROVEN[(n, r, m)] == (True, True, True)
    assert brute_covers(n, r, found["family"])


# K, r: CDC, summed and the hybrid at its best m, in units of d/K per worker (the issue's)
ISSUE = [
    (4, 2, Fraction(3, 2), 2, Fraction(3, 2)),
    (6, 4, Fraction(5, 4), 2, Fraction(1)),
    (7, 4, Fraction(15, 4), 3, Fraction(3, 2)),
    (8, 5, Fraction(21, 5), 3, Fraction(3, 2)),
    (8, 6, Fraction(7, 6), 2, Fraction(5, 6)),
    (9, 5, Fraction(56, 5), 4, Fraction(2)),
]


@pytest.mark.parametrize(("n", "r", "cdc", "summed", "hybrid"), ISSUE)
def test_the_issue_numbers(n, r, cdc, summed, hybrid):
    assert profile(n, r, "coded").egress_mean == cdc
    assert profile(n, r, "summed").egress_mean == summed
    assert profile(n, r, "hybrid").egress_mean == hybrid
    assert profile(n, r, "hybrid", best_m(n, r)).egress_mean == hybrid


def test_best_m_is_the_least_load():
    for n in range(2, 10):
        for r in range(1, n + 1):
            m = best_m(n, r)
            bus = {mm: profile(n, r, "hybrid", mm).bus for mm in range(1, r + 1)}
            assert bus[m] == min(bus.values())
            # never worse than the summed shuffle or CDC on a bus
            assert bus[m] <= profile(n, r, "summed").bus
            assert bus[m] <= profile(n, r, "coded").bus


@pytest.mark.parametrize("bad", [0, 3, -1, 1.5, "2", True, None])
def test_check_m_names_the_range(bad):
    with pytest.raises(ValueError, match=r"hybrid_m=.* 1\.\.2"):
        check_m(4, 2, bad)


def test_link_bound():
    assert link_bound(9, 5, 2) == 4  # 8 points, every 5-set holds an edge: a perfect matching
    assert link_bound(6, 4, 2) == 2
    for n, r in [(5, 2), (7, 3)]:
        assert link_bound(n, r, r) == comb(n - 1, r)  # m = r: every r-subset itself
    assert subsets(3, 2) == [(0, 1), (0, 2), (1, 2)]


def test_the_table_is_read_back_as_written_and_never_run(tmp_path):
    """``--resume`` read the table by running it: a ``--out`` from someone else ran their code.
    It is parsed now: the committed table reads back as the module has it, one written by
    :func:`write_table` round-trips, and a file with code in it is refused unrun."""
    table = read_table()
    assert {k: tuple((tuple(s), ks) for s, ks in v) for k, v in FAMILIES.items()} == {
        k: tuple(
            (tuple(s), tuple(sorted(j for t, j in e["active"] if tuple(t) == tuple(s))))
            for s in e["family"]
        )
        for k, e in table.items()
    }
    assert {k: tuple(e["optimal"].values()) for k, e in table.items()} == PROVEN
    some = {k: table[k] for k in list(table)[:3]}
    write_table(some, tmp_path / "t.py")
    assert read_table(tmp_path / "t.py") == some
    touched = tmp_path / "touched"
    hostile = tmp_path / "h.py"
    hostile.write_text(f"FAMILIES = open({str(touched)!r}, 'w') and {{}}\nPROVEN = {{}}\n")
    with pytest.raises(ValueError, match="FAMILIES is not a literal table"):
        read_table(hostile)
    hostile.write_text(f"open({str(touched)!r}, 'w')\n")
    with pytest.raises(ValueError, match="is not a table written by write_table"):
        read_table(hostile)
    assert not touched.exists()
