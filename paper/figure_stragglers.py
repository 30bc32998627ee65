"""Figure 8: the same redundancy used a second time. Median and 95th-percentile time per step
with no straggler, one slow worker and Bernoulli stalls, for DDP, asgd and cdc waiting for
every map (``s = 0``) or not for the ``r - 1`` slowest (``s = r - 1``), each beside its own
step without stragglers; the stalls' mean beside the order-statistics prediction; and whether
not waiting changed a bit of the result. Each configuration over its seeds: the mean of each
seed's number, its ratios paired by seed, with their 95% intervals.

Reads ``paper_stragglers`` (cdc) and ``paper_stragglers_base`` (ddp, asgd).
"""

from __future__ import annotations

import statistics
import sys
from math import comb
from pathlib import Path

from dcoded.results import interval
from paper import output, paths
from paper.results import Run, load
from paper.table_time import ci, ratio, versus
from paper.verdicts import than

MODELS = ("none", "slow", "stall")
COLUMNS = [
    "model",
    "run",
    "straggle",
    "seeds",
    "step_ms",
    "step_ci_ms",
    "p95_ms",
    "mean_ms",
    "vs_clean",
    "vs_clean_ci",
    "vs_ddp",
    "vs_ddp_ci",
    "predicted_mean_ms",
    "mean_vs_predicted",
    "backup_bytes",
    "theory_backup_bytes",
    "steps_not_waiting",
    "same_bits_as_clean",
    "test_accuracy",
]


#: Its section of the report: the title, the sweeps it reads (the section says "not run" where
#: one has not) and the figures it shows.
TITLE = "Beyond the paper (Figure 8): not waiting for stragglers"
READS = ("paper_stragglers", "paper_stragglers_base")
FIGURES = ("fig8_stragglers.png",)


def run_label(summary: dict) -> str:
    if summary["algorithm"] != "cdc":
        return summary["algorithm"]
    return f"cdc r={summary['redundancy']} s={summary['stragglers']}"


def p_more_than(s: int, K: int, p: float) -> float:
    """``P[more than s of K workers stall]``, each stalling with probability ``p``.

    >>> round(p_more_than(0, 4, 0.1), 4), round(p_more_than(2, 4, 0.1), 4)
    (0.3439, 0.0037)
    """
    return sum(comb(K, j) * p**j * (1 - p) ** (K - j) for j in range(s + 1, K + 1))


def tolerated(summary: dict) -> int | None:
    """How many stalled workers a step does not wait for: ``s`` for cdc, 0 for the
    synchronous baselines, ``None`` for asgd (it never waits for a whole step)."""
    if summary["algorithm"] == "asgd":
        return None
    return summary.get("stragglers") or 0


def predicted_mean(run: Run, clean: Run | None) -> float | None:
    """The stalls' mean step by order statistics: the same seed's clean mean, plus the stall
    times the chance that more workers stall than the step does not wait for."""
    st, s = run["straggle"], tolerated(run.summary)
    if st["model"] != "stall" or clean is None or s is None:
        return None
    more = p_more_than(s, run["n_workers"], st["p"])
    return clean["time_s"]["step_mean"] + st["stall_ms"] / 1000 * more


def described(run: Run) -> str:
    """The straggler model a run met, in words, read from the run.

    >>> from paper.results import Run
    >>> described(Run(None, {"straggle": {"model": "stall", "p": 0.1, "stall_ms": 500}}))
    'stalls (p = 0.1, 500 ms)'
    >>> described(Run(None, {"straggle": {"model": "slow", "workers": [1], "speed": 0.33}}))
    'one slow worker (rank 1 at 0.33 of its CPU share)'
    >>> described(Run(None, {"straggle": {"model": "slow", "workers": [1, 2], "speed": 0.5}}))
    '2 slow workers (ranks 1, 2, each at 0.5 of its CPU share)'
    """
    st = run["straggle"]
    if st["model"] == "stall":
        return f"stalls (p = {st['p']:g}, {st['stall_ms']:g} ms)"
    if st["model"] == "slow":
        ranks = list(st.get("workers") or [])
        if not ranks or st.get("speed") is None:
            return "slow workers"
        # the speed is of the worker's share of its host's cores (under the scale model, its
        # host's one core)
        one = len(ranks) == 1
        who = "one slow worker" if one else f"{len(ranks)} slow workers"
        which = ("rank " if one else "ranks ") + ", ".join(map(str, ranks))
        return f"{who} ({which}{'' if one else ', each'} at {st['speed']:g} of its CPU share)"
    return "no straggler" if st["model"] == "none" else st["model"]


