"""Table 1: training time of ssgd, asgd, ddp and cdc at its best r, DNN and CNN.

Reads ``paper_time`` (the baselines) and ``paper_phases`` (cdc at every r, same conditions).
Training time is ``time_s.total``: the wall time of the training loop for the same samples
(evaluation paused out of it). The reductions are ``100 (1 - cdc / baseline)``. ``coded_*`` is
the fastest r with coding in play (``1 < r < K``: at r = 1 nothing is coded, at r = K nothing is
shuffled).
"""

from __future__ import annotations

import sys
from pathlib import Path

from paper import output, paths
from paper.results import Run, load

#: The paper's reductions of training time by CDC-SSGD, percent (abstract of Li et al. 2021).
PAPER_REDUCTION = {
    "dnn": {"ssgd": 53.97, "asgd": 39.11},
    "cnn": {"ssgd": 26.89, "asgd": 26.37},
}

COLUMNS = [
    "model",
    "d",
    "ssgd_s",
    "asgd_s",
    "ddp_s",
    "cdc_best_r",
    "cdc_s",
    "less_than_ssgd_pct",
    "paper_less_than_ssgd_pct",
    "less_than_asgd_pct",
    "paper_less_than_asgd_pct",
    "cdc_over_ddp",
    "cdc_r1_s",
    "coded_best_r",
    "coded_s",
    "coded_less_than_ssgd_pct",
]
RUN_COLUMNS = ["model", "run", "total_s", "step_ms", "less_than_ssgd_pct", "test_accuracy"]


def reduction(new: float, old: float) -> float:
    """Percent less time: ``100 (1 - new / old)``."""
    return 100.0 * (1.0 - new / old)


def runs(results: Path, size: str) -> list[Run]:
    return load(results, size, "paper_time") + load(results, size, "paper_phases")


def compute(results: Path, size: str) -> list[dict]:
    """One row per model: every baseline's time and cdc's at the r that trains fastest."""
    everything = runs(results, size)
    rows = []
    for model in sorted({r["model"] for r in everything}, key=["dnn", "cnn"].index):
        mine = [r for r in everything if r["model"] == model]
        base = {r["algorithm"]: r["time_s"]["total"] for r in mine if r["algorithm"] != "cdc"}
        cdc = [r for r in mine if r["algorithm"] == "cdc"]
        best = min(cdc, key=lambda r: r["time_s"]["total"])
        t = best["time_s"]["total"]
        # at r = 1 nothing is coded and at r = K nothing is shuffled: coding proper is between
        coded = [r for r in cdc if 1 < r["redundancy"] < r["n_workers"]]
        coded_best = min(coded, key=lambda r: r["time_s"]["total"]) if coded else None
        r1 = next((r["time_s"]["total"] for r in cdc if r["redundancy"] == 1), None)
        rows.append(
            {
                "model": model,
                "d": best["n_params"],
                "ssgd_s": base.get("ssgd"),
                "asgd_s": base.get("asgd"),
                "ddp_s": base.get("ddp"),
                "cdc_best_r": best["redundancy"],
                "cdc_s": t,
                "less_than_ssgd_pct": reduction(t, base["ssgd"]) if "ssgd" in base else None,
                "paper_less_than_ssgd_pct": PAPER_REDUCTION[model]["ssgd"],
                "less_than_asgd_pct": reduction(t, base["asgd"]) if "asgd" in base else None,
                "paper_less_than_asgd_pct": PAPER_REDUCTION[model]["asgd"],
                "cdc_over_ddp": t / base["ddp"] if "ddp" in base else None,
                "cdc_r1_s": r1,
                "coded_best_r": coded_best["redundancy"] if coded_best else None,
                "coded_s": coded_best["time_s"]["total"] if coded_best else None,
                "coded_less_than_ssgd_pct": (
                    reduction(coded_best["time_s"]["total"], base["ssgd"])
                    if coded_best and "ssgd" in base
                    else None
                ),
            }
        )
    return rows


def every_run(results: Path, size: str) -> list[dict]:
    """Every run of Table 1's two sweeps, with its time against ssgd's."""
    everything = runs(results, size)
    ssgd = {r["model"]: r["time_s"]["total"] for r in everything if r["algorithm"] == "ssgd"}
    return [
        {
            "model": r["model"],
            "run": r.label,
            "total_s": r["time_s"]["total"],
            "step_ms": 1e3 * r["time_s"]["step_median"],
            "less_than_ssgd_pct": (
                reduction(r["time_s"]["total"], ssgd[r["model"]]) if r["model"] in ssgd else None
            ),
            "test_accuracy": r["final"]["test_accuracy"],
        }
        for r in everything
    ]


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    steps = runs(results, size)[0]["steps"]
    output.write_table(
        compute(results, size),
        COLUMNS,
        paths.tables(out) / "table1_training_time",
        f"Table 1: training time (s) of {steps} steps, cdc at its fastest r; reductions in "
        "percent, ours beside the paper's.",
    )
    output.write_table(
        every_run(results, size),
        RUN_COLUMNS,
        paths.tables(out) / "table1_every_run",
        f"Table 1, every run: training time (s) of {steps} steps and the median step (ms).",
    )


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.table_time"))
