"""The hybrid shuffle's families, found by integer programs (``scipy.optimize.milp``).

Three small programs, solved in turn for a cluster of ``n`` workers, redundancy ``r`` and
group size ``m + 1``:

1. **Least family** (a covering design): the fewest ``(m+1)``-subsets ``𝒮`` such that for every
   ``(r+1)``-set ``R`` and every ``k ∈ R`` some ``S ∈ 𝒮`` has ``k ∈ S ⊆ R``; every worker's
   degree is at least :func:`link_bound`, a cut that makes the proofs fast.
2. **Balanced family**: among families of that size, one whose largest degree (groups a worker
   belongs to) is least, so no worker sends much more than the mean.
3. **Active pairs**: on that family, the pairs ``(S, k)`` that carry a value: for every
   sub-batch ``T ∌ k`` some active ``(S, k)`` has ``S ⊆ T ∪ {k}``; fewest packets at the
   busiest sender, then fewest packets, then fewest pairs (what receivers get). Member ``j``
   of ``S`` sends a packet when some other member is active in ``S``.

Solving takes from milliseconds to minutes, and two solver versions may return two different
optima of equal cost, while the bits of ``θ`` depend on which. So the families the runs use
come from a table generated once and committed (:mod:`dcoded.coding.family_table`):
``python -m dcoded.coding.covering --max-g 9`` regenerates it, ``--resume`` adds what is
missing (a larger ``--max-g``) and keeps the rest. The solver is deterministic for
a given scipy build without a time limit; with one (the generator's default), the table
records whether each stage was proven optimal.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from dcoded.coding.helptext import help_text
from dcoded.coding.placement import Subset, subsets

TABLE = Path(__file__).with_name("family_table.py")


def candidates(n: int, m: int) -> list[Subset]:
    """Every ``(m+1)``-subset of ``range(n)``, lexicographic."""
    return list(itertools.combinations(range(n), m + 1))


def _sparse(rows: list[list[tuple[int, float]]], n_cols: int) -> coo_array:
    data, ii, jj = [], [], []
    for i, row in enumerate(rows):
        for j, v in row:
            ii.append(i)
            jj.append(j)
            data.append(v)
    return coo_array((data, (ii, jj)), shape=(len(rows), n_cols))


def _cover_rows(n: int, r: int, m: int, index: dict[Subset, int]) -> list[list[tuple[int, float]]]:
    """One row per ``(R, k)``: the candidate groups ``S`` with ``k ∈ S ⊆ R``."""
    rows = []
    for big in itertools.combinations(range(n), r + 1):
        for k in big:
            rest = [x for x in big if x != k]
            row = [(index[tuple(sorted((k, *c)))], 1.0) for c in itertools.combinations(rest, m)]
            rows.append(row)
    return rows


def _solve(c, constraints, upper, time_limit: float | None, lower=None):
    options = {"presolve": True}
    if time_limit is not None:
        options["time_limit"] = time_limit
    res = milp(
        c,
        constraints=constraints,
        integrality=np.ones(len(c)),
        bounds=Bounds(np.zeros(len(c)) if lower is None else lower, upper),
        options=options,
    )
    if res.x is None:
        return None, False
    return np.round(res.x).astype(int), res.status == 0


def link_bound(n: int, r: int, m: int, time_limit: float | None = None) -> int:
    """The least degree a worker can have in a covering family: its links ``S∖{k}`` are
    ``m``-subsets of the other ``n - 1`` workers, one inside every ``r``-subset of them (a
    Turán-type covering, solved on ``n - 1`` points). A valid cut that lets the solver prove
    the least family in seconds (``n=9, r=5, m=2``: 12 groups, not 16 after 30 s without it).

    >>> link_bound(9, 5, 2)  # the complement of a perfect matching of 8 points
    4
    """
    pts = list(itertools.combinations(range(n - 1), m))
    index = {s: i for i, s in enumerate(pts)}
    rows = [
        [(index[s], 1.0) for s in itertools.combinations(q, m)]
        for q in itertools.combinations(range(n - 1), r)
    ]
    x, optimal = _solve(
        np.ones(len(pts)),
        [LinearConstraint(_sparse(rows, len(pts)), 1, np.inf)],
        np.ones(len(pts)),
        time_limit,
    )
    # a bound must be proven: without a proof, fall back to the trivial one
    return int(x.sum()) if x is not None and optimal else 1


def least_family(
    n: int, r: int, m: int, time_limit: float | None = None
) -> tuple[list[Subset], dict[str, bool]]:
    """Stages 1 and 2: a least covering family of ``(m+1)``-subsets with the least largest
    degree among those of its size (lexicographic), and which stages were proven optimal."""
    cands = candidates(n, m)
    index = {s: i for i, s in enumerate(cands)}
    N = len(cands)
    cover = _cover_rows(n, r, m, index)
    low = link_bound(n, r, m, time_limit)
    degree_low = [[(index[s], 1.0) for s in cands if j in s] for j in range(n)]
    every = [[(i, 1.0) for i in range(N)]]
    x, size_opt = _solve(
        np.ones(N),
        [
            LinearConstraint(_sparse(cover, N), 1, np.inf),
            LinearConstraint(_sparse(degree_low, N), low, np.inf),
            LinearConstraint(_sparse(every, N), -(-n * low // (m + 1)), np.inf),
        ],
        np.ones(N),
        time_limit,
    )
    if x is None:  # no cover found in time: every (m+1)-subset covers
        x, size_opt = np.ones(N, dtype=int), False
    size = int(x.sum())
    # stage 2: variables x_S and D (the largest degree); minimise D with |𝒮| = size, where
    # D is at least the mean degree (m+1)·size/n
    degree = [[(index[s], 1.0) for s in cands if j in s] + [(N, -1.0)] for j in range(n)]
    c = np.zeros(N + 1)
    c[N] = 1.0
    y, degree_opt = _solve(
        c,
        [
            LinearConstraint(_sparse(cover, N + 1), 1, np.inf),
            LinearConstraint(_sparse(degree_low, N + 1), low, np.inf),
            LinearConstraint(_sparse(every, N + 1), size, size),
            LinearConstraint(_sparse(degree, N + 1), -np.inf, 0),
        ],
        np.r_[np.ones(N), N],
        time_limit,
        lower=np.r_[np.zeros(N), -(-(m + 1) * size // n)],
    )
    if y is None:  # nothing better found in time: keep the least family
        y, degree_opt = x, False
    family = [cands[i] for i in range(N) if y[i]]
    return family, {"size": size_opt, "degree": degree_opt}


def active_pairs(
    n: int, r: int, family: list[Subset], time_limit: float | None = None
) -> tuple[list[tuple[Subset, int]], bool]:
    """Stage 3: the pairs ``(S, k)`` that carry a value, and whether that was proven optimal.

    Variables ``a(S, k)`` (active), ``y(S, j)`` (``j`` sends in ``S``) and ``z`` (the busiest
    sender's packets); ``y(S, j) >= a(S, k)`` for ``k ∈ S∖{j}``; every ``(T, k)`` with
    ``k ∉ T`` has an active ``(S, k)``, ``S ⊆ T ∪ {k}``. Minimise ``z``, then ``Σ y``, then
    ``Σ a`` (one objective with weights that keep that order).
    """
    pairs = [(s, k) for s in family for k in s]
    P = len(pairs)
    index = {p: i for i, p in enumerate(pairs)}
    cover = []
    for label in subsets(n, r):
        for k in range(n):
            if k in label:
                continue
            big = {*label, k}
            cover.append([(index[(s, k)], 1.0) for s in family if k in s and big.issuperset(s)])
    link = [
        [(P + index[(s, j)], 1.0), (index[(s, k)], -1.0)]
        for s in family
        for j in s
        for k in s
        if k != j
    ]
    busiest = [
        [(P + index[(s, j)], 1.0) for s in family if j in s] + [(2 * P, -1.0)] for j in range(n)
    ]
    w_sends = P + 1
    w_busiest = w_sends * (P + 1)
    c = np.r_[np.ones(P), np.full(P, w_sends), w_busiest].astype(float)
    constraints = [
        LinearConstraint(_sparse(cover, 2 * P + 1), 1, np.inf),
        LinearConstraint(_sparse(busiest, 2 * P + 1), -np.inf, 0),
    ]
    if link:
        constraints.append(LinearConstraint(_sparse(link, 2 * P + 1), 0, np.inf))
    x, optimal = _solve(c, constraints, np.r_[np.ones(2 * P), P], time_limit)
    if x is None:  # nothing found in time: every pair active
        return pairs, False
    return [pairs[i] for i in range(P) if x[i]], optimal


def solve(n: int, r: int, m: int, time_limit: float | None = None) -> dict:
    """All three stages for ``(n, r, m)``: ``{"family", "active", "optimal", "seconds"}``."""
    t0 = time.perf_counter()
    family, optimal = least_family(n, r, m, time_limit)
    active, optimal["pairs"] = active_pairs(n, r, family, time_limit)
    return {
        "family": family,
        "active": active,
        "optimal": optimal,
        "seconds": time.perf_counter() - t0,
    }


def write_table(entries: dict[tuple[int, int, int], dict], path: Path = TABLE) -> None:
    """Write the table module: ``FAMILIES[(n, r, m)] = ((S, (active k, ...)), ...)``."""
    lines = [
        '"""Cached hybrid-shuffle families: generated by ``python -m dcoded.coding.covering``.',
        "",
        "Do not edit by hand. ``FAMILIES[(n, r, m)]`` is the family in lexicographic order, each",
        "group with the members ``k`` whose value ``v(S, k)`` is active; ``PROVEN[(n, r, m)]``",
        "says which stages the solver proved optimal (size, degree, pairs).",
        '"""',
        "",
        "FAMILIES = {",
    ]
    proven = []
    for key in sorted(entries):
        e = entries[key]
        act = {}
        for s, k in e["active"]:
            act.setdefault(tuple(s), []).append(k)
        lines.append(f"    {key!r}: (")
        lines += [
            f"        ({tuple(s)!r}, {tuple(sorted(act.get(tuple(s), [])))!r}),"
            for s in e["family"]
        ]
        lines.append("    ),")
        o = e["optimal"]
        proven.append(f"    {key!r}: ({o['size']}, {o['degree']}, {o['pairs']}),")
    lines += ["}", "", "PROVEN = {", *proven, "}", ""]
    path.write_text("\n".join(lines))


