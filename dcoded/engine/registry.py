"""The worker side's registry and records: what every algorithm's worker functions share.

A worker process keeps its replica (model, data, optimizer shard, and on ``transport=direct``
its links) in a process-local registry keyed by ``(run_id, rank)``: :func:`setup` builds it,
:func:`state` finds it, :func:`teardown` drops it. Every worker function keeps a
:func:`record` of where its time and bytes went; the driver takes the records with
:func:`drain_records` (through ``client.run``, see :meth:`dcoded.engine.driver.Context.collect`).

Task keys are ``"dcoded-{kind}-{run_id}/{step}/..."`` (:func:`task_key`) so the transfer logs
can be attributed to a step and a kind (``seg``: all-gather, ``pkt``/``unc``/``sum``/``hyb``:
shuffle, ``red``: cross-cluster sum, ``grad``: gradient to the parameter server).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dcoded.checkpoint import slice_state
from dcoded.cluster import available_cores
from dcoded.coding import Placement
from dcoded.coding.cross import cross_chunks
from dcoded.engine import straggle
from dcoded.engine.replica import Replica
from dcoded.engine.spec import RunSpec
from dcoded.errors import ReplicaMissing
from dcoded.optim import SegmentOptimizer

#: How many recent steps a worker's pace is judged over (``coding.stragglers``).
PACES = 8

_LOCK = threading.Lock()
_STATES: dict[tuple[str, int], WorkerState] = {}
#: The runs torn down in this process, newest last (a setup task still queued when its run
#: failed would otherwise leave its replica behind, in a worker that serves other runs).
_TORN_DOWN: deque[str] = deque(maxlen=1000)
_RECORDS: dict[str, list[dict]] = defaultdict(list)


@dataclass
class WorkerState:
    spec: RunSpec
    rank: int
    replica: Replica
    placement: Placement
    segments: list[slice]
    optimizer: SegmentOptimizer | None = None  # this owner's shard
    #: ``r = K``: every segment's shard, each worker updating all of ``θ`` itself
    optimizers: list[SegmentOptimizer] = field(default_factory=list)
    link: object | None = None  # the direct transport's connections and mailbox
    #: ``ddp``: the rank's process group, model and optimizer (:class:`~dcoded.engine.ddp.Group`)
    group: object | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: ``coding.stragglers``: ``(step, grads)`` of the last map finished, for requests
    serving: tuple | None = None
    #: ``straggle=slow`` as root: this process's cgroup (:class:`~dcoded.engine.straggle.Throttle`)
    throttle: object | None = None
    #: ``coding.stragglers``: this worker's recent map times over the others' (its pace)
    paces: deque = field(default_factory=lambda: deque(maxlen=PACES))
    #: ``transport=dask``: the owner's segment as its last update returned it (see own_segment)
    segment: np.ndarray | None = None

    def close(self) -> None:
        """Wake a direct loop that waits for peers, close its connections (or DDP's process
        group), and take the process out of its cgroup."""
        if self.link is not None:
            self.link.close("the run was torn down")
        if self.group is not None:
            self.group.close()
        if self.throttle is not None:
            self.throttle.release()
            self.throttle = None

    @property
    def local(self) -> int:
        return self.placement.local(self.rank)

    @property
    def cluster(self) -> int:
        return self.placement.cluster_of(self.rank)


def state(run_id: str, rank: int) -> WorkerState:
    try:
        return _STATES[(run_id, rank)]
    except KeyError:
        raise ReplicaMissing(
            f"the worker for rank {rank} holds no replica of run {run_id}: it was restarted"
        ) from None


def find_state(run_id: str, rank: int) -> WorkerState | None:
    """This process's replica of ``rank`` in run ``run_id``, if it holds one."""
    return _STATES.get((run_id, rank))


def record(run_id: str, **fields) -> None:
    """Keep one fact (a phase's start and stop, bytes, a loss) for the driver's next drain."""
    with _LOCK:
        _RECORDS[run_id].append(fields)


def task_key(run_id: str, kind: str, step: int, *parts) -> str:
    """``dcoded-{kind}-{run_id}/{step}/...``: Dask names a task's prefix and group by what
    comes before the first non-alphabetic word (``dcoded-map``), so one prefix per kind; a key
    that began with the run and step made a new prefix for every task, which the scheduler
    keeps for good, and steps slowed down as a run went on."""
    tail = "/".join("-".join(map(str, p)) if isinstance(p, tuple) else str(p) for p in parts)
    return f"dcoded-{kind}-{run_id}/{step}" + (f"/{tail}" if tail else "")


def parse_key(key) -> tuple[str, str, int] | None:
    """``(run_id, kind, step)`` of a key made by :func:`task_key`, else ``None``."""
    if not isinstance(key, str):
        return None
    parts = key.split("/")
    head = parts[0].split("-", 2)
    if len(parts) < 2 or len(head) < 3 or head[0] != "dcoded":
        return None
    if not parts[1].lstrip("-").isdigit():
        return None
    return head[2], head[1], int(parts[1])


