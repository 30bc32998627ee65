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

COLUMNS = ["model", "run", "step_ms", *(f"{p}_ms" for p in plots.PHASES), "other_ms"]


def runs(results: Path, size: str) -> dict[str, list[Run]]:
    """Per model: the baselines, then cdc by r."""
    everything = load(results, size, "paper_time") + load(results, size, "paper_phases")
    order = {"ssgd": 0, "asgd": 1, "ddp": 2, "cdc": 3}
    by_model: dict[str, list[Run]] = {}
    for r in sorted(everything, key=lambda r: (order[r["algorithm"]], r["redundancy"])):
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


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    plt = output.pyplot()
    by_model = runs(results, size)
    fig, axes = plt.subplots(1, len(by_model), figsize=(6 * len(by_model), 4), squeeze=False)
    for ax, (model, mine) in zip(axes[0], by_model.items(), strict=True):
        plots.phases([r.summary for r in mine], ax, label=label)
        ax.set_title(f"{model}: time per step by phase")
        ax.tick_params(axis="x", labelrotation=30)
    output.save_figure(fig, paths.figures(out) / "fig3_phases.png")
    output.write_table(
        compute(results, size),
        COLUMNS,
        paths.tables(out) / "fig3_phases",
        "Figure 3: median ms per step and per phase.",
    )


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_phases"))
