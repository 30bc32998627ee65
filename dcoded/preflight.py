"""What the driver asks its workers before training: what each one has (host, cores, Dask
threads) and whether each can read the data at the path the driver gives.

On ``cluster=address`` the workers are started by hand, maybe on other machines and in other
folders: the times a run reports assume one task at a time per worker (one thread), and every
worker loads the dataset itself from ``dataset.path``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from dcoded.cluster import available_cores
from dcoded.data import DatasetError, dataset_files


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
    return {"host": socket.gethostname(), "cores": available_cores(), "unreadable": unreadable}


def check_workers(client, workers: list[str], dataset: Mapping) -> dict[str, dict]:
    """``{worker: {"host", "cores", "threads"}}`` for the run's workers; raises
    :class:`~dcoded.data.DatasetError` naming every worker (and its host) that cannot read
    the data."""
    replies = client.run(worker_facts, dict(dataset), workers=workers)
    threads = client.scheduler_info()["workers"]
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
