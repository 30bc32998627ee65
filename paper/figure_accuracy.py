"""Figure 4: test accuracy against training wall time (and against steps), every algorithm.

Reads ``paper_accuracy``. Every algorithm sees the same samples at every step, so ssgd, ddp and
cdc compute the same update up to the order of float sums (the paper's "same accuracy" claim);
asgd applies stale gradients. Wall time is the training loop's, evaluation paused out of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from paper import output, paths
from paper.results import Run, load

COLUMNS = [
    "model",
    "run",
    "steps",
    "total_s",
    "test_accuracy",
    "accuracy_minus_ssgd",
    "test_loss",
    "staleness_mean",
]


def by_model(results: Path, size: str) -> dict[str, list[Run]]:
    grouped: dict[str, list[Run]] = {}
    for r in load(results, size, "paper_accuracy"):
        grouped.setdefault(r["model"], []).append(r)
    return grouped


def compute(results: Path, size: str) -> list[dict]:
    rows = []
    for model, mine in by_model(results, size).items():
        ssgd = next((r for r in mine if r["algorithm"] == "ssgd"), None)
        for r in mine:
            acc = r["final"]["test_accuracy"]
            rows.append(
                {
                    "model": model,
                    "run": r.label,
                    "steps": r["steps"],
                    "total_s": r["time_s"]["total"],
                    "test_accuracy": acc,
                    "accuracy_minus_ssgd": (
                        acc - ssgd["final"]["test_accuracy"] if ssgd is not None else None
                    ),
                    "test_loss": r["final"]["test_loss"],
                    "staleness_mean": r.summary.get("staleness_mean"),
                }
            )
    return rows


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    plt = output.pyplot()
    grouped = by_model(results, size)
    fig, axes = plt.subplots(len(grouped), 2, figsize=(12, 4 * len(grouped)), squeeze=False)
    for (by_time, by_step), (model, mine) in zip(axes, grouped.items(), strict=True):
        for r in mine:
            evaluated = [h for h in r.history() if h["test_accuracy"]]
            acc = [float(h["test_accuracy"]) for h in evaluated]
            by_time.plot([float(h["wall_s"]) for h in evaluated], acc, "o-", ms=3, label=r.label)
            by_step.plot([int(h["step"]) + 1 for h in evaluated], acc, "o-", ms=3, label=r.label)
        by_time.set_xlabel("training wall time (s)")
        by_step.set_xlabel("steps (same samples for every algorithm)")
        for ax in (by_time, by_step):
            ax.set_ylabel("test accuracy")
            ax.set_title(model)
            ax.legend(fontsize="small")
    output.save_figure(fig, paths.figures(out) / "fig4_accuracy.png")
    output.write_table(
        compute(results, size),
        COLUMNS,
        paths.tables(out) / "fig4_accuracy",
        "Figure 4: final test accuracy and training time (s) of every algorithm.",
    )


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_accuracy"))
