"""Table 1b: the time each configuration takes to first reach a target test accuracy on the
emulated cluster, every r of cdc beside its coded best.

Reads the accuracy sweeps (``paper_accuracy``, ``paper_accuracy_digits``: five seeds, every
algorithm at its tuned rate, trained on the local cluster, evaluated every 10 steps) and the
scale-model sweeps that time their steps (:data:`paper.figure_accuracy.TIMED_BY`). The target of
a seed is ``TARGET`` (95%) of ssgd's final test accuracy at that seed, the same for every
algorithm. A seed's time to it is its steps to the first evaluation at or above it (resolved to
the steps between evaluations) times the step of the same configuration and seed on the
emulated cluster: every timed configuration of an update (cdc at every r, DDP at every bucket
size) takes the steps of the accuracy run of that update. A configuration's time is the median
over the seeds both sweeps have that reached the target; the reductions ``100 (1 - cdc /
baseline)`` and the ratio to the fastest DDP are per seed, their mean and 95% interval over
those seeds, beside the paper's.
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
    "coded_best",
    "seeds",
    "reached",
    "target",
    "to_target_steps",
    "step_ms",
    "to_target_s",
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
TITLE = "Result 1b (Table 1b): time to a target accuracy, every r"
READS = figure_accuracy.READS
FIGURES = ()


def steps_to(groups: dict) -> dict[tuple[str, str], dict[str, dict[int, int | None]]]:
    """``{(data, model): {update: {seed: steps to the target, or None}}}`` from the accuracy
    runs (:func:`paper.figure_accuracy.groups`; the update:
    :func:`paper.figure_accuracy.algorithm_of`), with each seed's target under ``"_target"``."""
    out = {}
    for where, mine in groups.items():
        ssgd = mine.get("ssgd")
        if not ssgd:
            continue
        targets = {s: TARGET * r["final"]["test_accuracy"] for s, r in ssgd.items()}
        out[where] = {"_target": targets}
        for lab, by_seed in mine.items():
            hits = {
                s: time_to_accuracy(r.history(), targets[s]) if s in targets else None
                for s, r in by_seed.items()
            }
            out[where][figure_accuracy.algorithm_of(lab)] = {
                s: h["step"] if h else None for s, h in hits.items()
            }
    return out


def table1_rows(results: Path, size: str) -> dict[tuple[str, str], dict]:
    """``{(data, model): Table 1's row}`` from the sweeps that time each accuracy sweep's data
    (:func:`paper.table_time.compute` on them): its coded best, its fastest DDP, its K and its
    uncoded ends are the ones Table 1b judges by."""
    return {
        (data, row["model"]): row
        for data, sweeps in figure_accuracy.timed_sweeps(results, size).items()
        for row in table_time.compute(results, size, sweeps)
    }


def compute(results: Path, size: str) -> list[dict]:
    rows = []
    timings = figure_accuracy.timing(results, size)
    table1 = table1_rows(results, size)
    for (data, model), mine in steps_to(figure_accuracy.groups(results, size)).items():
        targets, timed = mine["_target"], timings.get((data, model), {})
        row1 = table1.get((data, model), {})  # none: no cdc was timed on these data
        K, ddp = row1.get("K"), row1.get("ddp_run")
        best = f"cdc r={row1['coded_best_r']}" if row1.get("coded_best_r") is not None else None
        to = {}
        for lab, step_s in timed.items():
            steps = mine.get(figure_accuracy.algorithm_of(lab))
            if steps is None:
                continue
            to[lab] = {
                s: (steps[s] * t if steps[s] is not None else None)
                for s, t in step_s.items()
                if s in steps
            }
        ddp = ddp if ddp in to else None
        for lab, by_seed in to.items():
            hit = [t for t in by_seed.values() if t is not None]
            stats = {
                base: versus(by_seed, to[base]) if base in to and base != lab else None
                for base in ("ssgd", "asgd")
            }
            stats["ddp"] = versus(by_seed, to[ddp], "ratio") if ddp and lab != ddp else None
            stats = {k: v if v and v["n"] else None for k, v in stats.items()}

            def mean(key, stats=stats):
                return stats[key]["mean"] if stats.get(key) else None

            def band(key, digits=1, stats=stats):
                st = stats.get(key)
                return ci(st["lo"], st["hi"], digits) if st else None

            steps = mine[figure_accuracy.algorithm_of(lab)]
            reached_steps = [steps[s] for s in by_seed if steps[s] is not None]
            paper = PAPER_REDUCTION.get(model, {}) if lab == best else {}
            rows.append(
                {
                    "data": data,
                    "model": model,
                    "run": lab,
                    "coded_best": lab == best,
                    "K": K,
                    "seeds": len(by_seed),
                    "reached": len(hit),
                    "target": statistics.mean(targets[s] for s in by_seed),
                    "to_target_steps": statistics.median(reached_steps) if reached_steps else None,
                    "step_ms": 1e3 * statistics.mean(timed[lab].values()),
                    "to_target_s": statistics.median(hit) if hit else None,
                    "less_than_ssgd_pct": mean("ssgd"),
                    "less_than_ssgd_ci": band("ssgd"),
                    "paper_less_than_ssgd_pct": paper.get("ssgd"),
                    "less_than_asgd_pct": mean("asgd"),
                    "less_than_asgd_ci": band("asgd"),
                    "paper_less_than_asgd_pct": paper.get("asgd"),
                    "over_ddp": mean("ddp"),
                    "over_ddp_ci": band("ddp", 2),
                    "ddp_run": ddp,
                    "_stats": stats,
                }
            )
    return rows


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    output.write_table(
        compute(results, size),
        COLUMNS,
        paths.tables(out) / "table1b_time_to_accuracy",
        f"Table 1b: time (s) on the emulated cluster to first reach {100 * TARGET:.0f}% of "
        "ssgd's final test accuracy at the same seed (target: its mean over seeds): the "
        "update's steps to it (evaluated every 10) times the configuration's step (step_ms, "
        "Table 1's scale-model runs, mean over seeds), median over the seeds that reached it "
        "(reached: how many); reductions against ssgd and asgd and the ratio to the fastest DDP "
        "per seed, mean [95% interval]; coded_best: cdc's fastest r with coding in play, the "
        "paper's reductions beside it.",
    )


