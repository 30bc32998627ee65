"""Figure 3: time per step against r, split by phase, beside the baselines.

Reads ``paper_phases`` (cdc at every r) and ``paper_time`` (ssgd, asgd, ddp): medians per step
of map, encode, shuffle, decode, update and the parameter distribution (``params``), and what
none of them covers (``other``: scheduling, waits; :func:`dcoded.plots.unaccounted`). ddp's
all-reduce (its ``shuffle``) runs inside its backward pass: its ``map`` shows what is left of
the forward and backward passes beside it (:func:`dcoded.plots.stacked`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from dcoded import plots
from paper import output, paths
from paper.results import Run, label, load

COLUMNS = ["model", "run", "seed", "step_ms", *(f"{p}_ms" for p in plots.PHASES), "other_ms"]


#: Its section of the report: the title, the sweeps it reads (the section says "not run" where
#: one has not) and the figures it shows.
TITLE = "Result 3 (Figure 3): time per step by phase"
READS = ("paper_time", "paper_phases")
FIGURES = ("fig3_phases.png",)


def runs(results: Path, size: str) -> dict[str, list[Run]]:
    """Per model, seed by seed: the baselines, then cdc by r."""
    everything = (
        load(results, size, "paper_time")
        + load(results, size, "paper_time_ddp")
        + load(results, size, "paper_phases")
    )
    order = {"ssgd": 0, "asgd": 1, "ddp": 2, "cdc": 3}
    by_model: dict[str, list[Run]] = {}

    def key(r):
        return (
            r["seed"],
            order[r["algorithm"]],
            r["redundancy"] or 0,
            -(r.summary.get("bucket_cap_mb") or 1e9),
        )

    for r in sorted(everything, key=key):
        by_model.setdefault(r["model"], []).append(r)
    return by_model


def compute(results: Path, size: str) -> list[dict]:
    rows = []
    for model, mine in runs(results, size).items():
        for r in mine:
            t = r["time_s"]
            rows.append(
                {
                    "model": model,
                    "run": r.label,
                    "seed": r["seed"],
                    "step_ms": 1e3 * t["step_median"],
                    **{
                        f"{p}_ms": 1e3 * plots.stacked(r.summary)[p]
                        if t.get(p) is not None
                        else None
                        for p in plots.PHASES
                    },
                    "other_ms": 1e3 * plots.unaccounted(r.summary),
                }
            )
    return rows


def to_step(summary: dict) -> dict:
    """The summary with its phases scaled down to its median step where their medians add up
    to more (medians do not add: a step's slow map and another's slow shuffle): the bar then
    shows each phase's share of the median step, never more than the step. The table keeps
    the medians as measured.

    >>> s = {"algorithm": "cdc", "time_s": {"step_median": 0.1, "map": 0.08, "shuffle": 0.04}}
    >>> round(sum(plots.stacked(to_step(s)).values()), 6)
    0.1
    """
    t = summary["time_s"]
    total = sum(plots.stacked(summary).values())
    if total <= t["step_median"] or not total:
        return summary
    f = t["step_median"] / total
    scaled = {p: (t[p] * f if t.get(p) is not None else None) for p in plots.PHASES}
    return {**summary, "time_s": {**t, **scaled}}


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    plt = output.pyplot()
    by_model = runs(results, size)
    fig, axes = plt.subplots(
        1, len(by_model), figsize=(6 * len(by_model), 4.6), squeeze=False, layout="constrained"
    )
    for ax, (model, mine) in zip(axes[0], by_model.items(), strict=True):
        seed = min(r["seed"] for r in mine)  # one seed's runs: the table has every seed's
        plots.phases([to_step(r.summary) for r in mine if r["seed"] == seed], ax, label=label)
        ax.set_title(f"{model}: time per step by phase (seed {seed})")
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")
        ax.get_legend().remove()
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=4, fontsize="small")
    output.save_figure(fig, paths.figures(out) / "fig3_phases.png")
    output.write_table(
        compute(results, size),
        COLUMNS,
        paths.tables(out) / "fig3_phases",
        "Figure 3: median ms per step and per phase, every seed (the figure draws the first "
        "seed's, each phase scaled to the median step where the phases' medians add up to "
        "more).",
    )


def section(results: Path, size: str) -> str:
    rows = compute(results, size)
    out = [output.markdown(rows, COLUMNS)]
    for model, mine in runs(results, size).items():
        seed = min(r["seed"] for r in mine)  # the figure's seed
        cdc = [r for r in mine if r["algorithm"] == "cdc" and r["seed"] == seed]
        if not cdc:
            continue
        lo, hi = cdc[0], cdc[-1]
        best = min(cdc, key=lambda r: r["time_s"]["step_median"])
        K = lo["n_workers"]
        gathered = [1e3 * r["time_s"]["params"] for r in cdc if r["redundancy"] < K]
        theta = (
            f"the all-gather of θ takes {min(gathered):.0f}–{max(gathered):.0f} ms at every r < K"
            if gathered
            else "no run gathers θ"
        )
        out.append(
            f"- {model} (seed {seed}): from r = {lo['redundancy']} to r = {hi['redundancy']} "
            "computing goes "
            f"from {1e3 * lo['time_s']['map']:.0f} to {1e3 * hi['time_s']['map']:.0f} ms and "
            f"the shuffle from {1e3 * lo['time_s']['shuffle']:.0f} to "
            f"{1e3 * hi['time_s']['shuffle']:.0f} ms; {theta}"
            + (
                f", and none at r = K = {K}, where every worker updates all of θ itself"
                if any(r["redundancy"] == K for r in cdc)
                else ""
            )
            + f". The fastest step is at r = {best['redundancy']} "
            f"({1e3 * best['time_s']['step_median']:.0f} ms)."
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_phases"))
