"""Functions that run on the Dask workers (module level, so they pickle by reference).

A worker keeps its replica (model, data, optimizer shard) in a process-local registry keyed by
``(run_id, rank)``; the futures between tasks carry only what moves: segments of ``θ``,
sub-batch gradients (which never leave the worker that computed them), packets and reduced
segments. Every task records where its time went; the driver drains these records with
:func:`pull` through ``client.run``.

Task keys are ``"dcoded-{kind}-{run_id}/{step}/..."`` so the transfer logs can be attributed to a
step and a kind (``seg``: all-gather, ``pkt``/``unc``/``sum``/``hyb``: shuffle, ``red``:
cross-cluster sum, ``sum``: pre-summed parts, ``grad``: gradient to the parameter server).
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
    HybridPlan,
    Placement,
    array_split_slices,
    charged_value,
    decode_value,
    decode_values,
    encode_packet,
    encode_values,
    hybrid_plan,
    label_without,
    sum_in_order,
    summed_plan,
    uncoded_sender,
)
from dcoded.engine.replica import Replica
from dcoded.engine.spec import RunSpec
from dcoded.errors import ReplicaMissing
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
    optimizer: SegmentOptimizer | None = None  # this owner's shard
    #: ``r = K``: every segment's shard, each worker updating all of ``θ`` itself
    optimizers: list[SegmentOptimizer] = field(default_factory=list)
    link: object | None = None  # the direct transport's connections and mailbox
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        """Wake a direct loop that waits for peers, and close its connections."""
        if self.link is not None:
            self.link.close("the run was torn down")

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
            shard = SegmentOptimizer(theta[seg], spec.optimizer)
            shard.load_state_arrays(slice_state(optimizer_state, seg))
            st.optimizers.append(shard)
        st.optimizer = st.optimizers[st.local if spec.replicated else 0]
        result = theta[st.segments[st.local]].copy()
    else:
        result = np.zeros(0, np.float32)
    with _LOCK:
        _STATES[(run_id, rank)] = st
    return result


def shard_state(run_id: str, rank: int, *after) -> dict:
    """The optimizer state of this owner's segment, for a checkpoint (``after``: futures
    this must wait for)."""
    return state(run_id, rank).optimizer.state_arrays()


def current_theta(run_id: str, rank: int, *after) -> np.ndarray:
    """The worker's full ``θ`` (``r = K``, or the direct transport after its all-gather)."""
    return state(run_id, rank).replica.theta


def teardown(run_id: str, dask_worker=None) -> int:
    """Drop every replica and record of ``run_id`` in this process."""
    with _LOCK:
        gone = [k for k in _STATES if k[0] == run_id]
        states = [_STATES.pop(k) for k in gone]
        _RECORDS.pop(run_id, None)
    for gone in states:
        gone.close()
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
#
# The math of one CDC step on a worker, shared by both transports: the ``dask`` graph of
# ``engine/cdc.py`` runs each piece as a task, the ``direct`` loop of ``engine/direct.py``
# calls them in turn. A shuffle message is named by a *tag*: ``("pkt", S, j)`` the coded packet
# ``P(S, j)``, ``("unc", S, k)`` the value ``v(S, k)`` sent whole, ``("sum", j, k)`` the sum
# sender ``j`` pre-adds for owner ``k``, ``("hyb", S, j)`` the hybrid packet over the pre-summed
# values ``v(S, ·)`` of group ``S`` (its plan: :func:`plan_of`) (local indices throughout).


def plan_of(p: Placement, group: tuple) -> HybridPlan:
    """The hybrid plan a ``hyb`` tag belongs to: groups of ``m + 1`` workers."""
    return hybrid_plan(p.g, p.redundancy, len(group) - 1)


def shuffle_sends(
    p: Placement, shuffle: str, local: int, plan: HybridPlan | None = None
) -> list[tuple[tuple, list[int]]]:
    """``(tag, receivers)`` of every message the worker of local index ``local`` sends
    (``plan``: the hybrid shuffle's, for ``shuffle="hybrid"``)."""
    out = []
    if shuffle == "hybrid":
        return [(("hyb", group, local), ks) for group, ks in plan.sends(local)]
    if shuffle == "summed":
        for k in range(p.g):
            if k != local and local in summed_plan(p.g, p.redundancy, k):
                out.append((("sum", local, k), [k]))
        return out
    for group in p.groups_of(local):
        if shuffle == "coded":
            out.append((("pkt", group, local), [k for k in group if k != local]))
        else:
            out += [(("unc", group, k), [k]) for k in group if uncoded_sender(group, k) == local]
    return out


