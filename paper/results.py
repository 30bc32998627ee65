"""Reading what stage 1 wrote: the runs of one experiment's sweep, and how it was run.

Every drawing script reads results through here and nothing else. A finished sweep whose key
(:mod:`paper.cache`) no longer matches the configs and code here is still read, with one
warning line on stderr.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from dcoded.results import load_sweep, read_history
from paper import cache, paths
from paper.cache import COMPLETE

_staleness: dict[Path, str | None] = {}


class MissingResults(RuntimeError):
    """An experiment's sweep has not finished: run stage 1 (``python -m paper.sweep``)."""


def label(summary: dict) -> str:
    """How tables and legends name a run: the algorithm, and cdc's r and shuffle."""
    if summary["algorithm"] == "ddp" and summary.get("bucket_cap_mb"):
        return f"ddp {summary['bucket_cap_mb']:g}MiB buckets"
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


def seeded(runs: list[Run]) -> dict[tuple[str, str], dict[int, Run]]:
    """The runs by ``(model, label)``, each ``{seed: run}``: the repeats of one configuration."""
    out: dict[tuple[str, str], dict[int, Run]] = {}
    for r in runs:
        out.setdefault((r["model"], r.label), {})[r["seed"]] = r
    return out


def meta(results: Path, size: str, experiment: str) -> dict:
    """How the sweep was run (stage 1's record); :class:`MissingResults` if it has not finished."""
    where = paths.sweep_dir(results, size, experiment)
    f = where / COMPLETE
    if not f.exists():
        how = (
            f"`python -m paper.sweep --size {size} --beyond` (or `make paper BEYOND=1`)"
            if experiment in paths.BEYOND
            else f"`python -m paper.sweep --size {size}` (or `make paper`)"
        )
        raise MissingResults(f"no finished sweep of {experiment} in {where}: run {how} first")
    record = json.loads(f.read_text())
    stale(results, size, experiment)
    return record


def stale(results: Path, size: str, experiment: str) -> str | None:
    """Why a finished sweep no longer matches the configs and code here (``None``: it does).
    The first time a stale sweep is asked about, one warning line goes to stderr."""
    where = paths.sweep_dir(results, size, experiment).resolve()
    if where not in _staleness:
        why = _staleness[where] = cache.check_finished(where)
        if why:
            print(
                f"warning: the sweep in {where} is stale ({why}); `python -m paper.sweep "
                f"--size {size} --only {experiment}` runs it again",
                file=sys.stderr,
            )
    return _staleness[where]


def load(results: Path, size: str, experiment: str, failed_ok: bool = False) -> list[Run]:
    """Every job of the sweep, in job order (read by :func:`dcoded.results.load_sweep`, as
    users read theirs); :class:`MissingResults` unless every job finished (with ``failed_ok``:
    unless every job finished or failed with its reason written; :func:`failed` lists those)."""
    expected = meta(results, size, experiment)["jobs"]
    where = paths.sweep_dir(results, size, experiment)
    jobs = load_sweep(where)
    runs = [Run(j["dir"], j["summary"]) for j in jobs if j["status"] == "finished"]
    ended = len(runs) + (len(failed(results, size, experiment)) if failed_ok else 0)
    if ended != expected:
        unfinished = [f"job {j['job']} {j['status']}" for j in jobs if j["status"] != "finished"]
        raise MissingResults(
            f"{where} holds {len(runs)} finished runs, its sweep had {expected} jobs"
            + (f" ({', '.join(unfinished)})" if unfinished else "")
        )
    return runs


def failed(results: Path, size: str, experiment: str) -> list[dict]:
    """The sweep's jobs that failed: their overrides and the first line of their error."""
    where = paths.sweep_dir(results, size, experiment)
    return [
        {"job": j["job"], "overrides": j["overrides"], "error": j.get("error")}
        for j in load_sweep(where)
        if j["status"] == "failed"
    ]
