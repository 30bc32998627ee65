"""Functions that run on the Dask workers (module level, so they pickle by reference).

A worker keeps its replica (model, data, optimizer shard) in a process-local registry keyed by
``(run_id, rank)``; the futures between tasks carry only what moves: segments of ``θ``,
sub-batch gradients (which never leave the worker that computed them), packets and reduced
segments. Every task records where its time went; the driver drains these records with
:func:`pull` through ``client.run``.

Task keys are ``"dcoded-{kind}-{run_id}/{step}/..."`` so the transfer logs can be attributed to a
step and a kind (``seg``: all-gather, ``pkt``/``unc``: shuffle, ``red``: cross-cluster sum,
``grad``: gradient to the parameter server).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from dcoded.checkpoint import slice_state
from dcoded.coding import (
    Placement,
    array_split_slices,
    decode_value,
    encode_packet,
    label_without,
    sum_in_order,
)
from dcoded.engine.replica import Replica
from dcoded.engine.spec import RunSpec
from dcoded.optim import SegmentOptimizer

_LOCK = threading.Lock()
_STATES: dict[tuple[str, int], WorkerState] = {}
_RECORDS: dict[str, list[dict]] = defaultdict(list)


@dataclass
class WorkerState:
    spec: RunSpec
    rank: int
    replica: Replica
    placement: Placement
    segments: list[slice]
    optimizer: SegmentOptimizer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def local(self) -> int:
        return self.placement.local(self.rank)

    @property
    def cluster(self) -> int:
        return self.placement.cluster_of(self.rank)


class ReplicaMissing(RuntimeError):
    """A task ran on a worker that does not hold the run's replica (a restarted worker)."""


def _state(run_id: str, rank: int) -> WorkerState:
    try:
        return _STATES[(run_id, rank)]
    except KeyError:
        raise ReplicaMissing(
            f"the worker for rank {rank} holds no replica of run {run_id}: it was restarted"
        ) from None


def _record(run_id: str, **fields) -> None:
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
    state = WorkerState(spec, rank, replica, placement, placement.segments(replica.n_params))
    if spec.algorithm == "cdc":
        seg = state.segments[state.local]
        own = replica.theta[seg]
        state.optimizer = SegmentOptimizer(own, spec.optimizer)
        state.optimizer.load_state_arrays(slice_state(optimizer_state, seg))
        result = own.copy()
    else:
        result = np.zeros(0, np.float32)
    with _LOCK:
        _STATES[(run_id, rank)] = state
    return result


def shard_state(run_id: str, rank: int) -> dict:
    """The optimizer state of this owner's segment, for a checkpoint."""
    return _state(run_id, rank).optimizer.state_arrays()


def teardown(run_id: str, dask_worker=None) -> int:
    """Drop every replica and record of ``run_id`` in this process."""
    with _LOCK:
        gone = [k for k in _STATES if k[0] == run_id]
        for k in gone:
            del _STATES[k]
        _RECORDS.pop(run_id, None)
    return len(gone)


def pull(run_id: str, dask_worker=None) -> dict:
    """Drain this process's task records of ``run_id`` and the worker's transfer-log entries
    not pulled before (run through ``client.run``)."""
    with _LOCK:
        records = _RECORDS.pop(run_id, [])
    out, inc, total = [], [], 0
    if dask_worker is not None:
        shift = float(getattr(dask_worker, "scheduler_delay", 0.0) or 0.0)
        out = _unseen(dask_worker.transfer_outgoing_log, run_id, shift)
        inc = _unseen(dask_worker.transfer_incoming_log, run_id, shift)
        total = int(dask_worker.transfer_outgoing_bytes_total)
    return {"records": records, "out": out, "in": inc, "out_total": total}


def _unseen(log, run_id: str, clock_shift: float = 0.0) -> list[dict]:
    """Entries of a Dask transfer log this run has not pulled yet (each is marked once)."""
    mark = f"dcoded-pulled-{run_id}"
    fresh = []
    for e in list(log):
        if not e.get(mark):
            e[mark] = True
            fresh.append(_log_entry(e, clock_shift))
    return fresh


def _log_entry(e: dict, clock_shift: float = 0.0) -> dict:
    # Dask stamps its logs with its estimate of the scheduler's clock; the task records use
    # this machine's clock, so the estimate is taken back out
    return {
        "start": float(e["start"]) - clock_shift,
        "stop": float(e["stop"]) - clock_shift,
        "who": str(e.get("who")),
        "keys": {str(k): int(v) for k, v in e.get("keys", {}).items()},
    }


# --------------------------------------------------------------------------- CDC


