"""Figures shared by the notebooks and ``paper/``: they only read results and draw.

Every function takes a matplotlib ``Axes`` and returns it, so callers compose figures freely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dcoded.coding import Placement, load_table
from dcoded.results import read_history

PHASES = ("map", "encode", "shuffle", "decode", "update", "params")


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
    """Closed-form communication per worker per step (units of d) against ``r``."""
    rows = load_table(n_workers, group_size)
    r = [row["r"] for row in rows]
    for key, label, style in [
        ("coded_mc", "coded, multicast", "o-"),
        ("coded_uc", "coded, unicast", "o--"),
        ("uncoded_uc", "uncoded", "s-"),
        ("reduce_scatter", "summed reduce-scatter", "^-"),
        ("ring_allreduce", "ring all-reduce", ":"),
        ("param_server_up", "parameter server (up)", "-."),
    ]:
        ax.plot(r, [row[key] for row in rows], style, label=label)
    ax.set_xticks(r)
    ax.set_xlabel("redundancy r")
    ax.set_ylabel("per worker per step (units of d)")
    ax.set_title(f"communication loads, K={n_workers}")
    ax.legend(fontsize="small")
    return ax


def phases(summaries: Sequence[Mapping], ax, label=lambda s: str(s["redundancy"])):
    """Median time per step split by phase (stacked bars), one bar per run."""
    bottom = np.zeros(len(summaries))
    for phase in PHASES:
        ms = np.array([1e3 * (s["time_s"].get(phase) or 0.0) for s in summaries])
        ax.bar(range(len(summaries)), ms, bottom=bottom, label=phase)
        bottom += ms
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
