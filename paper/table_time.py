"""Table 1: training time of ssgd, asgd, ddp and cdc with coding in play, DNN and CNN.

Reads ``paper_time`` (the baselines) and ``paper_phases`` (cdc at every r, same conditions).
Training time is ``time_s.total``: the wall time of the training loop for the same samples
(evaluation paused out of it). The reductions are ``100 (1 - cdc / baseline)``.

The paper's claim is about coding, so its reductions are those of the fastest r with coding in
play, ``1 < r < K`` (``coded_*``). Beside it, as what they are: r = 1, where no packet is coded
(a plain reduce-scatter), and r = K, where every worker computes the whole batch and nothing is
shuffled (``r1_*``, ``rK_*``).
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
    "coded_best_r",
    "coded_s",
    "less_than_ssgd_pct",
    "paper_less_than_ssgd_pct",
    "less_than_asgd_pct",
    "paper_less_than_asgd_pct",
    "coded_over_ddp",
    "r1_s",
    "r1_less_than_ssgd_pct",
    "rK_s",
    "rK_less_than_ssgd_pct",
]
RUN_COLUMNS = ["model", "run", "total_s", "step_ms", "less_than_ssgd_pct", "test_accuracy"]


def reduction(new: float, old: float) -> float:
    """Percent less time: ``100 (1 - new / old)``."""
    return 100.0 * (1.0 - new / old)


def runs(results: Path, size: str) -> list[Run]:
    return load(results, size, "paper_time") + load(results, size, "paper_phases")


def compute(results: Path, size: str) -> list[dict]:
    """One row per model: every baseline's time, cdc's at the fastest r with coding in play
    (``None`` where no run has ``1 < r < K``), and cdc's at r = 1 and r = K."""
    everything = runs(results, size)
    rows = []
    for model in sorted({r["model"] for r in everything}, key=["dnn", "cnn"].index):
        mine = [r for r in everything if r["model"] == model]
        base = {r["algorithm"]: r["time_s"]["total"] for r in mine if r["algorithm"] != "cdc"}
        cdc = {r["redundancy"]: r for r in mine if r["algorithm"] == "cdc"}
        K = next(iter(cdc.values()))["n_workers"]
        coded = [r for r in cdc.values() if 1 < r["redundancy"] < K]
        best = min(coded, key=lambda r: r["time_s"]["total"]) if coded else None
        t = best["time_s"]["total"] if best else None

        def less(new, old):
            return reduction(new, old) if new is not None and old is not None else None

        r1, rK = (cdc[r]["time_s"]["total"] if r in cdc else None for r in (1, K))
        rows.append(
            {
                "model": model,
                "d": mine[0]["n_params"],
                "ssgd_s": base.get("ssgd"),
                "asgd_s": base.get("asgd"),
                "ddp_s": base.get("ddp"),
                "coded_best_r": best["redundancy"] if best else None,
                "coded_s": t,
                "less_than_ssgd_pct": less(t, base.get("ssgd")),
                "paper_less_than_ssgd_pct": PAPER_REDUCTION[model]["ssgd"],
                "less_than_asgd_pct": less(t, base.get("asgd")),
                "paper_less_than_asgd_pct": PAPER_REDUCTION[model]["asgd"],
                "coded_over_ddp": t / base["ddp"] if t is not None and "ddp" in base else None,
                "r1_s": r1,
                "r1_less_than_ssgd_pct": less(r1, base.get("ssgd")),
                "rK_s": rK,
                "rK_less_than_ssgd_pct": less(rK, base.get("ssgd")),
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
        f"Table 1: training time (s) of {steps} steps, cdc at its fastest r with coding in play "
        "(1 < r < K); reductions in percent, ours beside the paper's; r = 1 (nothing coded) and "
        "r = K (nothing shuffled) beside it.",
    )
    output.write_table(
        every_run(results, size),
        RUN_COLUMNS,
        paths.tables(out) / "table1_every_run",
        f"Table 1, every run: training time (s) of {steps} steps and the median step (ms).",
    )


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.table_time"))