def shuffle_receives(
    p: Placement, shuffle: str, local: int, plan: HybridPlan | None = None
) -> list[tuple[tuple, int]]:
    """``(tag, sender)`` of every message the owner of segment ``local`` needs."""
    if shuffle == "hybrid":
        return [
            (("hyb", group, j), j) for group in plan.values_for(local) for j in group if j != local
        ]
    if shuffle == "summed":
        return [(("sum", j, local), j) for j in summed_plan(p.g, p.redundancy, local)]
    if shuffle == "coded":
        return [(("pkt", group, j), j) for group in p.groups_of(local) for j in group if j != local]
    return [(("unc", group, local), uncoded_sender(group, local)) for group in p.groups_of(local)]


def message_values(p: Placement, tag: tuple) -> float:
    """How long message ``tag`` is, in units of ``d`` (the closed form: pieces and segments
    of lengths that do not divide evenly differ by one value)."""
    if tag[0] in ("pkt", "hyb"):  # a packet of pieces of 1/m of a segment (m = r for CDC)
        return 1 / (p.g * (len(tag[1]) - 1))
    return 1 / p.g


def step_messages(
    p: Placement, shuffle: str, plan: HybridPlan | None = None
) -> dict[str, list[tuple[int, list[int], float]]]:
    """Every message of one step, ``(sender, receivers, length in units of d)`` in global
    ranks: the ``shuffle`` (with the cross-cluster sum) and the all-gather (``params``);
    ``plan``: the hybrid shuffle's."""
    out: dict[str, list] = {"shuffle": [], "params": []}
    if p.redundancy == p.n_workers:  # every worker updates all of θ: nothing moves
        return out
    for c in range(p.n_clusters):
        for j in range(p.g):
            for tag, receivers in shuffle_sends(p, shuffle, j, plan):
                out["shuffle"].append(
                    (
                        p.global_id(c, j),
                        [p.global_id(c, k) for k in receivers],
                        message_values(p, tag),
                    )
                )
            others = [p.global_id(c, i) for i in range(p.g) if i != j]
            out["params"].append((p.global_id(c, j), others, 1 / p.g))
    if p.n_clusters > 1:
        for k in range(p.n_workers):
            owners = [p.global_id(o, p.local(k)) for o in range(p.n_clusters)]
            out["shuffle"].append((k, [o for o in owners if o != k], 1 / p.g))
    return out


def message_needs(p: Placement, tag: tuple) -> set:
    """The sub-batches whose gradients the sender of message ``tag`` must have computed."""
    kind = tag[0]
    if kind == "pkt":
        group, j = tag[1], tag[2]
        return {label_without(group, k) for k in group if k != j}
    if kind == "unc":
        return {label_without(tag[1], tag[2])}
    if kind == "hyb":
        group, j = tag[1], tag[2]
        plan = plan_of(p, group)
        return {t for k in plan.receivers(group, j) for t in plan.charges[(group, k)]}
    return set(summed_plan(p.g, p.redundancy, tag[2])[tag[1]])


def map_grads(st: WorkerState, step: int, on_grad=None) -> tuple[dict, float, dict]:
    """``(grads, loss, digests)``: the summed gradient ``g_T`` of every sub-batch ``T`` this
    worker holds at the replica's ``θ``, the loss of the sub-batches it is first holder of,
    and a digest of each ``g_T`` (the driver compares them across holders).
    ``on_grad(grads)`` is called after each sub-batch (to send what is ready)."""
    _, idx = st.replica.step_samples(step)
    slices = st.placement.sub_batch_slices(st.spec.batch_size)[st.cluster]
    grads, loss = {}, 0.0
    for t, label in enumerate(st.placement.sub_batches):
        if st.local in label:
            grads[label], sub_loss = st.replica.grad_sum(idx[slices[t]])
            if label[0] == st.local:  # each sub-batch's loss counted once, by its first holder
                loss += sub_loss
            if on_grad is not None:
                on_grad(grads)
    # the r holders of a sub-batch must compute the same bits, or XOR decoding is silently
    # wrong: the driver compares these digests across holders (no bytes on the wire)
    return grads, loss, {label: _digest(g) for label, g in grads.items()}


