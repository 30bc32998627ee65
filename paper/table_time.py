"""Table 1: training time of ssgd, asgd, ddp and cdc with coding in play, DNN and CNN.

Reads ``paper_time`` (the baselines), ``paper_time_ddp`` (DDP with smaller buckets) and
``paper_phases`` (cdc at every r, same conditions), each run at three seeds, the seeds the
outer loop of the sweep so that the repeats interleave. Training time is ``time_s.total``:
the wall time of the training loop for the same samples (evaluation paused out of it); a
configuration's time is its median over the seeds. The reductions are ``100 (1 - cdc /
baseline)`` per seed (cdc and the baseline of the same seed, run minutes apart), their mean
and Student's t 95% interval over the seeds (``*_lo``, ``*_hi``).

The paper's claim is about coding, so its reductions are those of the fastest r with coding in
play, ``1 < r < K`` (``coded_*``). Beside it, as what they are: r = 1, where no packet is coded
(a plain reduce-scatter), and r = K, where every worker computes the whole batch and nothing is
shuffled (``r1_*``, ``rK_*``). DDP is the fastest of its bucket sizes (``ddp_run``): at d ≈ 110 k
its default buckets hold the whole gradient in one, which cannot overlap the backward pass.
"""

from __future__ import annotations

import operator
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path

from dcoded.results import interval
from paper import figure_phases, output, paths
from paper.results import Run, load, seeded
from paper.verdicts import by_coding, less_time, not_coding, verdict

#: The paper's reductions of training time by CDC-SSGD, percent (abstract of Li et al. 2021).
PAPER_REDUCTION = {
    "dnn": {"ssgd": 53.97, "asgd": 39.11},
    "cnn": {"ssgd": 26.89, "asgd": 26.37},
}

COLUMNS = [
    "model",
    "d",
    "seeds",
    "ssgd_s",
    "asgd_s",
    "ddp_s",
    "ddp_run",
    "coded_best_r",
    "coded_s",
    "less_than_ssgd_pct",
    "less_than_ssgd_ci",
    "paper_less_than_ssgd_pct",
    "less_than_asgd_pct",
    "less_than_asgd_ci",
    "paper_less_than_asgd_pct",
    "coded_over_ddp",
    "coded_over_ddp_ci",
    "r1_s",
    "r1_less_than_ssgd_pct",
    "rK_s",
    "rK_less_than_ssgd_pct",
]
RUN_COLUMNS = [
    "model",
    "run",
    "seed",
    "total_s",
    "step_ms",
    "p25_ms",
    "p75_ms",
    "less_than_ssgd_pct",
    "test_accuracy",
]


#: Its section of the report: the title, the sweeps it reads (the section says "not run" where
#: one has not) and the figures it shows.
TITLE = "Result 1 (Table 1): training time"
READS = ("paper_time", "paper_time_ddp", "paper_phases")
FIGURES = ()  # its phases are Figure 3, shown with Result 3


def reduction(new: float, old: float) -> float:
    """Percent less time: ``100 (1 - new / old)``."""
    return 100.0 * (1.0 - new / old)


def ci(lo: float | None, hi: float | None, digits: int = 1) -> str | None:
    """An interval as the tables print it: ``[lo, hi]``.

    >>> ci(1.234, 5.678)
    '[1.2, 5.7]'
    """
    return None if lo is None or hi is None else f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def ratio(s: dict | None, digits: int = 2, mark: str = "×") -> str:
    """A ratio over seeds (:func:`versus`) as the text prints it: ``0.74× [0.72, 0.76]``
    (``n/a`` where no seed paired).

    >>> ratio({"mean": 0.7351, "lo": 0.72, "hi": 0.75}), ratio({"mean": None}, mark="x")
    ('0.74× [0.72, 0.75]', 'n/a')
    """
    if not s or s.get("mean") is None:
        return "n/a"
    band = ci(s["lo"], s["hi"], digits)
    return f"{s['mean']:.{digits}f}{mark}" + (f" {band}" if band else "")


def runs(results: Path, size: str, experiments: tuple[str, ...] = READS) -> list[Run]:
    """The runs of Table 1's sweeps (``experiments``: the same table on other data)."""
    return [r for e in experiments for r in load(results, size, e)]


def total(by_seed: dict[int, Run]) -> float:
    """A configuration's training time: the median over its seeds."""
    return statistics.median(r["time_s"]["total"] for r in by_seed.values())