# --------------------------------------------------------------------------- setup / teardown


def setup(
    run_id: str,
    rank: int,
    spec: RunSpec,
    theta: np.ndarray | None = None,
    optimizer_state: dict | None = None,
) -> np.ndarray:
    """Build the replica of ``rank``; return its own segment of ``θ`` (CDC) or nothing.

    ``theta`` and the full-length ``optimizer_state`` (from a checkpoint) restart a run
    instead of the seeded initialisation; this worker keeps the slice of its segment.
    """
    replica = Replica(spec)
    if theta is not None:
        replica.set_theta(theta)
    placement = spec.placement
    st = WorkerState(spec, rank, replica, placement, placement.segments(replica.n_params))
    if spec.algorithm == "cdc":
        theta = replica.theta
        shards = range(len(st.segments)) if spec.replicated else [st.local]
        for i in shards:
            seg = st.segments[i]
            shard = SegmentOptimizer(theta[seg], spec.optimizer, cross_chunks(placement, seg))
            shard.load_state_arrays(slice_state(optimizer_state, seg))
            st.optimizers.append(shard)
        st.optimizer = st.optimizers[st.local if spec.replicated else 0]
        result = theta[st.segments[st.local]].copy()
    else:
        result = np.zeros(0, np.float32)
    with _LOCK:
        if run_id in _TORN_DOWN:  # its run ended while this task waited: keep nothing
            st.close()
            return result
        _STATES[(run_id, rank)] = st
        first = len(_STATES) == 1  # the first replica here (threads of one process: once)
    if first and worker_process():
        hold_collections()
        reset_peak_memory()  # this run's peak, not an earlier job's on the same worker
    st.throttle = throttle(run_id, rank, spec)
    return result


def reset_peak_memory() -> None:
    """Start this process's peak resident memory afresh (Linux: ``5`` written to
    ``/proc/self/clear_refs`` resets ``VmHWM``); elsewhere nothing."""
    try:
        fd = os.open(_CLEAR_REFS, os.O_WRONLY)
    except OSError:
        return
    try:
        os.write(fd, b"5")
    except OSError:
        pass
    finally:
        os.close(fd)