def read_table(path: Path = TABLE) -> dict[tuple[int, int, int], dict]:
    """The entries of a table module written by :func:`write_table`, read as literals (the
    file is parsed, never run: a ``--out`` someone else wrote runs no code of theirs)."""
    ns = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", None)
            if name in ("FAMILIES", "PROVEN"):
                try:
                    ns[name] = ast.literal_eval(node.value)
                except ValueError:
                    raise ValueError(f"{path}: {name} is not a literal table") from None
    if set(ns) != {"FAMILIES", "PROVEN"}:
        raise ValueError(f"{path} is not a table written by write_table (FAMILIES, PROVEN)")
    out = {}
    for key, groups in ns["FAMILIES"].items():
        size, degree, pairs = ns["PROVEN"][key]
        out[key] = {
            "family": [s for s, _ in groups],
            "active": [(s, k) for s, ks in groups for k in ks],
            "optimal": {"size": size, "degree": degree, "pairs": pairs},
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dcoded.coding.covering",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--max-g", type=int, default=9, help="largest cluster size n")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per stage")
    parser.add_argument("--out", type=Path, default=TABLE)
    parser.add_argument(
        "--resume", action="store_true", help="keep the entries already in --out, solve the rest"
    )
    args = parser.parse_args(argv)
    entries = read_table(args.out) if args.resume and args.out.exists() else {}
    for n in range(2, args.max_g + 1):
        for r in range(1, n):
            for m in range(1, r):  # m = r is CDC itself: every (r+1)-set, nothing to solve
                if (n, r, m) in entries:
                    continue
                e = solve(n, r, m, args.time_limit)
                entries[(n, r, m)] = e
                print(
                    f"n={n} r={r} m={m} |S|={len(e['family'])} active={len(e['active'])} "
                    f"optimal={e['optimal']} {e['seconds']:.2f}s",
                    flush=True,
                )
                write_table(entries, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
