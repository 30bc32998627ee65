"""Table 1b: the wall time each algorithm takes to first reach a target test accuracy.

Reads the accuracy sweeps (``paper_accuracy``, ``paper_accuracy_digits``: five seeds, every
algorithm at its tuned rate, evaluated every 5 steps). The target of a seed is
``TARGET`` (95%) of ssgd's final test accuracy at that seed, the same for every algorithm; an
algorithm's time is the training wall time (evaluation paused out of it) of its first
evaluation at or above it, resolved to the 5 steps between evaluations
(:func:`dcoded.results.time_to_accuracy`). A configuration's time is the median over the
seeds that reached the target; the reductions ``100 (1 - cdc / baseline)`` are per seed (both
having reached it), their mean and 95% interval over the seeds, beside the paper's.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from dcoded.results import time_to_accuracy
from paper import figure_accuracy, output, paths, table_time
from paper.results import MissingResults
from paper.table_time import PAPER_REDUCTION, ci, versus
from paper.verdicts import by_coding, not_coding, verdict

#: The target: this fraction of ssgd's final test accuracy at the same seed.
TARGET = 0.95

COLUMNS = [
    "data",
    "model",
    "run",
    "seeds",
    "reached",
    "target",
    "to_target_s",
    "to_target_steps",
    "less_than_ssgd_pct",
    "less_than_ssgd_ci",
    "paper_less_than_ssgd_pct",
    "less_than_asgd_pct",
    "less_than_asgd_ci",
    "paper_less_than_asgd_pct",
    "over_ddp",
    "over_ddp_ci",
]


#: Its section of the report: the title, the sweeps it reads (the section says "not run" where
#: one has not) and the figures it shows.
TITLE = "Result 1b (Table 1b): time to a target accuracy"
READS = figure_accuracy.EXPERIMENTS
FIGURES = ()


def reached(results: Path, size: str) -> dict[tuple[str, str], dict[str, dict[int, dict]]]:
    """``{(data, model): {label: {seed: first evaluation at the target, or None}}}``, with
    the target of each seed under ``"_target"``."""
    out = {}
    for where, mine in figure_accuracy.groups(results, size).items():
        ssgd = mine.get("ssgd")
        if not ssgd:
            continue
        targets = {s: TARGET * r["final"]["test_accuracy"] for s, r in ssgd.items()}
        out[where] = {"_target": targets}
        for lab, by_seed in mine.items():
            out[where][lab] = {
                s: time_to_accuracy(r.history(), targets[s]) if s in targets else None
                for s, r in by_seed.items()
            }
    return out


def _against(mine: dict, lab: str, base: str, how: str = "pct") -> dict | None:
    """``lab`` against ``base`` per seed where both reached the target (:func:`versus`)."""
    if base not in mine or lab == base:
        return None

    def times(by_seed):
        return {s: h["wall_s"] if h else None for s, h in by_seed.items()}

    out = versus(times(mine[lab]), times(mine[base]), how)
    return out if out["n"] else None


def compute(results: Path, size: str) -> list[dict]:
    rows = []
    for (data, model), mine in reached(results, size).items():
        targets = mine["_target"]
        ddp = next((lab for lab in mine if lab.startswith("ddp")), None)
        for lab, by_seed in mine.items():
            if lab == "_target":
                continue
            hit = [h for h in by_seed.values() if h]
            stats = {base: _against(mine, lab, base) for base in ("ssgd", "asgd")} | {
                "ddp": _against(mine, lab, ddp, "ratio") if ddp else None
            }

            def mean(key, stats=stats):
                return stats[key]["mean"] if stats.get(key) else None

            def band(key, digits=1, stats=stats):
                s = stats.get(key)
                return ci(s["lo"], s["hi"], digits) if s else None

            cdc = lab.startswith("cdc")
            rows.append(
                {
                    "data": data,
                    "model": model,
                    "run": lab,
                    "seeds": len(by_seed),
                    "reached": len(hit),
                    "target": statistics.mean(targets.values()),
                    "to_target_s": statistics.median(h["wall_s"] for h in hit) if hit else None,
                    "to_target_steps": statistics.median(h["step"] for h in hit) if hit else None,
                    "less_than_ssgd_pct": mean("ssgd"),
                    "less_than_ssgd_ci": band("ssgd"),
                    "paper_less_than_ssgd_pct": PAPER_REDUCTION.get(model, {}).get("ssgd")
                    if cdc
                    else None,
                    "less_than_asgd_pct": mean("asgd"),
                    "less_than_asgd_ci": band("asgd"),
                    "paper_less_than_asgd_pct": PAPER_REDUCTION.get(model, {}).get("asgd")
                    if cdc
                    else None,
                    "over_ddp": mean("ddp"),
                    "over_ddp_ci": band("ddp", 2),
                    "_stats": stats,
                }
            )
    return rows


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    output.write_table(
        compute(results, size),
        COLUMNS,
        paths.tables(out) / "table1b_time_to_accuracy",
        f"Table 1b: training wall time (s) to first reach {100 * TARGET:.0f}% of ssgd's final "
        "test accuracy at the same seed (target: its mean over seeds), median over the seeds "
        "that reached it (reached: how many); reductions against ssgd and asgd and the ratio to "
        "DDP per seed, mean [95% interval]; the paper's reductions beside cdc's.",
    )


def section(results: Path, size: str) -> str:
    rows = compute(results, size)
    out = [output.markdown(rows, COLUMNS)]
    out.append(
        f"The target of a seed is {100 * TARGET:.0f}% of ssgd's final test "
        "accuracy at that seed, the same for every algorithm; the time is the training wall "
        "time of the first evaluation at or above it (evaluations every 5 steps; evaluation "
        "time kept out). Reductions are per seed, mean [95% interval over the seeds that both "
        "reached the target]. Only cdc at r = 2 runs here; whether an r without coding is "
        "faster still is Table 1's question.\n"
    )
    try:  # Table 1's finding, on the same data: is an r without coding faster still?
        data = figure_accuracy.data_name(table_time.runs(results, size)[0])
        uncoded = {(r["model"], data): not_coding(r) for r in table_time.compute(results, size)}
    except MissingResults:
        uncoded = {}
    for row in rows:
        if not row["run"].startswith("cdc"):
            continue
        where = f"{row['model']} on {row['data']}"
        faster = uncoded.get((row["model"], row["data"]))
        if not row["reached"]:
            out.append(f"- {where}: cdc never reached the target in {row['seeds']} seeds.")
            continue
        parts = []
        for base in ("ssgd", "asgd"):
            s = row["_stats"].get(base)
            if not s:
                continue
            paper = row[f"paper_less_than_{base}_pct"]
            names = " and ".join(name for name, *_ in faster or [])
            said = by_coding(
                verdict(s["mean"], paper, s["lo"], s["hi"]) if paper else "",
                faster,
                f", **but not by coding** (Table 1: {names} is faster than any coded r)",
            )
            here = f"{s['mean']:.1f}%" if s["mean"] >= 0 else f"{-s['mean']:.1f}% *more*"
            parts.append(
                f"{here} less time than {base.upper()} to the target"
                + (f" (the paper: {paper:.2f}%): {said}" if paper else "")
            )
        for base in ("ssgd", "asgd"):
            other = next(
                (
                    x
                    for x in rows
                    if (x["data"], x["model"], x["run"]) == (row["data"], row["model"], base)
                ),
                None,
            )
            if other is not None and not other["reached"]:
                parts.append(
                    f"{base.upper()} never reached it (0 of {other['seeds']} seeds): no "
                    "reduction against it"
                )
        ddp = row["_stats"].get("ddp")
        if ddp:
            band = f" [{ddp['lo']:.2f}, {ddp['hi']:.2f}]" if ddp["lo"] is not None else ""
            parts.append(f"{ddp['mean']:.2f}×{band} DDP's time to it")
        out.append(
            f"- {where}: cdc reaches {row['target']:.3f} in {row['to_target_s']:.1f} s "
            f"({row['reached']} of {row['seeds']} seeds, median); " + "; ".join(parts) + "."
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.table_to_accuracy"))
