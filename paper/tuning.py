"""The learning-rate grid: every algorithm's pick, on a held-out split, for each model.

Reads ``paper_tuning`` (ssgd, asgd, ddp and cdc at each rate of the grid, SGD with momentum
0.9) and ``paper_tuning_asgd`` (asgd without momentum). Each run trains on four fifths of the
training samples and is judged by its accuracy on the fifth held out (``dataset.validation``);
the test set is never seen. An algorithm's pick is its run of the highest held-out accuracy
(the smaller rate on a tie). Stage 1 hands the picks to the accuracy sweeps as
``tuned.<model>.<algorithm>.lr`` and ``.momentum`` (:func:`overrides`), so Figure 4 and Table
1b run every algorithm at its own best rate, never at one rate that suits one of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from paper import output, paths
from paper.results import Run, load

#: The sweeps of the grid, and the sweeps that run at its picks.
GRIDS = ("paper_tuning", "paper_tuning_asgd")
TUNED = ("paper_accuracy", "paper_accuracy_digits")
COLUMNS = ["model", "algorithm", "momentum", "lr", "validation_accuracy", "picked"]


#: Its section of the report: the title, the sweeps it reads (the section says "not run" where
#: one has not) and the figures it shows.
TITLE = "Tuning: every algorithm's learning rate, from the same grid"
READS = GRIDS
FIGURES = ()


def setting(run: Run) -> tuple[float, float]:
    """``(lr, momentum)`` of a run, from the config Hydra saved for it (interpolations, such
    as the accuracy sweeps' ``${tuned...}``, resolved)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run.dir / ".hydra" / "config.yaml")
    momentum = OmegaConf.select(cfg, "optimizer.momentum", default=0.0)
    return float(OmegaConf.select(cfg, "train.lr")), float(momentum)


def runs(results: Path, size: str) -> list[Run]:
    return [r for e in GRIDS for r in load(results, size, e)]


def picks(results: Path, size: str, grid: list[Run] | None = None) -> dict[tuple, dict]:
    """``{(model, algorithm): {"lr", "momentum", "validation_accuracy"}}``: each one's best."""
    best: dict[tuple, dict] = {}
    for r in grid if grid is not None else runs(results, size):
        lr, momentum = setting(r)
        acc = r["final"]["test_accuracy"]
        key = (r["model"], r["algorithm"])
        mine = {"lr": lr, "momentum": momentum, "validation_accuracy": acc}
        now = best.get(key)
        if now is None or (acc, -lr) > (now["validation_accuracy"], -now["lr"]):
            best[key] = mine
    return best


def overrides(chosen: dict[tuple, dict]) -> list[str]:
    """The accuracy sweeps' overrides that set each (model, algorithm)'s picked rate.

    >>> overrides({("dnn", "asgd"): {"lr": 0.02, "momentum": 0.0}})
    ['tuned.dnn.asgd.lr=0.02', 'tuned.dnn.asgd.momentum=0.0']
    """
    out = []
    for (model, algorithm), p in sorted(chosen.items()):
        out += [f"tuned.{model}.{algorithm}.lr={p['lr']:g}"]
        out += [f"tuned.{model}.{algorithm}.momentum={p['momentum']:.1f}"]
    return out


def compute(results: Path, size: str) -> list[dict]:
    """One row per run of the grid, ``picked`` where it is its algorithm's pick."""
    grid = runs(results, size)
    chosen = picks(results, size, grid)
    rows = []
    for r in grid:
        lr, momentum = setting(r)
        p = chosen[(r["model"], r["algorithm"])]
        rows.append(
            {
                "model": r["model"],
                "algorithm": r["algorithm"],
                "momentum": momentum,
                "lr": lr,
                "validation_accuracy": r["final"]["test_accuracy"],
                "picked": "yes" if (p["lr"], p["momentum"]) == (lr, momentum) else "",
            }
        )
    order = ["dnn", "cnn"]
    rows.sort(
        key=lambda x: (
            order.index(x["model"]) if x["model"] in order else 9,
            x["algorithm"],
            -x["momentum"],
            x["lr"],
        )
    )
    return rows


def grid_table(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """The grid as one row per (model, algorithm, momentum), a column per rate."""
    rates = sorted({r["lr"] for r in rows})
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["model"], r["algorithm"], r["momentum"])
        row = out.setdefault(
            key, {"model": r["model"], "algorithm": r["algorithm"], "momentum": r["momentum"]}
        )
        mark = " *" if r["picked"] else ""
        row[f"lr={r['lr']:g}"] = f"{r['validation_accuracy']:.4f}{mark}"
    return list(out.values()), ["model", "algorithm", "momentum", *(f"lr={x:g}" for x in rates)]


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    rows = compute(results, size)
    table, columns = grid_table(rows)
    output.write_table(
        table,
        columns,
        paths.tables(out) / "table_tuning",
        "The learning-rate grid: held-out accuracy (a fifth of the training samples) of each "
        "algorithm at each rate after the accuracy runs' steps, seed 0; * its pick.",
    )


def section(results: Path, size: str) -> str:
    table, columns = grid_table(compute(results, size))
    out = [output.markdown(table, columns)]
    chosen = picks(results, size)
    out.append(
        "Held-out accuracy (a fifth of the training samples, `dataset.validation=0.2`; the "
        "test set unseen) after the accuracy runs' steps at seed 0; `*` marks each "
        "algorithm's pick, the best of its grid (asgd's grid twice: with momentum 0.9 and "
        "without, the usual remedy for K - 1 stale steps adding up). Figure 4 and Table 1b run "
        "at these picks: "
        + "; ".join(
            f"{m} {a} lr {p['lr']:g}" + (f" momentum {p['momentum']:g}" if a == "asgd" else "")
            for (m, a), p in sorted(chosen.items())
        )
        + "."
    )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.tuning"))