def record_map(run_id: str, st: WorkerState, step: int, t0: float, loss, digests, stop=None):
    record(
        run_id,
        step=step,
        rank=st.rank,
        phase="map",
        start=t0,
        stop=time.time() if stop is None else stop,
        loss=loss,
        cluster=st.cluster,
        digests=digests,
    )


def payload(st: WorkerState, tag: tuple, grads: dict) -> np.ndarray:
    """The message ``tag`` (see :func:`shuffle_sends`) from this worker's own gradients."""
    kind, p = tag[0], st.placement
    if kind == "pkt":
        return encode_packet(tag[1], st.local, grads, st.segments)
    if kind == "unc":
        group, k = tag[1], tag[2]
        return grads[label_without(group, k)][st.segments[k]].copy()
    if kind == "hyb":
        group, plan = tag[1], plan_of(p, tag[1])
        values = {
            k: charged_value(plan, group, k, grads, st.segments)
            for k in plan.receivers(group, st.local)
        }
        return encode_values(group, st.local, values)
    k = tag[2]
    plan = summed_plan(p.g, p.redundancy, k)[st.local]
    return sum_in_order([grads[t][st.segments[k]] for t in plan])


def reduce_segment(st: WorkerState, grads: dict, received: dict) -> np.ndarray:
    """``G[k]`` of this owner from its own gradients and the messages it received (by tag).

    Coded and uncoded: ``Σ_T g_T[k]`` over every sub-batch in lexicographic order, decoding
    what it lacks. Summed: its own ``g_T[k]`` (lexicographic), then the received sums in
    ascending order of sender. Hybrid: its own ``g_T[k]`` (lexicographic), then each decoded
    ``v(S, k)`` in family order (decoded with the other members' ``v(S, k')``, which it sums
    itself as their senders do). ``serial`` sums in the same orders.
    """
    k, seg, p = st.local, st.segments[st.local], st.placement
    if st.spec.shuffle == "hybrid":
        plan = st.spec.hybrid
        values = []
        for group in plan.values_for(k):
            known = {
                i: charged_value(plan, group, i, grads, st.segments)
                for i in plan.active(group)
                if i != k
            }
            packets = {j: received[("hyb", group, j)] for j in group if j != k}
            values.append(decode_values(group, k, packets, known, seg.stop - seg.start))
        return sum_in_order([grads[t][seg] for t in p.sub_batches if k in t] + values)
    if st.spec.shuffle == "summed":
        own = [grads[t][seg] for t in p.sub_batches if k in t]
        return sum_in_order(own + [received[tag] for tag, _ in shuffle_receives(p, "summed", k)])
    decoded = {}
    for group in p.groups_of(k):
        if st.spec.shuffle == "coded":
            packets = {j: received[("pkt", group, j)] for j in group if j != k}
            value = decode_value(group, k, packets, grads, st.segments)
        else:
            value = received[("unc", group, k)]
        decoded[label_without(group, k)] = value
    return sum_in_order([grads[t][seg] if k in t else decoded[t] for t in p.sub_batches])


def update_segment(st: WorkerState, reduced: list[np.ndarray]) -> np.ndarray:
    """Sum the clusters' reduced segments (cluster order) and apply this owner's optimizer
    shard with ``G[k] / B``; return the updated segment."""
    return st.optimizer.step(sum_in_order(list(reduced)), st.spec.batch_size)


def update_replicated(st: WorkerState, grads: dict) -> None:
    """``r = K``: the one sub-batch is the whole batch, so ``G = g_T``; step every segment's
    shard in segment order (as ``serial`` does) and keep the new ``θ`` in the replica."""
    (grad,) = grads.values()
    theta = [
        shard.step(sum_in_order([grad[seg]]), st.spec.batch_size)
        for shard, seg in zip(st.optimizers, st.segments, strict=True)
    ]
    st.replica.set_theta(np.concatenate(theta))


