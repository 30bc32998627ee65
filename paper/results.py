"""Reading what stage 1 wrote: the runs of one experiment's sweep, and how it was run.

Every drawing script reads results through here and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from paper import paths

#: What stage 1 writes into a sweep's folder when every job of it has finished.
COMPLETE = "complete.json"


class MissingResults(RuntimeError):
    """An experiment's sweep has not finished: run stage 1 (``python -m paper.sweep``)."""


def label(summary: dict) -> str:
    """How tables and legends name a run: the algorithm, and cdc's r and shuffle."""
    if summary["algorithm"] != "cdc":
        return summary["algorithm"]
    uncoded = " uncoded" if summary["shuffle"] == "uncoded" else ""
    return f"cdc r={summary['redundancy']}{uncoded}"


@dataclass(frozen=True)
class Run:
    """One job of a sweep: its folder and its ``summary.json``."""

    dir: Path
    summary: dict

    def __getitem__(self, key):
        return self.summary[key]

    @property
    def label(self) -> str:
        return label(self.summary)

    @property
    def bandwidth_mbit(self) -> float | None:
        net = self.summary.get("environment", {}).get("netem")
        return net["bandwidth_mbit"] if net else None

    def history(self) -> list[dict]:
        from dcoded.plots import read_history

        return read_history(self.dir)


def meta(results: Path, size: str, experiment: str) -> dict:
    """How the sweep was run (stage 1's record); :class:`MissingResults` if it has not finished."""
    where = paths.sweep_dir(results, size, experiment)
    f = where / COMPLETE
    if not f.exists():
        raise MissingResults(
            f"no finished sweep of {experiment} in {where}: run `python -m paper.sweep "
            f"--size {size}` (or `make paper`) first"
        )
    return json.loads(f.read_text())


def load(results: Path, size: str, experiment: str) -> list[Run]:
    """Every job of the sweep, in job order."""
    expected = meta(results, size, experiment)["jobs"]
    where = paths.sweep_dir(results, size, experiment)
    runs = [Run(f.parent, json.loads(f.read_text())) for f in where.glob("*/summary.json")]
    if len(runs) != expected:
        raise MissingResults(f"{where} holds {len(runs)} runs, its sweep had {expected} jobs")
    return sorted(runs, key=lambda run: int(run.dir.name.split("-", 1)[0]))
