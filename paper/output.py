"""Writing what stage 2 makes: tables as markdown and CSV, figures as PNG."""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path

from dcoded import files
from paper import paths


def cell(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return f"{value:,.0f}"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def markdown(rows: Sequence[dict], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_table(rows: Sequence[dict], columns: Sequence[str], stem: Path, caption: str) -> str:
    """``stem.csv`` (full precision) and ``stem.md`` (rounded, with the caption); returns the md."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    with files.create(stem.with_suffix(".csv"), newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    text = markdown(rows, columns)
    files.write_text(stem.with_suffix(".md"), f"{caption}\n\n{text}")
    return text


def save_figure(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)


def pyplot():
    """matplotlib's pyplot on the Agg backend (stage 2 runs without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def cli(module_main, argv: list[str] | None = None, prog: str = "") -> int:
    """The command line every stage-2 script shares: ``--size``, ``--results``, and where it
    draws: ``--out DIR``, ``--into-paper`` (the shipped report), else ``paths.drawn``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Draw from the results of python -m paper.sweep (changing none of them). "
        "By default into <results>/<size>/report/, out of git: the shipped paper/REPORT.md, "
        "paper/figures/ and paper/tables/ are left as they are unless --into-paper.",
    )
    parser.add_argument("--size", choices=paths.SIZES, default="small")
    parser.add_argument(
        "--results",
        type=Path,
        default=paths.RESULTS,
        metavar="DIR",
        help="stage 1's results (default: paper/results)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write figures/, tables/ and REPORT.md into DIR (default: <results>/<size>/report/)",
    )
    where.add_argument(
        "--into-paper",
        action="store_true",
        help="rewrite the shipped report in paper/ (REPORT.md, figures/, tables/), as when "
        "rebuilding it for a commit (make paper INTO_PAPER=1)",
    )
    args = parser.parse_args(argv)
    out = paths.SHIPPED if args.into_paper else args.out or paths.drawn(args.results, args.size)
    module_main(results=args.results, size=args.size, out=out)
    return 0
