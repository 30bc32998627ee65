"""Reading what stage 1 wrote: the runs of one experiment's sweep, and how it was run.

Every drawing script reads results through here and nothing else. A finished sweep whose key
(:mod:`paper.cache`) no longer matches the configs and code here is still read, with one
warning line on stderr.

A run under the scale model is read as the cluster it stands for saw it: its ``time_s`` are
the undilated ones and its history's times are divided by its dilation factor, so that every
table and figure takes its times without asking how they were measured. A scale-model run
whose fidelity check failed is left out of what :func:`load` returns (its numbers do not stand
for the cluster); :func:`outside_fidelity` names those runs, and the report counts them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from dcoded.results import dilation, load_sweep, read_history
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


def as_cluster_saw_it(summary: dict) -> dict:
    """The summary with ``time_s`` the emulated cluster's times: under the scale model the
    undilated ones (the wall times kept as ``time_s_wall``), else as written."""
    if not summary.get("time_s_undilated"):
        return summary
    return {**summary, "time_s": summary["time_s_undilated"], "time_s_wall": summary["time_s"]}


@dataclass(frozen=True)
class Run:
    """One job of a sweep: its folder and its ``summary.json`` (as :func:`as_cluster_saw_it`
    reads it: use :func:`run` to make one)."""

    dir: Path
    summary: dict

    def __getitem__(self, key):
        return self.summary[key]

    @property
    def tdf(self) -> float:
        """The run's time dilation factor (1 outside the scale model)."""
        return dilation(self.summary)

    @property
    def faithful(self) -> bool:
        """Whether the run's times stand for its cluster: outside the scale model always (its
        conditions are stated as they are), under it when its fidelity check held."""
        if not self.summary.get("scale_model"):
            return True
        return bool((self.summary.get("fidelity") or {}).get("ok"))

    @property
    def label(self) -> str:
        return label(self.summary)

    @property
    def bandwidth_mbit(self) -> float | None:
        net = self.summary.get("environment", {}).get("netem")
        return net["bandwidth_mbit"] if net else None

    def history(self) -> list[dict]:
        """The run's ``history.csv`` rows; under the scale model its times (the columns named
        ``*_s``) undilated, as its ``time_s`` are."""
        rows = read_history(self.dir)
        if self.tdf == 1.0:
            return rows
        return [
            {
                k: (str(float(v) / self.tdf) if k.endswith("_s") and v != "" else v)
                for k, v in r.items()
            }
            for r in rows
        ]


def run(folder: Path, summary: dict) -> Run:
    """A job's run, its times as its cluster saw them."""
    return Run(Path(folder), as_cluster_saw_it(summary))


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
    runs = [run(j["dir"], j["summary"]) for j in jobs if j["status"] == "finished"]
    ended = len(runs) + (len(failed(results, size, experiment)) if failed_ok else 0)
    if ended != expected:
        unfinished = [f"job {j['job']} {j['status']}" for j in jobs if j["status"] != "finished"]
        raise MissingResults(
            f"{where} holds {len(runs)} finished runs, its sweep had {expected} jobs"
            + (f" ({', '.join(unfinished)})" if unfinished else "")
        )
    return [r for r in runs if r.faithful]


def outside_fidelity(results: Path, size: str, experiment: str) -> list[Run]:
    """The sweep's finished scale-model runs whose fidelity check failed (left out by
    :func:`load`)."""
    where = paths.sweep_dir(results, size, experiment)
    return [
        r
        for r in (
            run(j["dir"], j["summary"]) for j in load_sweep(where) if j["status"] == "finished"
        )
        if not r.faithful
    ]


def scale_model(runs: list[Run]) -> dict | None:
    """How the runs were dilated: ``{"tdf": (least, most), "host_cores", "quota_cores":
    (least, most), "runs"}`` over those under the scale model, ``None`` if none was."""
    scaled = [r.summary["scale_model"] for r in runs if r.summary.get("scale_model")]
    if not scaled:
        return None
    tdf = [m["tdf"] for m in scaled]
    quota = [m["quota_cores"] for m in scaled]
    return {
        "tdf": (min(tdf), max(tdf)),
        "host_cores": scaled[0]["host_cores"],
        "quota_cores": (min(quota), max(quota)),
        "runs": len(scaled),
    }


def failed(results: Path, size: str, experiment: str) -> list[dict]:
    """The sweep's jobs that failed: their overrides and the first line of their error."""
    where = paths.sweep_dir(results, size, experiment)
    return [
        {"job": j["job"], "overrides": j["overrides"], "error": j.get("error")}
        for j in load_sweep(where)
        if j["status"] == "failed"
    ]
