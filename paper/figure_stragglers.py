"""Figure 8: the same redundancy used a second time. Median and 95th-percentile time per step
with no straggler, one slow worker and Bernoulli stalls, for DDP, the parameter servers and
cdc waiting for every map (``s = 0``) or not for the ``r - 1`` slowest (``s = r - 1``), each
beside its own step without stragglers; the stalls' mean beside the order-statistics
prediction; and whether not waiting changed a bit of the result.

Reads ``paper_stragglers`` (cdc) and ``paper_stragglers_base`` (ddp, ssgd, asgd).
"""

from __future__ import annotations

import sys
from math import comb
from pathlib import Path

from paper import output, paths
from paper.results import Run, load

MODELS = ("none", "slow", "stall")
COLUMNS = [
    "model",
    "run",
    "straggle",
    "step_ms",
    "p95_ms",
    "mean_ms",
    "vs_clean",
    "vs_ddp",
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


def compute(results: Path, size: str) -> list[dict]:
    runs: list[Run] = [
        *load(results, size, "paper_stragglers_base"),
        *load(results, size, "paper_stragglers"),
    ]

    def key(run):
        return (run["model"], run_label(run.summary))

    clean = {key(r): r for r in runs if r["straggle"]["model"] == "none"}
    ddp = {(r["model"], r["straggle"]["model"]): r for r in runs if r["algorithm"] == "ddp"}
    rows = []
    for run in runs:
        t, st = run["time_s"], run["straggle"]
        base = clean.get(key(run))
        ref = ddp.get((run["model"], st["model"]))
        predicted = None
        s = tolerated(run.summary)
        if st["model"] == "stall" and base is not None and s is not None:
            predicted = base["time_s"]["step_mean"] + st["stall_ms"] / 1000 * p_more_than(
                s, run["n_workers"], st["p"]
            )
        b = run["bytes_per_worker"]
        rows.append(
            {
                "model": run["model"],
                "run": run_label(run.summary),
                "straggle": st["model"],
                "step_ms": 1e3 * t["step_median"],
                "p95_ms": 1e3 * t["step_p95"],
                "mean_ms": 1e3 * t["step_mean"],
                "vs_clean": t["step_median"] / base["time_s"]["step_median"] if base else None,
                "vs_ddp": t["step_median"] / ref["time_s"]["step_median"] if ref else None,
                "predicted_mean_ms": 1e3 * predicted if predicted else None,
                "mean_vs_predicted": t["step_mean"] / predicted if predicted else None,
                "backup_bytes": b.get("backup"),
                "theory_backup_bytes": b.get("theory_backup"),
                "steps_not_waiting": st.get("steps_not_waiting"),
                "same_bits_as_clean": run["param_sha256"] == base["param_sha256"] if base else None,
                "test_accuracy": run["final"]["test_accuracy"],
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


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    rows = compute(results, size)
    plt = output.pyplot()
    models = list(dict.fromkeys(x["model"] for x in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(8 * len(models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        mine = [x for x in rows if x["model"] == model]
        labels = list(dict.fromkeys(x["run"] for x in mine))
        width = 0.8 / len(MODELS)
        for i, which in enumerate(MODELS):
            xs, med, p95 = [], [], []
            for j, label in enumerate(labels):
                found = [x for x in mine if (x["run"], x["straggle"]) == (label, which)]
                if found:
                    xs.append(j + (i - 1) * width)
                    med.append(found[0]["step_ms"])
                    p95.append(found[0]["p95_ms"])
            ax.bar(xs, med, width, label=f"{which}: median", color=f"C{i}")
            ax.scatter(xs, p95, marker="_", s=200, color="k", zorder=3)
        ax.scatter([], [], marker="_", s=200, color="k", label="95th percentile")
        ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=8)
        ax.set_ylabel("ms per step")
        ax.set_title(f"{model}: time per step under stragglers")
        ax.legend(fontsize=8)
    output.save_figure(fig, paths.figures(out) / "fig8_stragglers.png")
    output.write_table(
        rows,
        COLUMNS,
        paths.tables(out) / "fig8_stragglers",
        "Figure 8: ms per step (median, 95th percentile, mean) with no straggler, one slow "
        "worker (rank 1 at a third of its share of the cores) and stalls (p = 0.1, 500 ms "
        "before a worker's computation), K = 4 on a 100 Mbit/s switch; vs_clean: over the same "
        "run without stragglers; predicted: the stalls' mean step by order statistics (clean "
        "mean + 500 ms · P[more than s of 4 stall]); same_bits: param_sha256 equal to the run "
        "without stragglers; backup: bytes per worker per step of plain values sent in place of "
        "what a worker that gave up did not send, beside the closed form's most.",
    )


def section(results: Path, size: str) -> str:
    """Not waiting for stragglers: what a slow worker and stalls cost each algorithm, what
    not waiting buys back, at what price in bytes, and that no bit changed."""
    rows = compute(results, size)
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
        ddp = find(model, "ddp", "slow")
        slow = [find(model, run, "slow") for run in tolerant]
        slow = [x for x in slow if x]
        if ddp and slow:
            best = min(slow, key=lambda x: x["step_ms"])
            waiting = find(model, best["run"].rsplit(" ", 1)[0] + " s=0", "slow")
            line = (
                f"- **{model}, one slow worker**: DDP takes {ddp['step_ms']:.0f} ms a step "
                f"({ddp['vs_clean']:.2f}x its own without it); {best['run']} takes "
                f"{best['step_ms']:.0f} ms ({best['vs_clean']:.2f}x its own, "
                f"{best['vs_ddp']:.2f}x DDP's)"
            )
            if waiting:
                line += f", where waiting for every map took {waiting['step_ms']:.0f} ms"
            out.append(line + ".")
        for run in tolerant:
            clean, zero = (
                find(model, run, "none"),
                find(model, run.rsplit(" ", 1)[0] + " s=0", "none"),
            )
            if clean and zero:
                out.append(
                    f"  - {run} with no straggler: {clean['step_ms']:.0f} ms against "
                    f"{zero['step_ms']:.0f} ms waiting for every map "
                    f"({clean['step_ms'] / zero['step_ms']:.2f}x): the cost of watching."
                )
        stalls = [x for x in rows if x["model"] == model and x["straggle"] == "stall"]
        judged = [x for x in stalls if x["mean_vs_predicted"] is not None]
        if judged:
            within = [x["run"] for x in judged if abs(x["mean_vs_predicted"] - 1) <= 0.2]
            out.append(
                f"  - Stalls (p = 0.1, 500 ms): the mean step is within 20% of the "
                f"order-statistics prediction for {len(within)} of {len(judged)} runs"
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
    changed = [x for x in rows if x["run"].startswith("cdc") and x["same_bits_as_clean"] is False]
    out.append(
        "- Not waiting changed no bit: every cdc run's `param_sha256` equals the same run's "
        "without stragglers, so its accuracy is unchanged."
        if not changed
        else f"- **Bits changed** in {len(changed)} cdc runs: a bug."
    )
    out.append(
        "- What a slow worker costs cdc when it is not waited for: the plain values it is sent "
        "for its own segment, `C(K-1, r-1)/K · d` more into its link than the usual exchange, "
        "and its own (slow) reduce and update. Where the step is its exchange (the dnn at "
        "100 Mbit/s) that transfer can cost what the wait saved; where it is compute (the cnn) "
        "not waiting pays."
    )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_stragglers"))
