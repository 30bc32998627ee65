"""Stage 2: every table, figure and ``REPORT.md`` from the results of stage 1 (reads only).

    python -m paper.draw [--size small|full] [--results DIR] [--out DIR]

A table or figure whose sweep has not run (or was skipped) is left out with the reason; the
report says so in its place.
"""

from __future__ import annotations

import sys
from pathlib import Path

from paper import output, paths, report
from paper.results import MissingResults
from paper.sections import SECTIONS


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    for script in SECTIONS:
        name = script.__name__.rsplit(".", 1)[-1]
        try:
            script.main(results=results, size=size, out=out)
        except MissingResults as e:
            print(f"{name}: not drawn ({e})", file=sys.stderr)
            continue
        print(f"{name}: drawn")
    report.main(results=results, size=size, out=out)
    print(f"report: {paths.report(out)}")


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.draw"))