def uncoded_ends(results: Path, size: str) -> dict[tuple[str, str], list]:
    """``{(data, model): the uncoded ends faster than the coded best}`` by the timing sweeps
    of each accuracy sweep's data, judged as Table 1 judges them (:func:`not_coding`)."""
    return {where: not_coding(row) for where, row in table1_rows(results, size).items()}


def end_row(rows: list[dict], r: int) -> dict | None:
    """cdc's row at ``r`` among one data set and model's rows."""
    return next((x for x in rows if x["run"] == f"cdc r={r}"), None)


def cdc_sentence(row: dict, mine: list[dict], faster: list) -> str:
    """cdc's coded best against ssgd, asgd and DDP, with r = 1 and r = K beside it, from its
    rows of the table alone."""
    where = f"{row['model']} on {row['data']}"
    if not row["reached"]:
        return f"- {where}: cdc never reached the target in {row['seeds']} seeds."
    parts = []
    for base in ("ssgd", "asgd"):
        s = row["_stats"].get(base)
        other = next((x for x in mine if x["run"] == base), None)
        if other is not None and not other["reached"]:
            parts.append(
                f"{base.upper()} never reached it (0 of {other['seeds']} seeds): no reduction "
                "against it"
            )
            continue
        if not s:
            continue
        paper = row[f"paper_less_than_{base}_pct"]
        names = " and ".join(name for name, *_ in faster or [])
        said = by_coding(
            verdict(s["mean"], paper, s["lo"], s["hi"]) if paper else "",
            faster,
            f", **but not by coding** (Table 1 on these data: {names} "
            f"{'are' if len(faster or []) > 1 else 'is'} faster than any coded r)",
        )
        here = f"{s['mean']:.1f}%" if s["mean"] >= 0 else f"{-s['mean']:.1f}% *more*"
        parts.append(
            f"{here} less time than {base.upper()} to the target"
            + (f" (the paper: {paper:.2f}%): {said}" if paper else "")
        )
    ddp = row["_stats"].get("ddp")
    if ddp:
        band = f" [{ddp['lo']:.2f}, {ddp['hi']:.2f}]" if ddp["lo"] is not None else ""
        parts.append(f"{ddp['mean']:.2f}×{band} the fastest DDP's time ({row['ddp_run']})")
    ends = []
    for r, name in ((1, "r = 1"), (row["K"], f"r = K = {row['K']}")):
        end = end_row(mine, r)
        if end and end["to_target_s"] is not None:
            ratio = end["_stats"].get("ddp")
            ends.append(
                f"{name} {end['to_target_s']:.1f} s"
                + (f" ({ratio['mean']:.2f}× DDP's)" if ratio else "")
            )
    return (
        f"- {where}: cdc at its best coded {row['run'].removeprefix('cdc ')} reaches "
        f"{row['target']:.3f} in {row['to_target_s']:.1f} s ({row['reached']} of {row['seeds']} "
        "seeds, median); "
        + "; ".join(parts)
        + "."
        + (f" Without coding: {', '.join(ends)}." if ends else "")
    )


def section(results: Path, size: str) -> str:
    rows = compute(results, size)
    out = [output.markdown(rows, COLUMNS)]
    out.append(
        f"The target of a seed is {100 * TARGET:.0f}% of ssgd's final test accuracy at that "
        "seed, the same for every algorithm. A seed's time to it is the steps its update took "
        "to reach it on the local cluster (evaluated every 10 steps; Figure 4) times the step "
        "of the same configuration and seed on the emulated cluster (Table 1's scale-model "
        "runs): cdc's update does not depend on r, nor DDP's on its buckets, so each r and "
        "bucket size takes the steps of the one accuracy run of its update. Reductions are per "
        "seed, mean [95% interval over the seeds both sweeps ran that reached the target]; the "
        "ratio is to the fastest DDP. cdc's coded best (1 < r < K) carries the verdict, r = 1 "
        "and r = K beside it are the controls: a saving they beat is not coding's.\n"
    )
    try:
        uncoded = uncoded_ends(results, size)
    except MissingResults:
        uncoded = {}
    for where in dict.fromkeys((r["data"], r["model"]) for r in rows):
        mine = [r for r in rows if (r["data"], r["model"]) == where]
        best = next((r for r in mine if r["coded_best"]), None)
        if best is None:
            out.append(f"- {where[1]} on {where[0]}: no cdc run with coding in play was timed.")
            continue
        out.append(cdc_sentence(best, mine, uncoded.get(where)))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.table_to_accuracy"))