def versus(new: Mapping[int, float | None], old: Mapping[int, float | None], how="pct") -> dict:
    """``new`` against ``old`` paired by seed, over the seeds both have a value at: the
    :func:`dcoded.results.interval` of the per-seed reductions (``pct``) or ratios
    (``ratio``), and ``seeds``.

    >>> v = versus({0: 50.0, 1: 60.0, 2: None}, {0: 100.0, 1: 100.0, 2: 90.0})
    >>> v["mean"], v["seeds"]
    (45.0, [0, 1])
    """
    seeds = [s for s in new if new[s] is not None and old.get(s) is not None]
    f = reduction if how == "pct" else operator.truediv
    return {**interval([f(new[s], old[s]) for s in seeds]), "seeds": sorted(seeds)}


def compare(new: dict[int, Run], old: dict[int, Run], how: str = "pct") -> dict:
    """Two configurations' training times (:func:`versus`), paired by seed."""

    def totals(by_seed):
        return {s: r["time_s"]["total"] for s, r in by_seed.items()}

    return versus(totals(new), totals(old), how)


def compute(results: Path, size: str, experiments: tuple[str, ...] = READS) -> list[dict]:
    """One row per model: every baseline's time, cdc's at the fastest r with coding in play
    (``None`` where no run has ``1 < r < K``), cdc's at r = 1 and r = K, the reductions with
    their intervals over seeds; ``_stats`` keeps each comparison whole for the report.
    ``experiments``: the sweeps to read (Table 1's by default)."""
    groups = seeded(runs(results, size, experiments))
    rows = []
    for model in [m for m in ("dnn", "cnn") if any(k[0] == m for k in groups)]:
        mine = {lab: g for (m, lab), g in groups.items() if m == model}
        cdc = {
            next(iter(g.values()))["redundancy"]: g
            for lab, g in mine.items()
            if lab.startswith("cdc")
        }
        K = next(iter(next(iter(cdc.values())).values()))["n_workers"]
        ddps = {lab: g for lab, g in mine.items() if lab.startswith("ddp")}
        ddp_run = min(ddps, key=lambda lab: total(ddps[lab])) if ddps else None
        coded = {r: g for r, g in cdc.items() if 1 < r < K}
        best = min(coded, key=lambda r: total(coded[r])) if coded else None
        base = {a: mine[a] for a in ("ssgd", "asgd") if a in mine}
        stats = {}
        if best is not None:
            for a, g in base.items():
                stats[f"less_than_{a}"] = compare(coded[best], g)
            if ddp_run:
                stats["coded_over_ddp"] = compare(coded[best], ddps[ddp_run], "ratio")
            for r in (1, K):
                if r in cdc:  # is the uncoded end faster than the coded best? (> 0: yes)
                    stats[f"r{'1' if r == 1 else 'K'}_ahead"] = compare(cdc[r], coded[best])
        if "ssgd" in base:
            for r in (1, K):
                if r in cdc:
                    stats[f"r{'1' if r == 1 else 'K'}_less_than_ssgd"] = compare(
                        cdc[r], base["ssgd"]
                    )

        def mean(key, stats=stats):
            return stats[key]["mean"] if key in stats else None

        def interval_of(key, digits=1, stats=stats):
            return ci(stats[key]["lo"], stats[key]["hi"], digits) if key in stats else None

        first = next(iter(next(iter(mine.values())).values()))
        rows.append(
            {
                "model": model,
                "d": first["n_params"],
                "seeds": len(base.get("ssgd", {})) or len(next(iter(mine.values()))),
                "ssgd_s": total(base["ssgd"]) if "ssgd" in base else None,
                "asgd_s": total(base["asgd"]) if "asgd" in base else None,
                "ddp_s": total(ddps[ddp_run]) if ddp_run else None,
                "ddp_run": ddp_run,
                "coded_best_r": best,
                "coded_s": total(coded[best]) if best is not None else None,
                "less_than_ssgd_pct": mean("less_than_ssgd"),
                "less_than_ssgd_ci": interval_of("less_than_ssgd"),
                "paper_less_than_ssgd_pct": PAPER_REDUCTION[model]["ssgd"],
                "less_than_asgd_pct": mean("less_than_asgd"),
                "less_than_asgd_ci": interval_of("less_than_asgd"),
                "paper_less_than_asgd_pct": PAPER_REDUCTION[model]["asgd"],
                "coded_over_ddp": mean("coded_over_ddp"),
                "coded_over_ddp_ci": interval_of("coded_over_ddp", 2),
                "r1_s": total(cdc[1]) if 1 in cdc else None,
                "r1_less_than_ssgd_pct": mean("r1_less_than_ssgd"),
                "rK_s": total(cdc[K]) if K in cdc else None,
                "rK_less_than_ssgd_pct": mean("rK_less_than_ssgd"),
                "K": K,
                "ddps": {lab: total(g) for lab, g in ddps.items()},
                "_stats": stats,
            }
        )
    return rows