def peak_memory() -> int | None:
    """This process's peak resident memory in bytes since it began or since
    :func:`reset_peak_memory` (``VmHWM``); ``None`` where the system does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


_CLEAR_REFS = "/proc/self/clear_refs"  # written, not read: the kernel's, never a link


def worker_process() -> bool:
    """Whether this process is a worker of its own (a nanny's child), not the driver's with
    its workers as threads (``LocalCluster(processes=False)``: a notebook's, a test's), where
    freezing would hold the caller's heap and a collection of it costs every run."""
    return multiprocessing.parent_process() is not None


def hold_collections() -> None:
    """Collect this process's garbage once, then freeze what lives (``gc.freeze``), so that a
    collection during the run walks only what the run made. A full collection of a worker's
    heap (a Dask worker with torch loaded) takes about 150 ms of CPU, and every rank waiting
    for that worker's messages waits for it: under the scale model at K = 8, the first run on
    a cluster met one every few steps (0.9 s of its host's dilated time each) and its median
    step was 1.6x its bound, against 1.1x with the heap frozen. :func:`teardown` of the last
    run in the process unfreezes it, so what the runs leave is collected again. (Not under
    ``_LOCK``: a collection runs finalizers.)"""
    gc.collect()
    gc.freeze()


def throttle(run_id: str, rank: int, spec: RunSpec):
    """``straggle=slow``: put this worker process in a cgroup with a CPU quota where that
    works (root, one worker per process, a cgroup v1 cpu controller), else ``None`` (the
    fallback: a delay after each computation, or not slow at all). Recorded either way."""
    speed = straggle.slowdown(spec.straggle, rank)
    if speed is None:
        return None
    how, detail = "delay", "no cgroup: not root, or no cgroup v1 cpu controller"
    throttle, quota = None, {}
    if not spec.straggle.get("cgroup", True):
        detail = "this cluster runs its workers as threads of one process"
    elif straggle.cgroup_usable():
        try:
            # under the scale model a fraction of its own host's quota (its cgroup is inside
            # the host's, as corrected for the compute speed), so nothing it loses goes to the
            # others; else of a fair share
            host = os.environ.get("DCODED_HOST_CORES")
            share = float(host) * spec.host_quota_scale if host else None
            cores = share * spec.n_workers if share else available_cores()
            name = straggle.cgroup_name(run_id, rank)
            throttle = straggle.Throttle(name, speed, cores, spec.n_workers)
            how, detail = "cgroup", throttle.describe()
            quota = {"quota_us": throttle.quota_us, "period_us": throttle.period_us}
        except OSError as e:
            detail = f"the cgroup could not be made: {e}"
    record(
        run_id, step=-1, rank=rank, phase="throttle", how=how, detail=detail, speed=speed, **quota
    )
    return throttle


def shard_state(run_id: str, rank: int, *after) -> dict:
    """The optimizer state of this owner's segment, for a checkpoint (``after``: futures
    this must wait for)."""
    return state(run_id, rank).optimizer.state_arrays()


def own_segment(run_id: str, rank: int) -> np.ndarray:
    """The owner's segment as its last update returned it: a task that depends on nothing,
    for the next maps to read instead of that update's (which depends on the step before,
    and so on back to the setup: the scheduler would keep every task of the run)."""
    return state(run_id, rank).segment


def current_theta(run_id: str, rank: int, *after) -> np.ndarray:
    """The worker's full ``θ`` (``r = K``, or the direct transport after its all-gather)."""
    return state(run_id, rank).replica.theta


def teardown(run_id: str, dask_worker=None) -> int:
    """Drop every replica and record of ``run_id`` in this process."""
    with _LOCK:
        gone = [k for k in _STATES if k[0] == run_id]
        states = [_STATES.pop(k) for k in gone]
        _RECORDS.pop(run_id, None)
        _TORN_DOWN.append(run_id)
        if states and not _STATES:  # no run left here: what they froze may be collected
            gc.unfreeze()
    for state in states:
        state.close()
    return len(states)


def kill_worker_process(address: str, dask_worker=None) -> int | None:
    """Run on a nanny (``client.run(..., nanny=True)``): SIGKILL its worker process if it is
    still the one at ``address`` (a frozen one; a dead one's nanny may have started another
    already), which a stopped process cannot ignore; the nanny then starts another, as after
    any death. The pid killed, or ``None``."""
    process = getattr(dask_worker, "process", None)
    if getattr(process, "worker_address", None) != address:
        return None
    pid = getattr(getattr(process, "process", None), "pid", None)
    if pid:
        os.kill(pid, signal.SIGKILL)
    return pid


def drain_records(run_id: str, dask_worker=None) -> dict:
    """Take this process's task records of ``run_id`` and the worker's transfer-log entries
    not drained before (run through ``client.run`` by :meth:`Context.collect`)."""
    with _LOCK:
        records = _RECORDS.pop(run_id, [])
    out, inc, total, address = [], [], 0, None
    if dask_worker is not None:
        address = getattr(dask_worker, "address", None)
        shift = float(getattr(dask_worker, "scheduler_delay", 0.0) or 0.0)
        out = _unseen(_long(dask_worker, "transfer_outgoing_log"), run_id, shift)
        inc = _unseen(_long(dask_worker, "transfer_incoming_log"), run_id, shift)
        total = int(dask_worker.transfer_outgoing_bytes_total)
    return {
        "records": records,
        "out": out,
        "in": inc,
        "out_total": total,
        "worker": address,
        "peak_rss": peak_memory(),  # the process's: its workers' together where threads
    }


#: How many entries each of a worker's two transfer logs keeps: far more than a run moves
#: between two collections (Dask keeps 1,000, ``distributed.admin.low-level-log-length``,
#: which also sizes its other logs and the profiler's history, left as they are).
TRANSFER_LOG_LENGTH = 100_000


def _long(dask_worker, name: str) -> deque:
    """The worker's transfer log ``name``, made to keep :data:`TRANSFER_LOG_LENGTH` entries
    (once per worker process; a worker of the user's own cluster too)."""
    log = getattr(dask_worker, name)
    if log.maxlen is not None and log.maxlen < TRANSFER_LOG_LENGTH:
        log = deque(log, maxlen=TRANSFER_LOG_LENGTH)
        setattr(dask_worker, name, log)
    return log


def _unseen(log, run_id: str, clock_shift: float = 0.0) -> list[dict]:
    """Entries of a Dask transfer log this run has not drained yet (each is marked once),
    oldest first. Every entry older than one this run marked was marked in the same or an
    earlier drain, so the look goes from the newest back to the first marked: a drain costs
    what is new, not the log's length."""
    mark = f"dcoded-drained-{run_id}"
    fresh = []
    for e in reversed(list(log)):
        if e.get(mark):
            break
        e[mark] = True
        fresh.append(_log_entry(e, clock_shift))
    return fresh[::-1]


def _log_entry(e: dict, clock_shift: float = 0.0) -> dict:
    # Dask stamps its logs with its estimate of the scheduler's clock; the task records use
    # this machine's clock, so the estimate is taken back out
    return {
        "start": float(e["start"]) - clock_shift,
        "stop": float(e["stop"]) - clock_shift,
        "who": str(e.get("who")),
        "keys": {str(k): int(v) for k, v in e.get("keys", {}).items()},
    }
