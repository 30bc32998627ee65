"""What the driver asks its workers before training: what each one has (host, cores, Dask
threads) and whether each can read the data at the path the driver gives.

On ``cluster=address`` the workers are started by hand, maybe on other machines and in other
folders: the times a run reports assume one task at a time per worker (one thread), and every
worker loads the dataset itself from ``dataset.path``.
"""

from __future__ import annotations

import os
import socket
from collections import defaultdict
from collections.abc import Mapping

from dcoded.cluster import available_cores
from dcoded.data import DatasetError, dataset_files
from dcoded.health import known_workers


def worker_facts(dataset: Mapping) -> dict:
    """Runs on a worker: its host name and cores, and why it cannot read the dataset's files
    (``None`` when it can)."""
    unreadable = None
    try:
        for path in dataset_files(dataset):
            with open(path, "rb") as f:
                f.read(1)
    except (DatasetError, OSError) as e:
        unreadable = str(e)
    return {
        "host": socket.gethostname(),
        "cores": available_cores(),
        "pid": os.getpid(),
        "cpus": _cpus(),
        "unreadable": unreadable,
    }


def check_workers(client, workers: list[str], dataset: Mapping) -> dict[str, dict]:
    """``{worker: {"host", "cores", "threads"}}`` for the run's workers; raises
    :class:`~dcoded.data.DatasetError` naming every worker (and its host) that cannot read
    the data."""
    replies = client.run(worker_facts, dict(dataset), workers=workers)
    threads = known_workers(client, stale_ok=True)
    cannot = {w: f for w, f in replies.items() if f["unreadable"]}
    if cannot:
        who = ", ".join(f"{w} (host {f['host']})" for w, f in sorted(cannot.items()))
        reason = next(iter(cannot.values()))["unreadable"]
        raise DatasetError(
            f"worker {who} cannot read the data: {reason}; every worker must be able to read "
            "dataset.path at that same path"
        )
    return {
        w: {
            "host": replies[w]["host"],
            "cores": replies[w]["cores"],
            "threads": threads[w]["nthreads"],
            # a worker of an older dcoded (cluster=address) does not say
            "pid": replies[w].get("pid"),
            "cpus": replies[w].get("cpus"),
        }
        for w in workers
    }


def thread_warning(facts: Mapping[str, Mapping]) -> str | None:
    """A line when a worker runs more than one Dask thread: its tasks of a step may then run
    at once and share its cores, and the phase times no longer measure one task each."""
    many = {w: f["threads"] for w, f in facts.items() if f["threads"] > 1}
    if not many:
        return None
    listed = ", ".join(f"{w} has {n}" for w, n in sorted(many.items()))
    return (
        f"{len(many)} of {len(facts)} workers run more than one thread ({listed}): the times "
        "assume one task at a time per worker; start workers with `dask worker --nthreads 1`"
    )


def _cpus() -> list[int] | None:
    """The CPUs this process may run on (``None`` where the OS does not say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None


def _shares(facts: Mapping[str, Mapping]) -> tuple[dict, dict]:
    """By host: the workers' processes (pids: in-process workers are one process) and the
    CPUs they may run on together (the union of their affinities, else the host's cores)."""
    processes, cpus, cores = defaultdict(set), defaultdict(set), defaultdict(int)
    for f in facts.values():
        if f.get("pid") is None:  # an older dcoded's worker: not known
            continue
        processes[f["host"]].add(f["pid"])
        cpus[f["host"]].update(f.get("cpus") or [])
        cores[f["host"]] = max(cores[f["host"]], len(cpus[f["host"]]) or f["cores"])
    return processes, cores


def crowding(facts: Mapping[str, Mapping]) -> float:
    """How many worker processes share one CPU on the most crowded host (1 where none
    share): how much longer than on machines of their own a worker may take to answer.

    >>> crowding({w: {"host": "n1", "cores": 2, "pid": i, "cpus": [0, 1]} for i, w in enumerate("abcdef")})
    3.0
    >>> crowding({"a": {"host": "n1", "cores": 4, "pid": 1}}), crowding({})
    (1.0, 1.0)
    """  # noqa: E501
    processes, cores = _shares(facts)
    return max([1.0, *(len(processes[h]) / max(1, cores[h]) for h in processes)])


def cores_warning(facts: Mapping[str, Mapping]) -> str | None:
    """A line when a host runs more worker processes than the CPUs they may run on together:
    their computations then take turns, and the times change from run to run. Processes are
    told apart by pid (in-process workers are one process), CPUs by the union of the
    workers' affinities (one worker pinned per core is not warned of).

    >>> four = {w: {"host": "n1", "cores": 2, "pid": i, "cpus": [0, 1]} for i, w in enumerate("abcd")}
    >>> cores_warning(four)
    '4 worker processes share the 2 cores of n1: their computations take turns and the times vary from run to run; at most 2 per host (cluster.n_workers) keep each computation on a core of its own'
    >>> cores_warning({w: {"host": "n1", "cores": 1, "pid": i, "cpus": [i]} for i, w in enumerate("ab")})
    >>> cores_warning({"a": {"host": "n1", "cores": 2, "pid": 1}}) is None
    True
    """  # noqa: E501
    processes, cores = _shares(facts)
    over = sorted(h for h in processes if len(processes[h]) > cores[h])
    if not over:
        return None
    host = over[0]
    more = f" (and {len(over) - 1} other hosts)" if len(over) > 1 else ""
    return (
        f"{len(processes[host])} worker processes share the {cores[host]} cores of {host}{more}: "
        "their computations take turns and the times vary from run to run; at most "
        f"{cores[host]} per host (cluster.n_workers) keep each computation on a core of its own"
    )
