"""Figure 7: beyond the paper, the hybrid shuffle (CDC's XOR packets over pre-added parts)
against CDC's coded shuffle and the summed shuffle, at K = 8, against r: what a worker sends
(a multicast packet once), what it receives, and what one shared medium carries.

Closed forms of the families and charging rules the runs use
(:func:`dcoded.coding.loads.exchange_table`), so it needs no sweep; the measured side is
``python -m dcoded.bench --workers 8 --topology bus --transports multicast``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dcoded.coding.loads import exchange_table
from paper import output, paths

K = 8
SCHEMES = ("coded", "summed", "hybrid")
COLUMNS = [
    "r",
    "hybrid_m",
    *(f"{s}_{x}" for s in SCHEMES for x in ("sent", "received", "bus")),
    "hybrid_vs_coded_bus",
    "hybrid_vs_summed_bus",
    "best_switch",
    "best_bus",
]


def compute(results: Path | None = None, size: str | None = None) -> list[dict]:
    """One row per r (units of d/K per worker; bus: all workers)."""
    rows = []
    for row in exchange_table(K):
        out = {"r": row["r"], "hybrid_m": row["hybrid_m"]}
        for s in SCHEMES:
            p = row[s]
            out |= {
                f"{s}_sent": float(p.egress_max),
                f"{s}_received": float(p.ingress_max),
                f"{s}_bus": float(p.bus),
            }
        for other in ("coded", "summed"):
            base = out[f"{other}_bus"]
            out[f"hybrid_vs_{other}_bus"] = out["hybrid_bus"] / base if base else None
        out |= {"best_switch": row["best_switch"], "best_bus": row["best_bus"]}
        rows.append(out)
    return rows


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    rows = compute()
    plt = output.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    r = [x["r"] for x in rows]
    for s, marker in zip(SCHEMES, "o^s", strict=True):
        axes[0].plot(r, [float(x[f"{s}_sent"]) for x in rows], marker=marker, label=f"{s}, sent")
        axes[0].plot(
            r,
            [float(x[f"{s}_received"]) for x in rows],
            marker=marker,
            ls=":",
            label=f"{s}, received",
        )
        axes[1].plot(r, [float(x[f"{s}_bus"]) for x in rows], marker=marker, label=s)
    axes[0].set_title(f"K={K}: per worker (busiest), units of d/{K}")
    axes[1].set_title(f"K={K}: on one shared medium (all workers), units of d/{K}")
    for ax in axes:
        ax.set_xlabel("redundancy r")
        ax.set_xticks(r)
        ax.set_yscale("symlog", linthresh=1)
        ax.legend(fontsize=8)
    output.save_figure(fig, paths.figures(out) / "fig7_hybrid.png")
    output.write_table(
        rows,
        COLUMNS,
        paths.tables(out) / "fig7_hybrid",
        f"Figure 7: the gradient exchange at K = {K} in units of d/{K}; sent and received at "
        "the busiest worker, bus: what one shared medium carries (a multicast packet once); "
        "hybrid at its m of least load.",
    )


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_hybrid"))