def every_run(results: Path, size: str) -> list[dict]:
    """Every run of Table 1's sweeps, with its median step, the step's interquartile range
    over the run's steps, and its time against ssgd's of the same seed."""
    everything = runs(results, size)
    ssgd = {
        (r["model"], r["seed"]): r["time_s"]["total"]
        for r in everything
        if r["algorithm"] == "ssgd"
    }
    out = []
    for r in everything:
        t, ref = r["time_s"], ssgd.get((r["model"], r["seed"]))
        out.append(
            {
                "model": r["model"],
                "run": r.label,
                "seed": r["seed"],
                "total_s": t["total"],
                "step_ms": 1e3 * t["step_median"],
                "p25_ms": 1e3 * t["step_p25"] if t.get("step_p25") is not None else None,
                "p75_ms": 1e3 * t["step_p75"] if t.get("step_p75") is not None else None,
                "less_than_ssgd_pct": reduction(t["total"], ref) if ref else None,
                "test_accuracy": r["final"]["test_accuracy"],
            }
        )
    order = ["dnn", "cnn"]
    out.sort(key=lambda x: (order.index(x["model"]) if x["model"] in order else 9, x["seed"]))
    return out


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    first = runs(results, size)[0]
    rows = compute(results, size)
    seeds = rows[0]["seeds"] if rows else 0
    output.write_table(
        rows,
        COLUMNS,
        paths.tables(out) / "table1_training_time",
        f"Table 1: training time (s) of {first['steps']} steps, the median of {seeds} seeds; cdc "
        "at its fastest r with coding in play (1 < r < K) against each baseline of the same "
        "seed: mean reduction in percent [95% interval over the seeds], ours beside the "
        "paper's; DDP the fastest of its bucket sizes; r = 1 (nothing coded) and r = K (nothing "
        "shuffled) beside it.",
    )
    output.write_table(
        every_run(results, size),
        RUN_COLUMNS,
        paths.tables(out) / "table1_every_run",
        f"Table 1, every run: training time (s) of {first['steps']} steps, the median step and "
        "its interquartile range over the steps (ms).",
    )


def section(results: Path, size: str) -> str:
    rows = compute(results, size)
    phases = {}
    for rs in figure_phases.runs(results, size).values():
        seed = min(r["seed"] for r in rs)  # the seed Figure 3 draws
        phases.update({(r["model"], r.label): r for r in rs if r["seed"] == seed})
    out = [output.markdown(rows, COLUMNS)]
    seeds = rows[0]["seeds"] if rows else 0
    out.append(
        "Training time is the wall time of the training loop for the same samples "
        f"(`time_s.total`), the median of {seeds} seeds (the seeds the sweep's outer loop, so "
        "that the repeats interleave and the machine's drift hits every algorithm alike; every "
        "run, with its step's interquartile range: `tables/table1_every_run.md`). Reductions are "
        "`100 (1 - cdc / baseline)` per seed, their mean and [95% interval] over the seeds "
        "(Student's t); a verdict is stated only where the interval supports it. The paper's "
        "claim is about coding, so it is judged on the fastest r with coding in play "
        "(1 < r < K); r = 1 (no packet is coded: a plain reduce-scatter) and r = K (every "
        "worker computes the whole batch, nothing is shuffled) are beside it as what they are, "
        "and where one of them is faster beyond noise the saving is not coding's.\n"
    )
    for row in rows:
        model = row["model"]
        ssgd = phases[(model, "ssgd")]
        K = row["K"]
        r = row["coded_best_r"]
        if r is None:
            out.append(
                f"**{model.upper()}**: the paper's claim cannot be judged here: no run has "
                f"coding in play (1 < r < K = {K}).\n"
            )
        else:
            out.append(f"**{model.upper()}** (coding in play: cdc at r = {r}, K = {K}):\n")
        faster = not_coding(row) if r is not None else []
        for base in ("ssgd", "asgd") if r is not None else ():
            ours, paper = row[f"less_than_{base}_pct"], row[f"paper_less_than_{base}_pct"]
            if ours is None:
                continue
            s = row["_stats"][f"less_than_{base}"]
            here = f"{ours:.1f}% less time" if ours >= 0 else f"{-ours:.1f}% *more* time"
            ends = " and ".join(f"{name} ({how})" for name, how, _ in faster)
            verb = "is" if len(faster) == 1 else "are"
            said = by_coding(
                verdict(ours, paper, s["lo"], s["hi"]),
                faster,
                f"; **but not by coding**: {ends} {verb} faster still",
            )
            out.append(
                f"- against {base.upper()}: {here} here, {paper:.2f}% less in the paper: {said}."
            )
        out.append(_uncoded_beside(row, K))
        if r is not None:
            out.append(_why(ssgd, phases[(model, f"cdc r={r}")], r))
        if r is not None and row["ddp_s"]:
            s = row["_stats"].get("coded_over_ddp", {})
            band = f" [{s['lo']:.2f}, {s['hi']:.2f}]" if s.get("lo") is not None else ""
            ddps = ", ".join(f"{lab} {t:.2f} s" for lab, t in row["ddps"].items())
            out.append(
                f"- against DDP (not in the paper; what a user would run instead), the fastest "
                f"of its bucket sizes ({ddps}; {row['ddp_run']} is the fastest): cdc takes "
                f"{row['coded_over_ddp']:.2f}×{band} DDP's time. DDP's ring all-reduce moves "
                "about as many bytes per worker as cdc at r = 1, but inside one long-lived "
                "process group with no Dask task, scheduler or serialisation per step."
            )
        out.append("")
    return "\n".join(out)