def conditions(results: Path, size: str) -> dict:
    """What Figure 8's runs met, read from them: ``where`` (K and the links) and, per
    straggler model, its words (:func:`described`)."""
    runs = [*load(results, size, "paper_stragglers_base"), *load(results, size, "paper_stragglers")]
    first = runs[0]
    net = first.summary.get("environment", {}).get("netem")
    links = (
        f"a {net['bandwidth_mbit']:g} Mbit/s {net.get('topology') or 'switch'}"
        if net
        else "this host's loopback"
    )
    said = {"where": f"K = {first['n_workers']} on {links}"}
    for run in runs:
        words = described(run)
        if said.setdefault(run["straggle"]["model"], words) != words:  # never one of two
            said[run["straggle"]["model"]] += f" and {words}"
    return said


def _steps(by_seed: dict[int, Run], stalls: bool) -> dict[int, float]:
    """Each seed's step (s): its median, but where stalls are compared (``stalls``) its mean (a
    stall hits about a third of the steps at p = 0.1 and K = 4, so the median of a short run
    flips between the two kinds of step, and the mean is what the stalls cost); the runs a
    stalled row is compared with are read the same way."""
    return {s: r["time_s"]["step_mean" if stalls else "step_median"] for s, r in by_seed.items()}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def compute(results: Path, size: str) -> list[dict]:
    """One row per model, run and straggler model: over its seeds, the mean of each seed's
    median, 95th-percentile and mean step; its ratios to its own clean step and to DDP's under
    the same stragglers, paired by seed; the stalls' mean against the order statistics; and
    whether every seed's bits equal the same seed's without stragglers. ``_stats`` keeps the
    ratios whole."""
    groups: dict[tuple, dict[int, Run]] = {}
    for run in [
        *load(results, size, "paper_stragglers_base"),
        *load(results, size, "paper_stragglers"),
    ]:
        key = (run["model"], run_label(run.summary), run["straggle"]["model"])
        groups.setdefault(key, {})[run["seed"]] = run
    rows = []
    for (model, label, straggle), by_seed in groups.items():
        clean = groups.get((model, label, "none"), {})
        ddp = groups.get((model, "ddp", straggle), {})
        stalls = straggle == "stall"
        steps = _steps(by_seed, stalls)
        spread = interval(list(steps.values()))
        vs_clean = versus(steps, _steps(clean, stalls), "ratio") if clean else None
        vs_ddp = versus(steps, _steps(ddp, stalls), "ratio") if ddp else None
        predicted = {s: predicted_mean(run, clean.get(s)) for s, run in by_seed.items()}
        judged = {s: p for s, p in predicted.items() if p}
        # the bits a run must keep: the same seed's, waiting for every map, without stragglers
        # (asgd's updates land in the order its workers finish: its bits are not judged)
        waits = groups.get((model, label.rsplit(" ", 1)[0] + " s=0", "none"), {})
        same = [
            run["param_sha256"] == waits[s]["param_sha256"]
            for s, run in by_seed.items()
            if s in waits and run["algorithm"] != "asgd"
        ]
        backup = [run["bytes_per_worker"].get("backup") for run in by_seed.values()]
        theory = [run["bytes_per_worker"].get("theory_backup") for run in by_seed.values()]
        waited = [run["straggle"].get("steps_not_waiting") for run in by_seed.values()]
        rows.append(
            {
                "model": model,
                "run": label,
                "straggle": straggle,
                "seeds": len(by_seed),
                "step_ms": 1e3 * spread["mean"],
                "step_ci_ms": ci(
                    *(1e3 * v if v is not None else None for v in (spread["lo"], spread["hi"])), 0
                ),
                "p95_ms": 1e3 * _mean(r["time_s"]["step_p95"] for r in by_seed.values()),
                "mean_ms": 1e3 * _mean(r["time_s"]["step_mean"] for r in by_seed.values()),
                "vs_clean": vs_clean["mean"] if vs_clean else None,
                "vs_clean_ci": ci(vs_clean["lo"], vs_clean["hi"], 2) if vs_clean else None,
                "vs_ddp": vs_ddp["mean"] if vs_ddp else None,
                "vs_ddp_ci": ci(vs_ddp["lo"], vs_ddp["hi"], 2) if vs_ddp else None,
                "predicted_mean_ms": 1e3 * _mean(judged.values()) if judged else None,
                "mean_vs_predicted": _mean(
                    by_seed[s]["time_s"]["step_mean"] / p for s, p in judged.items()
                ),
                "backup_bytes": _mean(backup),
                "theory_backup_bytes": _mean(theory),
                "steps_not_waiting": sum(w for w in waited if w is not None)
                if any(w is not None for w in waited)
                else None,
                "same_bits_as_clean": all(same) if same else None,
                "test_accuracy": _mean(r["final"]["test_accuracy"] for r in by_seed.values()),
                "_stats": {"vs_clean": vs_clean, "vs_ddp": vs_ddp, "steps": steps},
            }
        )
    order = ["ddp", "ssgd", "asgd"]
    rows.sort(
        key=lambda x: (
            x["model"],
            order.index(x["run"]) if x["run"] in order else len(order),
            x["run"],
            MODELS.index(x["straggle"]),
        )
    )
    return rows


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    rows = compute(results, size)
    said = conditions(results, size)
    plt = output.pyplot()
    models = list(dict.fromkeys(x["model"] for x in rows))
    fig, axes = plt.subplots(
        1, len(models), figsize=(7 * len(models), 4.4), squeeze=False, layout="constrained"
    )
    seeds = max(x["seeds"] for x in rows)
    for ax, model in zip(axes[0], models, strict=True):
        mine = [x for x in rows if x["model"] == model]
        labels = list(dict.fromkeys(x["run"] for x in mine))
        width = 0.8 / len(MODELS)
        for i, which in enumerate(MODELS):
            xs, med, p95, err = [], [], [], [[], []]
            for j, label in enumerate(labels):
                found = [x for x in mine if (x["run"], x["straggle"]) == (label, which)]
                if found:
                    x = found[0]
                    xs.append(j + (i - 1) * width)
                    med.append(x["step_ms"])
                    p95.append(x["p95_ms"])
                    lo, hi = _band(x["_stats"]["steps"])
                    err[0].append(x["step_ms"] - lo if lo is not None else 0)
                    err[1].append(hi - x["step_ms"] if hi is not None else 0)
            ax.bar(
                xs,
                med,
                width,
                yerr=err,
                capsize=3,
                label=f"{which}: {'mean' if which == 'stall' else 'median'}",
                color=f"C{i}",
            )
            ax.scatter(xs, p95, marker="_", s=200, color="k", zorder=3)
        ax.scatter([], [], marker="_", s=200, color="k", label="95th percentile")
        ax.set_xticks(range(len(labels)), labels, fontsize=9)
        ax.set_ylabel("ms per step")
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(
            f"{model}: time per step under stragglers, mean of {seeds} seeds (bars: 95% interval)",
            fontsize=10,
        )
        ax.legend(fontsize=8.5)
    output.save_figure(fig, paths.figures(out) / "fig8_stragglers.png")
    output.write_table(
        rows,
        COLUMNS,
        paths.tables(out) / "fig8_stragglers",
        f"Figure 8: ms per step with no straggler, {said.get('slow', 'a slow worker')} and "
        f"{said.get('stall', 'stalls')}, a stall coming before a worker's computation; "
        f"{said['where']}; over the seeds, the mean of each seed's median step (under stalls "
        "its mean step), with its 95% interval, and of its 95th percentile and mean step; "
        "vs_clean: over the same run without stragglers, vs_ddp: over DDP's under the same "
        "stragglers, each paired by seed (under stalls, mean over mean); "
        "predicted: the stalls' mean step by order statistics (clean mean + the stall · P[more "
        "than s of K stall]); same_bits: every seed's param_sha256 equal to the same seed's "
        "without stragglers; backup: bytes per worker per step of plain values sent in place "
        "of what a worker that gave up did not send, beside the closed form's most; "
        "steps_not_waiting: over every seed.",
    )


