"""Reading what stage 1 wrote: the runs of one experiment's sweep, and how it was run.

Every drawing script reads results through here and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dcoded.results import load_sweep, read_history
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
    """Every job of the sweep, in job order (read by :func:`dcoded.results.load_sweep`, as
    users read theirs); :class:`MissingResults` unless every job finished."""
    expected = meta(results, size, experiment)["jobs"]
    where = paths.sweep_dir(results, size, experiment)
    jobs = load_sweep(where)
    runs = [Run(j["dir"], j["summary"]) for j in jobs if j["status"] == "finished"]
    if len(runs) != expected:
        unfinished = [f"job {j['job']} {j['status']}" for j in jobs if j["status"] != "finished"]
        raise MissingResults(
            f"{where} holds {len(runs)} finished runs, its sweep had {expected} jobs"
            + (f" ({', '.join(unfinished)})" if unfinished else "")
        )
    return runs
