"""Figure 4: test accuracy against steps and against the emulated cluster's time, every
algorithm, five seeds, each model trained until its accuracy stops rising, on MNIST-sized data
and on the bundled handwritten digits.

Reads ``paper_accuracy`` and ``paper_accuracy_digits``. ssgd, ddp and cdc see the same samples
at every step and compute the same update up to the order of float sums; asgd applies stale
gradients (K - 1 steps, its workers pushing in turn). What a step does to the model does not
depend on the links or the hosts' speed, so these runs train on the local cluster; what a step
costs on the emulated cluster is Table 1's scale-model runs of the same configuration
(:data:`TIMED_BY`): the time axis is a run's steps times that step, seed by seed. Each
algorithm runs at its own learning rate, picked on a held-out split (:mod:`paper.tuning`).

"Same accuracy" is judged by a stated rule, never by one run: the final accuracy's difference
to ssgd, paired by seed, has a 95% interval (Student's t over the seeds) that lies within
``±SAME`` (one point): ``same``; one that lies wholly outside it: ``differs``; else
``undecided`` (the seeds cannot tell). "Trained" too: the mean accuracy over the seeds came
within ``SAME`` of its final level (its mean over the last ``HELD`` of the steps) before that
last stretch began: it had stopped rising.
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
#: The scale-model sweeps that time each accuracy sweep's steps: Table 1's, on the same data.
TIMED_BY = {
    "paper_accuracy": ("paper_time", "paper_time_ddp", "paper_phases"),
    "paper_accuracy_digits": ("paper_time_digits", "paper_phases_digits"),
}
#: The margin of "same accuracy": one point of accuracy.
SAME = 0.01
#: "Trained": the plateau reached with at least this share of the budget still to run.
HELD = 0.2
ORDER = ("ssgd", "asgd", "ddp", "cdc")

COLUMNS = [
    "data",
    "model",
    "run",
    "seeds",
    "lr",
    "momentum",
    "steps",
    "final_level",
    "plateau_step",
    "trained",
    "step_ms",
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
TITLE = "Result 4 (Figure 4): accuracy of trained models, against steps and time, five seeds"
READS = EXPERIMENTS + tuple(e for timed in TIMED_BY.values() for e in timed)
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


def algorithm_of(label: str) -> str:
    """The update a run's label computes: ``cdc r=3`` and ``cdc r=2`` the same, every DDP's
    bucket size the same."""
    return label.split()[0]


def steps_of(run: Run) -> int:
    return int(run.summary.get("steps_done") or run["steps"])


def timed_sweeps(results: Path, size: str) -> dict[str, tuple[str, ...]]:
    """``{data: the sweeps that time its steps}`` (:data:`TIMED_BY`) for each accuracy sweep
    that ran, its data named as :func:`groups` names them."""
    out = {}
    for e in EXPERIMENTS:
        runs = load(results, size, e)
        if runs:
            out[data_name(runs[0])] = TIMED_BY[e]
    return out


def _timed_runs(results: Path, size: str) -> dict[str, list[Run]]:
    """``{data: the runs of the sweeps that time its steps}``."""
    return {
        data: [r for t in sweeps for r in load(results, size, t)]
        for data, sweeps in timed_sweeps(results, size).items()
    }


def timing(results: Path, size: str) -> dict[tuple[str, str], dict[str, dict[int, float]]]:
    """``{(data, model): {label: {seed: seconds a step}}}``: each configuration's step on the
    emulated cluster, from the sweeps that time the accuracy sweeps' data (:data:`TIMED_BY`;
    under the scale model, undilated, their unfaithful runs left out), its training time
    over its steps."""
    out: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    for data, timed in _timed_runs(results, size).items():
        for (model, lab), by_seed in seeded(timed).items():
            out.setdefault((data, model), {})[lab] = {
                s: r["time_s"]["total"] / steps_of(r) for s, r in by_seed.items()
            }
    return out


def timed_staleness(results: Path, size: str) -> dict[tuple[str, str], float]:
    """``{(data, model): asgd's mean staleness in the runs that time its steps}``: beside the
    accuracy runs' own, it shows whether the local cluster's asgd stands for the timed one."""
    out = {}
    for data, timed in _timed_runs(results, size).items():
        for model in dict.fromkeys(r["model"] for r in timed):
            stale = [
                r.summary["staleness_mean"]
                for r in timed
                if r["model"] == model and r.summary.get("staleness_mean") is not None
            ]
            if stale:
                out[(data, model)] = statistics.mean(stale)
    return out


def step_for(label: str, timed: dict[str, dict[int, float]]) -> dict[int, float] | None:
    """The step times of the timed configuration an accuracy run's label stands for: the same
    label, else the first of the same update (``ddp`` timed only with set buckets)."""
    if label in timed:
        return timed[label]
    return next((t for lab, t in timed.items() if algorithm_of(lab) == algorithm_of(label)), None)


def plateau(step: np.ndarray, accuracy: np.ndarray) -> tuple[int | None, float | None]:
    """``(step, level)``: the curve's final level, its mean over the evaluations in the last
    :data:`HELD` of its steps, and the first evaluated step at which it came within
    :data:`SAME` of that level; ``(None, None)`` for no evaluation. A mean over the last
    evaluations, not the last one: an evaluation of a trained cnn moves by a point or two.

    >>> plateau(np.array([10, 20, 30, 40, 50]), np.array([0.5, 0.795, 0.81, 0.79, 0.80]))
    (20, 0.8)
    >>> plateau(np.array([10, 20, 30, 40, 50]), np.array([0.5, 0.6, 0.7, 0.8, 0.9]))
    (50, 0.9)
    """
    if not len(step):
        return None, None
    last = step > (1 - HELD) * step[-1]
    level = float(accuracy[last].mean())
    near = np.flatnonzero(accuracy >= level - SAME)
    return int(step[near[0]]), round(level, 6)


def trained(plateau_step: int | None, steps: int) -> bool:
    """Whether the curve came within a point of its final level before the last :data:`HELD`
    of its budget: it had stopped rising (the last evaluations hold the level it reached).

    >>> trained(230, 300), trained(250, 300), trained(None, 300)
    (True, False, False)
    """
    return plateau_step is not None and plateau_step <= (1 - HELD) * steps


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
    timings = timing(results, size)
    for (data, model), mine in groups(results, size).items():
        ssgd = mine.get("ssgd")
        timed = timings.get((data, model), {})
        for lab, by_seed in mine.items():
            step_s = step_for(lab, timed)
            c = curves(by_seed, step_s)
            top, level = plateau(c["step"], c["accuracy"])
            steps = min(steps_of(r) for r in by_seed.values())
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
                    "steps": steps,
                    "plateau_step": top,
                    "final_level": level,
                    "trained": trained(top, steps),
                    "step_ms": 1e3 * statistics.mean(step_s.values()) if step_s else None,
                    "total_s": c["time_s"][-1] if step_s and len(c["time_s"]) else None,
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


def curves(by_seed: dict[int, Run], step_s: dict[int, float] | None = None) -> dict:
    """Over the seeds, at each evaluated step: the step, the mean accuracy and its standard
    deviation (the steps every seed evaluated), and the emulated cluster's time to it: the
    step times the configuration's mean step there (``step_s``, by seed; ``None``: no time)."""
    per_seed = []
    for r in by_seed.values():
        per_seed.append(
            {
                int(h["step"]) + 1: float(h["test_accuracy"])
                for h in r.history()
                if h["test_accuracy"]
            }
        )
    steps = sorted(set.intersection(*(set(p) for p in per_seed)))
    acc = np.array([[p[s] for s in steps] for p in per_seed])
    step = np.array(steps)
    return {
        "step": step,
        "time_s": step * statistics.mean(step_s.values()) if step_s else np.array([]),
        "accuracy": acc.mean(axis=0),
        "std": acc.std(axis=0, ddof=1) if len(per_seed) > 1 else np.zeros(len(steps)),
    }


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    plt = output.pyplot()
    grouped = groups(results, size)
    timings = timing(results, size)
    fig, axes = plt.subplots(
        len(grouped), 2, figsize=(10, 3.4 * len(grouped)), squeeze=False, layout="constrained"
    )
    for (by_step, by_time), ((data, model), mine) in zip(axes, grouped.items(), strict=True):
        for lab, by_seed in mine.items():
            c = curves(by_seed, step_for(lab, timings.get((data, model), {})))
            for ax, x in ((by_step, c["step"]), (by_time, c["time_s"])):
                if not len(x):
                    continue
                (line,) = ax.plot(x, c["accuracy"], "o-", ms=2, label=lab)
                ax.fill_between(
                    x, c["accuracy"] - c["std"], c["accuracy"] + c["std"], alpha=0.2,
                    color=line.get_color(),
                )  # fmt: skip
            top, _ = plateau(c["step"], c["accuracy"])
            if top is not None and lab == "ssgd":
                by_step.axvline(top, color="grey", lw=0.8, ls=":", label="ssgd's plateau")
        by_step.set_xlabel("steps (the same samples for every algorithm)")
        by_time.set_xlabel("seconds on the emulated cluster (steps × Table 1's step)")
        n = len(next(iter(mine.values())))
        by_step.set_title(f"{model} on {data}: {n} seeds, mean ± std", fontsize="medium")
        by_time.set_title(f"{model} on {data}, against time", fontsize="medium")
        for ax in (by_step, by_time):
            ax.set_ylabel("test accuracy")
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize="small")
        by_step.legend(fontsize="small", loc="lower right")
    output.save_figure(fig, paths.figures(out) / "fig4_accuracy.png")
    output.write_table(
        compute(results, size),
        COLUMNS,
        paths.tables(out) / "fig4_accuracy",
        "Figure 4: final test accuracy over seeds (mean, standard deviation), its difference to "
        "ssgd paired by seed (mean [95% interval]) and the verdict of the same-accuracy rule "
        f"(the interval within ±{SAME:g}: same; wholly outside: differs; else undecided); each "
        "algorithm at its tuned rate; final_level: the seed-mean accuracy over the last "
        f"{100 * HELD:.0f}% of the steps, plateau_step: the first evaluation within {SAME:g} of "
        "it (trained: before that last stretch); step_ms: the configuration's step on the "
        "emulated cluster (Table 1's runs, mean over their seeds), total_s: all the steps at it.",
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


def trained_sentence(rows: list[dict]) -> str:
    """Where each algorithm's mean accuracy stopped rising, from its rows of the table."""
    parts = []
    for r in rows:
        if r["trained"]:
            parts.append(
                f"{r['run']} came within one point of its final level {r['final_level']:.3f} at "
                f"step {r['plateau_step']} of {r['steps']}"
            )
        else:
            parts.append(
                f"{r['run']} **still rising**: within one point of its final level "
                f"{r['final_level']:.3f} only at step {r['plateau_step']} of {r['steps']}, in "
                "its last fifth: not judged trained"
            )
    return "; ".join(parts)


def section(results: Path, size: str) -> str:
    rows = compute(results, size)
    out = [output.markdown(rows, COLUMNS)]
    out.append(
        "Each model trains until its accuracy stops rising, on the local cluster: what a step "
        "does to the model does not depend on the links or the hosts' speed. The time axis is "
        "the emulated cluster's: a run's steps times its configuration's step in Table 1's "
        "scale-model runs (cdc at r = 2, the r these runs train at; Table 1b sets every r "
        "beside it).\n"
    )
    stale = timed_staleness(results, size)
    for where in dict.fromkeys((r["data"], r["model"]) for r in rows):
        mine = [r for r in rows if (r["data"], r["model"]) == where]
        out.append(f"- {where[1]} on {where[0]}: " + trained_sentence(mine) + ".")
        asgd = next((r for r in mine if r["run"] == "asgd"), None)
        if asgd and asgd["staleness_mean"] is not None and where in stale:
            out.append(
                f"  asgd's gradients were {asgd['staleness_mean']:.2f} updates stale on average "
                f"here, {stale[where]:.2f} in the timed runs on the emulated cluster."
            )
    out.append("")
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