def cdc_map(run_id: str, rank: int, step: int, *segments: np.ndarray) -> dict:
    """Map: the summed gradient ``g_T`` of every sub-batch ``T`` this worker holds, at the
    ``θ`` assembled from the owners' segments."""
    t0 = time.time()
    st = _state(run_id, rank)
    st.replica.set_theta(np.concatenate(segments))
    _, idx = st.replica.step_samples(step)
    slices = st.placement.sub_batch_slices(st.spec.batch_size)[st.cluster]
    grads, loss = {}, 0.0
    for t, label in enumerate(st.placement.sub_batches):
        if st.local in label:
            grads[label], sub_loss = st.replica.grad_sum(idx[slices[t]])
            if label[0] == st.local:  # each sub-batch's loss counted once, by its first holder
                loss += sub_loss
    stop = time.time()
    # the r holders of a sub-batch must compute the same bits, or XOR decoding is silently
    # wrong: the driver compares these digests across holders (no bytes on the wire)
    digests = {label: _digest(g) for label, g in grads.items()}
    _record(
        run_id,
        step=step,
        rank=rank,
        phase="map",
        start=t0,
        stop=stop,
        loss=loss,
        cluster=st.cluster,
        digests=digests,
    )
    return grads


def _digest(values: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(values).view(np.uint8), digest_size=8).hexdigest()


def cdc_encode(run_id: str, rank: int, step: int, group: tuple, grads: dict) -> np.ndarray:
    """Coded shuffle: the packet ``P(S, j)`` of this worker in group ``S`` (uint32)."""
    t0 = time.time()
    st = _state(run_id, rank)
    packet = encode_packet(group, st.local, grads, st.segments)
    _record_sent(run_id, rank, step, t0, packet, receivers=len(group) - 1)
    return packet


def cdc_uncoded(run_id: str, rank: int, step: int, group: tuple, receiver: int, grads: dict):
    """Uncoded shuffle: ``v(S, k)`` sent whole by one holder (float32)."""
    t0 = time.time()
    st = _state(run_id, rank)
    value = grads[label_without(group, receiver)][st.segments[receiver]].copy()
    _record_sent(run_id, rank, step, t0, value, receivers=1)
    return value


def _record_sent(run_id: str, rank: int, step: int, t0: float, payload, receivers: int) -> None:
    """The encode phase and what it will send: once (multicast), once per receiver (unicast)."""
    _record(
        run_id,
        step=step,
        rank=rank,
        phase="encode",
        start=t0,
        stop=time.time(),
        multicast=payload.nbytes,
        unicast=payload.nbytes * receivers,
    )


def cdc_reduce(run_id: str, rank: int, step: int, grads: dict, received: dict) -> np.ndarray:
    """Decode what this owner lacks and reduce its segment ``G[k] = Σ_T g_T[k]`` (fixed order).

    ``received`` maps ``(S, sender)`` to a packet (coded) or ``S`` to ``v(S, k)`` (uncoded).
    """
    t0 = time.time()
    st = _state(run_id, rank)
    k, seg, p = st.local, st.segments[st.local], st.placement
    decoded = {}
    for group in p.groups_of(k):
        if st.spec.shuffle == "coded":
            packets = {j: received[(group, j)] for j in group if j != k}
            value = decode_value(group, k, packets, grads, st.segments)
        else:
            value = received[group]
        decoded[label_without(group, k)] = value
    reduced = sum_in_order([grads[t][seg] if k in t else decoded[t] for t in p.sub_batches])
    extra = {}
    if p.n_clusters > 1:  # the reduced segment goes to the other clusters' owners
        extra = {"multicast": reduced.nbytes, "unicast": reduced.nbytes * (p.n_clusters - 1)}
    _record(run_id, step=step, rank=rank, phase="decode", start=t0, stop=time.time(), **extra)
    return reduced


def cdc_update(run_id: str, rank: int, step: int, *reduced: np.ndarray) -> np.ndarray:
    """Sum the clusters' reduced segments (cluster order), apply the optimizer shard with
    ``G[k] / B``, and return the updated segment (the next maps all-gather it)."""
    t0 = time.time()
    st = _state(run_id, rank)
    segment = st.optimizer.step(sum_in_order(list(reduced)), st.spec.batch_size)
    _record(
        run_id,
        step=step,
        rank=rank,
        phase="update",
        start=t0,
        stop=time.time(),
        params=segment.nbytes * (st.placement.g - 1),
    )
    return segment


def cdc_reduce_update(run_id: str, rank: int, step: int, grads: dict, received: dict):
    """:func:`cdc_reduce` then :func:`cdc_update` in one task, when there is one cluster and
    so nothing to sum across clusters (one task fewer per worker and step)."""
    return cdc_update(run_id, rank, step, cdc_reduce(run_id, rank, step, grads, received))


# --------------------------------------------------------------------------- parameter server


def ps_grad(run_id: str, rank: int, step: int, part: int, theta: np.ndarray) -> dict:
    """Gradient (summed) of part ``part`` of ``K`` of step ``step``'s samples at ``θ``."""
    t0 = time.time()
    st = _state(run_id, rank)
    with st.lock:  # asgd may hand one worker two updates; a multi-threaded worker runs both
        st.replica.set_theta(theta)
        _, idx = st.replica.step_samples(step)
        n = st.spec.n_workers
        grad, loss = st.replica.grad_sum(idx[array_split_slices(len(idx), n)[part]])
    return {"grad": grad, "loss": loss, "start": t0, "stop": time.time(), "rank": rank}