def _digest(values: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(values).view(np.uint8), digest_size=8).hexdigest()


def sent_bytes(p: Placement, tag: tuple, message: np.ndarray) -> dict:
    """What a message moves: once (multicast), once per receiver (unicast)."""
    if tag[0] == "pkt":
        receivers = len(tag[1]) - 1
    elif tag[0] == "hyb":
        receivers = len(plan_of(p, tag[1]).receivers(tag[1], tag[2]))
    else:
        receivers = 1
    return {"multicast": message.nbytes, "unicast": message.nbytes * receivers}


# Dask tasks of the ``dask`` transport (``engine/cdc.py`` builds the graph).


def cdc_map(run_id: str, rank: int, step: int, *segments: np.ndarray) -> dict:
    """Map: the summed gradient ``g_T`` of every sub-batch ``T`` this worker holds, at the
    ``θ`` assembled from the owners' segments (none at ``r = K``: the replica keeps ``θ``)."""
    t0 = time.time()
    st = state(run_id, rank)
    if segments:
        st.replica.set_theta(np.concatenate(segments))
    grads, loss, digests = map_grads(st, step)
    record_map(run_id, st, step, t0, loss, digests)
    return grads


def cdc_send(run_id: str, rank: int, step: int, tag: tuple, grads: dict) -> np.ndarray:
    """The shuffle message ``tag`` (a packet, a whole value or a pre-summed part)."""
    t0 = time.time()
    st = state(run_id, rank)
    message = payload(st, tag, grads)
    record(
        run_id,
        step=step,
        rank=rank,
        phase="encode",
        start=t0,
        stop=time.time(),
        **sent_bytes(st.placement, tag, message),
    )
    return message


def cdc_reduce(run_id: str, rank: int, step: int, grads: dict, received: dict) -> np.ndarray:
    """Decode what this owner lacks and reduce its segment (:func:`reduce_segment`);
    ``received`` maps each tag to its message."""
    t0 = time.time()
    st = state(run_id, rank)
    reduced = reduce_segment(st, grads, received)
    extra, p = {}, st.placement
    if p.n_clusters > 1:  # the reduced segment goes to the other clusters' owners
        extra = {"multicast": reduced.nbytes, "unicast": reduced.nbytes * (p.n_clusters - 1)}
    record(run_id, step=step, rank=rank, phase="decode", start=t0, stop=time.time(), **extra)
    return reduced


def cdc_update(run_id: str, rank: int, step: int, *reduced: np.ndarray) -> np.ndarray:
    """:func:`update_segment`, returning the updated segment (the next maps all-gather it)."""
    t0 = time.time()
    st = state(run_id, rank)
    segment = update_segment(st, list(reduced))
    record(
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


def cdc_replicated(run_id: str, rank: int, step: int, *after) -> int:
    """``r = K``: map and update all of ``θ`` on this worker; nothing moves. ``after``: the
    previous step's future on the same worker (an ordering, no data)."""
    t0 = time.time()
    st = state(run_id, rank)
    grads, loss, digests = map_grads(st, step)
    record_map(run_id, st, step, t0, loss, digests)
    t1 = time.time()
    update_replicated(st, grads)
    record(run_id, step=step, rank=rank, phase="update", start=t1, stop=time.time(), params=0)
    return step


# --------------------------------------------------------------------------- parameter server


def ps_grad(run_id: str, rank: int, step: int, part: int, theta: np.ndarray) -> dict:
    """Gradient (summed) of part ``part`` of ``K`` of step ``step``'s samples at ``θ``."""
    t0 = time.time()
    st = state(run_id, rank)
    with st.lock:  # asgd may hand one worker two updates; a multi-threaded worker runs both
        st.replica.set_theta(theta)
        _, idx = st.replica.step_samples(step)
        n = st.spec.n_workers
        grad, loss = st.replica.grad_sum(idx[array_split_slices(len(idx), n)[part]])
    return {"grad": grad, "loss": loss, "start": t0, "stop": time.time(), "rank": rank}