def _band(steps: dict[int, float]) -> tuple[float | None, float | None]:
    """The 95% interval (ms) of the mean of the seeds' steps."""
    s = interval(list(steps.values()))
    return (1e3 * s["lo"], 1e3 * s["hi"]) if s["lo"] is not None else (None, None)


def section(results: Path, size: str) -> str:
    """Not waiting for stragglers: what a slow worker and stalls cost each algorithm, what
    not waiting buys back, at what price in bytes, and that no bit changed; every ratio paired
    by seed, with its interval."""
    rows = compute(results, size)
    said = conditions(results, size)
    # the report's table leaves these out; the CSV of every column keeps them
    apart = ("backup_bytes", "theory_backup_bytes", "steps_not_waiting", "test_accuracy")
    shown = [c for c in COLUMNS if c not in apart]
    out = [output.markdown(rows, shown)]

    def find(model, run, straggle):
        return next(
            (x for x in rows if (x["model"], x["run"], x["straggle"]) == (model, run, straggle)),
            None,
        )

    for model in dict.fromkeys(x["model"] for x in rows):
        cdc = sorted({x["run"] for x in rows if x["model"] == model and x["run"].startswith("cdc")})
        tolerant = [run for run in cdc if not run.endswith("s=0")]
        for straggle in ("slow", "stall"):
            # "one slow worker (rank 1 at 0.33 of its core)": the name bold, its terms after
            what, _, terms = said.get(straggle, straggle).partition(" (")
            terms = f"{terms.rstrip(')')}; " if terms else ""
            ddp = find(model, "ddp", straggle)
            mine = [x for run in tolerant if (x := find(model, run, straggle))]
            if not ddp or not mine:
                continue
            best = min(mine, key=lambda x: x["step_ms"])
            waiting = find(model, best["run"].rsplit(" ", 1)[0] + " s=0", straggle)
            own = ratio(ddp["_stats"]["vs_clean"], mark="x")
            line = (
                f"- **{model}, {what}** ({terms}{best['seeds']} seeds): DDP takes "
                f"{ddp['step_ms']:.0f} ms a step ({own} its own without them); "
                f"{best['run']} takes {best['step_ms']:.0f} ms "
                f"({ratio(best['_stats']['vs_clean'], mark='x')} its own, "
                f"{ratio(best['_stats']['vs_ddp'], mark='x')} DDP's: "
                f"{than(best['_stats']['vs_ddp'], 'DDP')})"
            )
            if waiting:
                against = versus(best["_stats"]["steps"], waiting["_stats"]["steps"], "ratio")
                line += (
                    f"; waiting for every map took {waiting['step_ms']:.0f} ms, so not waiting "
                    f"is {ratio(against, mark='x')} of it: {than(against, 'waiting')}"
                )
            asgd = find(model, "asgd", straggle)
            if asgd:
                line += f"; asgd takes {asgd['step_ms']:.0f} ms a step"
            out.append(line + ".")
        for run in tolerant:
            clean, zero = (
                find(model, run, "none"),
                find(model, run.rsplit(" ", 1)[0] + " s=0", "none"),
            )
            if clean and zero:
                cost = versus(clean["_stats"]["steps"], zero["_stats"]["steps"], "ratio")
                out.append(
                    f"  - {run} with no straggler: {clean['step_ms']:.0f} ms against "
                    f"{zero['step_ms']:.0f} ms waiting for every map "
                    f"({ratio(cost, mark='x')}): the cost of watching."
                )
        stalls = [x for x in rows if x["model"] == model and x["straggle"] == "stall"]
        judged = [x for x in stalls if x["mean_vs_predicted"] is not None]
        stall = said.get("stall", "stalls")
        if judged:
            within = [x["run"] for x in judged if abs(x["mean_vs_predicted"] - 1) <= 0.2]
            out.append(
                f"  - {stall[:1].upper() + stall[1:]}: the mean step, over the seeds, is within "
                f"20% of "
                f"the order-statistics prediction for {len(within)} of {len(judged)} runs"
                + (
                    "; not for "
                    + ", ".join(
                        f"{x['run']} ({x['mean_vs_predicted']:.2f}x)"
                        for x in judged
                        if x["run"] not in within
                    )
                    if len(within) < len(judged)
                    else ""
                )
                + "."
            )
    compared = [
        x for x in rows if x["run"].startswith("cdc") and x["same_bits_as_clean"] is not None
    ]
    changed = [x for x in compared if x["same_bits_as_clean"] is False]
    if changed:
        out.append(f"- **Bits changed** in {len(changed)} cdc configurations: a bug.")
    elif compared:
        out.append(
            "- Not waiting changed no bit: every cdc run's `param_sha256` equals the same seed's "
            "run that waits for every map without stragglers, so its accuracy is unchanged."
        )
    else:
        out.append("- Bits: not compared (no run waiting for every map without stragglers).")
    out.append(
        "- What a slow worker costs cdc when it is not waited for: the plain values it is sent "
        "for its own segment, `C(K-1, r-1)/K · d` more into its link than the usual exchange, "
        "and its own (slow) reduce and update. Where the step is its exchange that transfer can "
        "cost what the wait saved; where it is compute, not waiting pays."
    )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_stragglers"))
