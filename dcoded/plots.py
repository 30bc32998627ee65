"""Figures shared by the notebooks and ``paper/``: they only read results and draw.

Every function takes a matplotlib ``Axes`` and returns it, so callers compose figures freely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dcoded.coding import Placement, load_table
from dcoded.results import PHASES, read_history


def placement(p: Placement, ax, cluster: int = 0):
    """Who computes which sub-batch (rows: workers; columns: sub-batches ``T``)."""
    held = np.array([[local in t for t in p.sub_batches] for local in range(p.g)], dtype=float)
    ax.imshow(held, cmap="Blues", vmin=0, vmax=1.4, aspect="auto")
    ax.set_xticks(range(p.n_sub_batches), ["".join(map(str, t)) for t in p.sub_batches])
    ax.set_yticks(range(p.g), [f"worker {p.global_id(cluster, i)}" for i in range(p.g)])
    ax.set_xlabel("sub-batch T")
    ax.set_title(f"placement: K={p.n_workers}, r={p.redundancy}, g={p.g}")
    return ax


def loads(n_workers: int, ax, group_size: int | None = None):
    """Closed-form communication per worker per step (units of d) against ``r``.

    Curves can coincide: the uncoded shuffle's count equals the coded shuffle's unicast count
    at every ``r`` (a coded packet for ``r`` receivers is sent ``r`` times without multicast),
    and at small ``g`` all four shuffle curves can be one. Each shuffle curve is drawn thinner
    than the one before it, the first ones as wide pale bands, so that every one shows.
    """
    rows = load_table(n_workers, group_size)
    r = [row["r"] for row in rows]
    for key, label, style in [
        ("uncoded_uc", "uncoded", {"lw": 9, "alpha": 0.3, "marker": "s", "ms": 11}),
        ("reduce_scatter", "summed reduce-scatter", {"lw": 5, "alpha": 0.5, "marker": "^"}),
        ("coded_mc", "coded, multicast", {"lw": 2.5, "marker": "o"}),
        ("coded_uc", "coded, unicast", {"lw": 1.5, "ls": "--", "marker": "o", "mfc": "none"}),
        ("ring_allreduce", "ring all-reduce", {"lw": 3, "ls": ":"}),  # = the server at K=2
        ("param_server_up", "parameter server (up)", {"ls": "-."}),
    ]:
        ax.plot(r, [row[key] for row in rows], label=label, **style)
    ax.set_xticks(r)
    ax.set_xlabel("redundancy r")
    ax.set_ylabel("per worker per step (units of d)")
    ax.set_title(f"communication loads, K={n_workers}")
    ax.legend(fontsize="small")
    return ax


def topology_bounds(n_workers: int, axes):
    """What one step needs on a switch and on a bus against ``r`` (two ``Axes``), per scheme,
    in units of ``d`` (:func:`dcoded.coding.loads.step_bounds`): over a link's rate, the
    step's communication time bound there."""
    from dcoded.coding.loads import step_bounds

    rows = [row for r in range(1, n_workers + 1) for row in step_bounds(n_workers, r)]
    for ax, where in zip(axes, ("switch", "bus"), strict=True):
        for scheme in dict.fromkeys(row["scheme"] for row in rows):
            mine = [row for row in rows if row["scheme"] == scheme]
            ax.plot([row["r"] for row in mine], [row[where] for row in mine], "o-", label=scheme)
        ax.set_xticks(range(1, n_workers + 1))
        ax.set_xlabel("redundancy r")
        ax.set_ylabel("per step (units of d)")
        ax.set_title(f"{where}: " + ("busiest host" if where == "switch" else "all on the medium"))
    axes[0].legend(fontsize="small")
    return axes


#: The bar segment of the step time that no phase accounts for.
OTHER = "other: scheduling, waits"


def stacked(summary: Mapping) -> dict[str, float]:
    """Each phase's median in seconds, as they add up: ``ddp``'s all-reduce (its ``shuffle``)
    runs inside its backward pass, so its ``map`` counts here without it.

    >>> stacked({"algorithm": "ddp", "time_s": {"map": 0.05, "shuffle": 0.02}})["map"]
    0.030000000000000002
    """
    t = {p: summary["time_s"].get(p) or 0.0 for p in PHASES}
    if summary.get("algorithm") == "ddp":
        t["map"] = max(0.0, t["map"] - t["shuffle"])
    return t


def unaccounted(summary: Mapping) -> float:
    """Seconds of the median step that no phase's median covers: the scheduler's and the
    driver's round trips, waits for the slowest worker, serialisation (never below 0).

    >>> unaccounted({"time_s": {"step_median": 0.1, "map": 0.03, "shuffle": 0.02}})
    0.05
    """
    return max(0.0, summary["time_s"]["step_median"] - sum(stacked(summary).values()))


def phases(summaries: Sequence[Mapping], ax, label=lambda s: str(s["redundancy"])):
    """Median time per step split by phase (stacked bars), one bar per run; what the phases
    do not cover is a segment of its own (:data:`OTHER`), so every bar reaches the step."""
    bottom = np.zeros(len(summaries))
    for phase in PHASES:
        ms = np.array([1e3 * stacked(s)[phase] for s in summaries])
        ax.bar(range(len(summaries)), ms, bottom=bottom, label=phase)
        bottom += ms
    gap = np.array([1e3 * unaccounted(s) for s in summaries])
    ax.bar(
        range(len(summaries)),
        gap,
        bottom=bottom,
        label=OTHER,
        color="0.85",
        hatch="//",
        edgecolor="0.5",
    )
    steps = [1e3 * s["time_s"]["step_median"] for s in summaries]
    ax.plot(range(len(summaries)), steps, "k_", markersize=20, label="step (median)")
    ax.set_xticks(range(len(summaries)), [label(s) for s in summaries])
    ax.set_ylabel("ms per step")
    ax.legend(fontsize="small")
    return ax


def accuracy_vs_time(runs: Mapping[str, str | Path], ax):
    """Test accuracy against training wall time, one line per run directory."""
    for name, run_dir in runs.items():
        rows = [r for r in read_history(run_dir) if r["test_accuracy"]]
        ax.plot(
            [float(r["wall_s"]) for r in rows],
            [float(r["test_accuracy"]) for r in rows],
            "o-",
            label=name,
        )
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize="small")
    return ax
