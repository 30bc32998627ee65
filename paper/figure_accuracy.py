"""Figure 4: test accuracy against training wall time (and against steps), every algorithm,
five seeds, on MNIST-sized data and on the bundled handwritten digits.

Reads ``paper_accuracy`` and ``paper_accuracy_digits``. ssgd, ddp and cdc see the same samples
at every step and compute the same update up to the order of float sums; asgd applies stale
gradients. Each algorithm runs at its own learning rate, picked on a held-out split
(:mod:`paper.tuning`). Wall time is the training loop's, evaluation paused out of it.

"Same accuracy" is judged by a stated rule, never by one run: the final accuracy's difference
to ssgd, paired by seed, has a 95% interval (Student's t over the seeds) that lies within
``±SAME`` (one point): ``same``; one that lies wholly outside it: ``differs``; else
``undecided`` (the seeds cannot tell).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

from dcoded.results import interval, paired
from paper import output, paths, tuning
from paper.results import Run, load, seeded

#: The accuracy sweeps and what each trains on (the first: what stage 1 was given).
EXPERIMENTS = ("paper_accuracy", "paper_accuracy_digits")
#: The margin of "same accuracy": one point of accuracy.
SAME = 0.01
ORDER = ("ssgd", "asgd", "ddp", "cdc")

COLUMNS = [
    "data",
    "model",
    "run",
    "seeds",
    "lr",
    "momentum",
    "total_s",
    "test_accuracy",
    "accuracy_std",
    "minus_ssgd",
    "minus_ssgd_ci",
    "same_as_ssgd",
    "staleness_mean",
]


#: Its section of the report: the title, the sweeps it reads (the section says "not run" where
#: one has not) and the figures it shows.
TITLE = "Result 4 (Figure 4): accuracy against wall time, five seeds"
READS = EXPERIMENTS
FIGURES = ("fig4_accuracy.png",)


def data_name(run: Run) -> str:
    """What a run trained on, as the tables name it."""
    return {"synthetic": "synthetic MNIST-sized"}.get(run["dataset"], run["dataset"])


def groups(results: Path, size: str) -> dict[tuple[str, str], dict[str, dict[int, Run]]]:
    """``{(data, model): {label: {seed: run}}}``, the labels in :data:`ORDER`."""
    out: dict[tuple[str, str], dict[str, dict[int, Run]]] = {}
    for e in EXPERIMENTS:
        for (model, lab), by_seed in seeded(load(results, size, e)).items():
            data = data_name(next(iter(by_seed.values())))
            out.setdefault((data, model), {})[lab] = by_seed
    for mine in out.values():
        ordered = sorted(mine, key=lambda lab: ORDER.index(lab.split()[0]))
        mine_sorted = {lab: mine[lab] for lab in ordered}
        mine.clear()
        mine.update(mine_sorted)
    return out


def judge(lo: float | None, hi: float | None) -> str:
    """The rule for "same accuracy" (see the module's docstring).

    >>> judge(-0.004, 0.006), judge(0.02, 0.05), judge(-0.03, 0.004), judge(None, None)
    ('same', 'differs', 'undecided', 'undecided')
    """
    if lo is None or hi is None:
        return "undecided"
    if -SAME <= lo and hi <= SAME:
        return "same"
    if hi < -SAME or lo > SAME:
        return "differs"
    return "undecided"


def final(by_seed: dict[int, Run]) -> dict[int, float]:
    return {s: r["final"]["test_accuracy"] for s, r in by_seed.items()}


def compute(results: Path, size: str) -> list[dict]:
    """One row per (data, model, algorithm): the final accuracy over seeds (mean, standard
    deviation), its difference to ssgd paired by seed (mean, 95% interval) and the verdict."""
    rows = []
    for (data, model), mine in groups(results, size).items():
        ssgd = mine.get("ssgd")
        for lab, by_seed in mine.items():
            acc = interval(list(final(by_seed).values()))
            diff = paired(final(by_seed), final(ssgd)) if ssgd and lab != "ssgd" else None
            first = next(iter(by_seed.values()))
            lr, momentum = tuning.setting(first)
            stale = [r.summary.get("staleness_mean") for r in by_seed.values()]
            stale = [s for s in stale if s is not None]
            rows.append(
                {
                    "data": data,
                    "model": model,
                    "run": lab,
                    "seeds": len(by_seed),
                    "lr": lr,
                    "momentum": momentum,
                    "total_s": statistics.median(r["time_s"]["total"] for r in by_seed.values()),
                    "test_accuracy": acc["mean"],
                    "accuracy_std": acc["std"],
                    "minus_ssgd": diff["mean"] if diff else None,
                    "minus_ssgd_ci": (
                        f"[{diff['lo']:+.4f}, {diff['hi']:+.4f}]"
                        if diff and diff["lo"] is not None
                        else None
                    ),
                    "minus_ssgd_lo": diff["lo"] if diff else None,
                    "minus_ssgd_hi": diff["hi"] if diff else None,
                    "same_as_ssgd": judge(diff["lo"], diff["hi"]) if diff else None,
                    "staleness_mean": statistics.mean(stale) if stale else None,
                }
            )
    return rows


def curves(by_seed: dict[int, Run]) -> dict[str, np.ndarray]:
    """Over the seeds, at each evaluated step: the step, the mean wall time, the mean test
    accuracy and its standard deviation (the steps every seed evaluated)."""
    per_seed = []
    for r in by_seed.values():
        per_seed.append(
            {
                int(h["step"]) + 1: (float(h["wall_s"]), float(h["test_accuracy"]))
                for h in r.history()
                if h["test_accuracy"]
            }
        )
    steps = sorted(set.intersection(*(set(p) for p in per_seed)))
    wall = np.array([[p[s][0] for s in steps] for p in per_seed])
    acc = np.array([[p[s][1] for s in steps] for p in per_seed])
    return {
        "step": np.array(steps),
        "wall_s": wall.mean(axis=0),
        "accuracy": acc.mean(axis=0),
        "std": acc.std(axis=0, ddof=1) if len(per_seed) > 1 else np.zeros(len(steps)),
    }


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    plt = output.pyplot()
    grouped = groups(results, size)
    fig, axes = plt.subplots(
        len(grouped), 2, figsize=(12, 3.6 * len(grouped)), squeeze=False, layout="constrained"
    )
    for (by_time, by_step), ((data, model), mine) in zip(axes, grouped.items(), strict=True):
        for lab, by_seed in mine.items():
            c = curves(by_seed)
            name = lab
            for ax, x in ((by_time, c["wall_s"]), (by_step, c["step"])):
                (line,) = ax.plot(x, c["accuracy"], "o-", ms=2, label=name)
                ax.fill_between(
                    x, c["accuracy"] - c["std"], c["accuracy"] + c["std"], alpha=0.2,
                    color=line.get_color(),
                )  # fmt: skip
        by_time.set_xlabel("training wall time (s), mean over seeds")
        by_step.set_xlabel("steps (same samples for every algorithm)")
        for ax, how in ((by_time, "against time"), (by_step, "against steps")):
            ax.set_ylabel("test accuracy")
            n = len(next(iter(mine.values())))
            ax.set_title(f"{model} on {data}, {how}: mean ± std of {n} seeds", fontsize="medium")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=4, fontsize="small")
    output.save_figure(fig, paths.figures(out) / "fig4_accuracy.png")
    output.write_table(
        compute(results, size),
        COLUMNS,
        paths.tables(out) / "fig4_accuracy",
        "Figure 4: final test accuracy over seeds (mean, standard deviation), its difference to "
        "ssgd paired by seed (mean [95% interval]) and the verdict of the same-accuracy rule "
        f"(the interval within ±{SAME:g}: same; wholly outside: differs; else undecided); each "
        "algorithm at its tuned rate; training time (s) the median over seeds.",
    )


def accuracy_sentence(row: dict, ssgd: dict) -> str:
    """One algorithm's final accuracy against ssgd's and the verdict of the stated rule, from
    its row of Figure 4's table alone."""
    said = {
        "same": "by the rule",
        "differs": "by the rule",
        "undecided": "the seeds cannot tell it from ssgd's within one point",
    }[row["same_as_ssgd"]]
    if row["minus_ssgd_lo"] == 0 and row["minus_ssgd_hi"] == 0:
        said = (
            "by construction: the same update from the same samples at the same rate ends at "
            "the same accuracy at every seed, so this checks the implementation (the exchange "
            "loses nothing), not a claim about the algorithm"
        )
    return (
        f"- {row['model']} on {row['data']}: {row['run']} ends at {row['test_accuracy']:.4f} ± "
        f"{row['accuracy_std']:.4f} ({row['seeds']} seeds), {row['minus_ssgd']:+.4f} from ssgd's "
        f"{ssgd['test_accuracy']:.4f} ± {ssgd['accuracy_std']:.4f} (95% interval of the paired "
        f"difference {row['minus_ssgd_ci']}): **{row['same_as_ssgd']}**, {said}."
    )


def section(results: Path, size: str) -> str:
    rows = compute(results, size)
    out = [output.markdown(rows, COLUMNS)]
    out.append(
        "The same-accuracy rule: the difference of the final test accuracy to ssgd's, paired "
        "by seed, has a 95% interval (Student's t over the seeds) within ±"
        f"{SAME:g} (one point): **same**; wholly outside it: **differs**; "
        "otherwise **undecided**. ssgd, ddp and cdc compute the same update from the same "
        "samples at the same rate (only the order of float sums differs), so a difference "
        "between them is the float order's, or a different tuned rate; asgd applies gradients "
        "K - 1 steps stale.\n"
    )
    for where in dict.fromkeys((r["data"], r["model"]) for r in rows):
        mine = [r for r in rows if (r["data"], r["model"]) == where]
        ssgd = next((r for r in mine if r["run"] == "ssgd"), None)
        if ssgd is None:
            continue
        out.append(
            f"- {where[1]} on {where[0]}: the seed-to-seed standard deviation of the final "
            f"accuracy is {ssgd['accuracy_std']:.4f} for ssgd, "
            + ", ".join(f"{r['run']} {r['accuracy_std']:.4f}" for r in mine if r["run"] != "ssgd")
            + "."
        )
        for r in mine:
            if r["run"] != "ssgd" and r["minus_ssgd_ci"]:
                out.append(accuracy_sentence(r, ssgd))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_accuracy"))
