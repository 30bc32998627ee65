"""Figure 5: how cdc's best r moves with the links' rate.

Reads ``paper_bandwidth`` (cdc at every r, at several ``cluster.bandwidth_mbit``). A larger r
computes more (each sub-batch r times) and sends less (``C(K-1, r) / K`` of d per worker, zero
at ``r = K``), so the slower the links, the larger the best r should be.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from paper import output, paths
from paper.results import Run, load

#: Its section of the report: the title, the sweeps it reads (the section says "not run" where
#: one has not) and the figures it shows.
TITLE = "Result 5 (Figure 5): the best r against bandwidth"
READS = ("paper_bandwidth",)
FIGURES = ("fig5_bandwidth.png",)


def grid(results: Path, size: str) -> dict[str, dict[float, dict[int, Run]]]:
    """``model -> rate -> r -> run``."""
    out: dict[str, dict[float, dict[int, Run]]] = {}
    for r in load(results, size, "paper_bandwidth"):
        out.setdefault(r["model"], {}).setdefault(r.bandwidth_mbit, {})[r["redundancy"]] = r
    return out


def compute(results: Path, size: str) -> tuple[list[dict], list[str]]:
    rows, rs = [], set()
    for model, rates in grid(results, size).items():
        for rate in sorted(rates):
            by_r = rates[rate]
            rs |= set(by_r)
            ms = {r: 1e3 * run["time_s"]["step_median"] for r, run in by_r.items()}
            rows.append(
                {
                    "model": model,
                    "mbit_s": rate,
                    **{f"r{r}_ms": v for r, v in ms.items()},
                    "best_r": min(ms, key=ms.get),
                }
            )
    return rows, ["model", "mbit_s", *(f"r{r}_ms" for r in sorted(rs)), "best_r"]


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    plt = output.pyplot()
    data = grid(results, size)
    fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 4), squeeze=False)
    for ax, (model, rates) in zip(axes[0], data.items(), strict=True):
        xs = sorted(rates)
        for r in sorted({r for by_r in rates.values() for r in by_r}):
            ax.plot(
                xs, [1e3 * rates[x][r]["time_s"]["step_median"] for x in xs], "o-", label=f"r={r}"
            )
        best = [min(rates[x].values(), key=lambda run: run["time_s"]["step_median"]) for x in xs]
        ax.plot(
            xs,
            [1e3 * b["time_s"]["step_median"] for b in best],
            "k*",
            ms=14,
            mfc="none",
            label="best r",
        )
        for x, b in zip(xs, best, strict=True):
            ax.annotate(
                f"r={b['redundancy']}",
                (x, 1e3 * b["time_s"]["step_median"]),
                textcoords="offset points",
                xytext=(4, 8),
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link rate (Mbit/s, every link, both ways)")
        ax.set_ylabel("median ms per step")
        ax.set_title(f"{model}: cdc step time against link rate")
        ax.legend(fontsize="small")
    output.save_figure(fig, paths.figures(out) / "fig5_bandwidth.png")
    rows, columns = compute(results, size)
    output.write_table(
        rows,
        columns,
        paths.tables(out) / "fig5_bandwidth",
        "Figure 5: cdc's median ms per step at every r and link rate, and the fastest r.",
    )


def section(results: Path, size: str) -> str:
    rows, columns = compute(results, size)
    out = [output.markdown(rows, columns)]
    by_model = grid(results, size)
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = sorted((r for r in rows if r["model"] == model), key=lambda r: r["mbit_s"])
        best = [r["best_r"] for r in mine]
        if len(set(best)) == 1:
            trend = (
                f"the best r stays at {best[0]} over the whole range swept; the cross-over lies "
                "outside it"
            )
        elif all(a >= b for a, b in itertools.pairwise(best)):
            trend = "the best r rises as the links get slower, as the trade-off predicts"
        else:
            trend = "the best r does not move steadily with the rate here (noise, or a tie)"
        out.append(
            f"- {model}: best r "
            + ", ".join(f"{r['best_r']} at {r['mbit_s']:g} Mbit/s" for r in mine)
            + f": {trend}."
        )
        rates = by_model[model]
        slow, fast = min(rates), max(rates)
        lo, hi = min(rates[fast]), max(rates[fast])
        if lo != hi:
            extra = 1e3 * (rates[fast][hi]["time_s"]["map"] - rates[fast][lo]["time_s"]["map"])
            K = rates[fast][lo]["n_workers"]
            gathered = [1e3 * run["time_s"]["params"] for r, run in rates[slow].items() if r < K]
            theta = (
                f"; the all-gather of θ ({min(gathered):.0f}–{max(gathered):.0f} ms at "
                f"{slow:g} Mbit/s) is paid at every r < K and not at r = K = {K}, where every "
                "worker updates all of θ itself"
                if gathered
                else ""
            )
            out.append(
                f"  Going from r = {lo} to r = {hi} costs {extra:.0f} ms more computing per step "
                f"and saves the shuffle, {1e3 * rates[slow][lo]['time_s']['shuffle']:.0f} ms at "
                f"{slow:g} Mbit/s and {1e3 * rates[fast][lo]['time_s']['shuffle']:.0f} ms at "
                f"{fast:g} Mbit/s{theta}."
            )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_bandwidth"))
