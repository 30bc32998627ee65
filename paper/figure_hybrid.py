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


#: Its section of the report: the title, the sweeps it reads (the section says "not run" where
#: one has not) and the figures it shows.
TITLE = "Beyond the paper (Figure 7): a coded shuffle that also sums"
READS = ()  # closed forms: no sweep
FIGURES = ("fig7_hybrid.png",)


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


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    rows = compute()
    plt = output.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
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
    axes[0].set_title(f"K={K}: per worker (the busiest)")
    axes[1].set_title(f"K={K}: on one shared medium (all workers)")
    for ax in axes:
        ax.set_xlabel("redundancy r")
        ax.set_xticks(r)
        ax.set_yscale("symlog", linthresh=1)  # r = K sends nothing: 0 on the axis
        ax.set_ylim(bottom=0)
        ax.set_ylabel(f"units of d/{K} (0, then log above 1)")
        ax.grid(alpha=0.3)
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


def section(results: Path, size: str) -> str:
    """What the hybrid shuffle adds to the paper (closed forms of the families the runs use)."""
    rows = compute()
    shown = ["r", "hybrid_m", "coded_bus", "summed_bus", "hybrid_bus", "best_switch", "best_bus"]
    out = [output.markdown(rows, shown)]
    five = next(x for x in rows if x["r"] == 5)
    out.append(
        f"- CDC codes single sub-batch gradients and never adds them, so its traffic grows like "
        f"C(K-1, r): at K = {K}, r = 5 its packets carry {five['coded_bus']:.1f} "
        f"units of d/{K} on a shared medium, more than the summed shuffle's "
        f"{five['summed_bus']:.1f}. The hybrid codes over pre-added parts in groups of "
        f"m + 1 = {five['hybrid_m'] + 1} and carries {five['hybrid_bus']:.1f}: "
        f"{five['hybrid_vs_coded_bus']:.2f}x CDC's and {five['hybrid_vs_summed_bus']:.2f}x the "
        "summed shuffle's. No receiver gets less than the summed shuffle's (K - r)/K, so on a "
        "switch the hybrid ties it at best; it wins where sending is the cost (a bus)."
    )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_hybrid"))