def _uncoded_beside(row: dict, K: int) -> str:
    """r = 1 and r = K beside the coded best, and where the saving against SSGD comes from."""
    beside = []
    if row["r1_less_than_ssgd_pct"] is not None:
        beside.append(
            f"r = 1, where no packet is coded, takes {less_time(row['r1_less_than_ssgd_pct'])}"
        )
    if row["rK_less_than_ssgd_pct"] is not None:
        beside.append(
            f"r = K = {K}, where every worker computes the whole batch and updates all of θ "
            f"itself, so nothing is sent, takes {less_time(row['rK_less_than_ssgd_pct'])}"
        )
    if not beside:
        return "- no run at r = 1 or r = K to set beside it."
    line = "- beside it, without coding: " + "; ".join(beside) + "."
    faster = [
        f"r = {n}"
        for n, t in ((1, row["r1_s"]), (K, row["rK_s"]))
        if t is not None and row["coded_s"] is not None and t < row["coded_s"]
    ]
    beyond = not_coding(row) if row["coded_s"] is not None else []
    if beyond:
        one_seed = any(single for *_, single in beyond)
        line += (
            f" {' and '.join(name for name, *_ in beyond)} "
            f"{'is' if len(beyond) == 1 else 'are'} faster than any coded r here"
            + (" (one seed: no interval)" if one_seed else ", beyond noise")
            + ": that saving is not coding's."
        )
    elif faster:
        line += (
            f" {' and '.join(faster)} {'has' if len(faster) == 1 else 'have'} a shorter median "
            "time than the coded best, within noise."
        )
    if row["coded_s"] is not None and row["r1_less_than_ssgd_pct"] is not None:
        ahead = row["less_than_ssgd_pct"] - row["r1_less_than_ssgd_pct"]
        line += (
            " Much of any saving against SSGD is the parameter server's single link taken out of "
            f"the path, which a reduce-scatter already does; the best coded r is {abs(ahead):.1f} "
            f"points {'ahead of' if ahead > 0 else 'behind'} r = 1 here."
        )
    return line


def _why(ssgd: Run, best: Run, r: int) -> str:
    """Where the time of a step goes, ssgd against cdc at ``r``."""
    t, b = ssgd["time_s"], ssgd["bytes_per_worker"]
    bw = (ssgd.summary["environment"].get("netem") or {}).get("driver_bandwidth_mbit")
    link = ""
    if bw:
        K = ssgd["n_workers"]
        link_ms = 1e3 * K * b["unicast"] * 8 / (bw * 1e6)
        link = (
            f"; the {K} gradients of {b['unicast']:,.0f} B all cross the "
            f"driver's one link, {link_ms:.0f} ms at {bw:g} Mbit/s by the rate alone, and θ "
            "goes back the same way"
        )
    bt = best["time_s"]
    return (
        f"- why: ssgd's median step is {1e3 * t['step_median']:.0f} ms, of which "
        f"{1e3 * t['map']:.0f} ms is computing, {1e3 * t['shuffle']:.0f} ms sending "
        f"gradients to the server and {1e3 * t['params']:.0f} ms getting θ back{link}. "
        f"cdc at r = {r} has no server: its step is "
        f"{1e3 * bt['step_median']:.0f} ms, {1e3 * bt['map']:.0f} ms computing "
        f"({r}× the samples of an ssgd worker), "
        f"{1e3 * bt['shuffle']:.0f} ms shuffling and "
        f"{1e3 * bt['params']:.0f} ms gathering θ."
    )


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.table_time"))
