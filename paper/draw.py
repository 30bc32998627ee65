"""Stage 2: every table, figure and ``REPORT.md`` from the results of stage 1 (changing none).

    python -m paper.draw [--size small|full] [--results DIR] [--out DIR | --into-paper]

By default it draws into ``<results>/<size>/report/`` (``paper/results/small/report/``, out
of git), never over the shipped report: ``--into-paper`` rewrites ``paper/REPORT.md``,
``paper/figures/`` and ``paper/tables/`` (``make paper INTO_PAPER=1``), as when rebuilding the
report for a commit. A table or figure whose sweep has not run (or was skipped) is left out
with the reason; the report says so in its place.
"""

from __future__ import annotations

import sys
from pathlib import Path

from paper import output, paths, report
from paper.results import MissingResults
from paper.sections import SECTIONS


def main(results: Path = paths.RESULTS, size: str = "small", out: Path | None = None) -> None:
    """Draw every section and the report into ``out`` (``paths.drawn(results, size)`` when
    not given; ``paths.SHIPPED`` rewrites the shipped report)."""
    out = paths.drawn(results, size) if out is None else Path(out)
    for script in SECTIONS:
        name = script.__name__.rsplit(".", 1)[-1]
        try:
            script.main(results=results, size=size, out=out)
        except MissingResults as e:
            print(f"{name}: not drawn ({e})", file=sys.stderr)
            continue
        print(f"{name}: drawn")
    report.main(results=results, size=size, out=out)
    shipped = out.resolve() == paths.SHIPPED.resolve()
    note = (
        "" if shipped else " (the shipped paper/REPORT.md is unchanged: --into-paper rewrites it)"
    )
    print(f"report: {paths.report(out)}{note}")


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.draw"))
