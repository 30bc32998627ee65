"""CDC-SSGD on Dask futures (``transport=dask``): map, shuffle (coded, uncoded, summed or hybrid),
reduce, update, all-gather; every transfer is a Dask dependency, which the dashboard shows.

Every task is pinned to its worker (``workers=[...]``, ``allow_other_workers=False``). A
worker's map output stays where it was computed; only shuffle messages
(``pkt``/``unc``/``sum``/``hyb``), the chunks of reduced segments summed across clusters
(``red``: a reduce-scatter and all-gather, :mod:`dcoded.coding.cross`) and updated segments
(``seg``) move, worker to worker, as Dask dependencies. The next step's maps depend on the
owners' updated segments, so the all-gather is peer to peer and the driver only submits work
and collects metrics. At ``r = K`` nothing moves: each worker's step waits on its previous one.

The file reads in the order of a step: a worker's math (:func:`map_grads`, :func:`payload`,
:func:`reduce_segment`, :func:`update_segment`; ``transport=direct`` runs the same functions in
its loop, :mod:`dcoded.engine.direct`), the tasks that wrap each piece, then the graph the driver
submits. Which messages a step sends, to whom, and what each needs are
:mod:`dcoded.coding.messages`; the replicas and records, :mod:`dcoded.engine.registry`.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from dcoded.checkpoint import concat_shards
from dcoded.coding import chunk_slices, cross_values, sum_in_order
from dcoded.coding.messages import sent_bytes, shuffle_sends
from dcoded.coding.shuffles import of_tag, scheme
from dcoded.engine import registry
from dcoded.engine.driver import (
    Clock,
    Context,
    after_step,
    bookkeeping_due,
    pinned,
)
from dcoded.engine.registry import WorkerState, record, state, task_key
from dcoded.engine.spec import RunSpec
from dcoded.engine.straggle import Injector
from dcoded.errors import Abandoned

# --------------------------------------------------------------------------- a worker's math


def map_grads(
    st: WorkerState, step: int, on_grad=None, stop=None, injector=None
) -> tuple[dict, float, dict]:
    """``(grads, loss, digests)``: the summed gradient ``g_T`` of every sub-batch ``T`` this
    worker holds at the replica's ``θ``, the loss of the sub-batches it is first holder of,
    and a digest of each ``g_T`` (the driver compares them across holders).
    ``on_grad(grads)`` is called after each sub-batch (to send what is ready). ``injector``
    (:class:`~dcoded.engine.straggle.Injector`): the straggler's delays. Once ``stop()`` says
    so (``coding.stragglers``: the others finished without this worker) the map is abandoned,
    between sub-batches or inside one, and ``grads`` holds only the sub-batches computed."""
    _, idx = st.replica.step_samples(step)
    slices = st.placement.sub_batch_slices(st.spec.batch_size)[st.cluster]
    grads, loss = {}, 0.0
    if injector is not None:
        injector.before(stop)
    for t, label in enumerate(st.placement.sub_batches):
        if st.local not in label:
            continue
        if stop is not None and stop():
            break
        t0 = time.perf_counter()
        try:
            if stop is None:
                grads[label], sub_loss = st.replica.grad_sum(idx[slices[t]])
            else:
                grads[label], sub_loss = st.replica.grad_sum(idx[slices[t]], stop)
        except Abandoned:
            break
        if injector is not None:
            injector.after(time.perf_counter() - t0, stop)
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
    return of_tag(tag).payload(st.placement, st.local, tag, grads, st.segments)


def reduce_segment(st: WorkerState, grads: dict, received: dict, plain=None) -> np.ndarray:
    """``G[k]`` of this owner from its own gradients and the messages it received (by tag).

    Coded and uncoded: ``Σ_T g_T[k]`` over every sub-batch in lexicographic order, decoding
    what it lacks. Summed: its own ``g_T[k]`` (lexicographic), then the received sums in
    ascending order of sender. Hybrid: its own ``g_T[k]`` (lexicographic), then each decoded
    ``v(S, k)`` in family order (decoded with the other members' ``v(S, k')``, which it sums
    itself as their senders do). ``serial`` sums in the same orders.

    ``plain`` (``coding.stragglers``): values that replace what a late worker did not send or
    this owner's abandoned map did not compute, by request
    (:func:`dcoded.coding.stragglers.backups`); each takes exactly the place, and so the
    bits, of what it replaces.
    """
    k, seg, p = st.local, st.segments[st.local], st.placement
    plain = plain or {}

    def term(t):  # g_T[k], computed here or sent plain
        return grads[t][seg] if t in grads else plain[("g", t, seg.start, seg.stop)]

    return scheme(st.spec.shuffle).reduce(
        p, k, st.segments, grads, received, plain, term, st.spec.hybrid
    )


def update_segment(st: WorkerState, chunks: list[np.ndarray]) -> np.ndarray:
    """Apply this owner's optimizer shard with ``G[k] / B``, ``G[k]`` the concatenated chunks
    of the segment's sum across clusters (one chunk, the reduced segment itself, when there is
    one cluster); return the updated segment."""
    return st.optimizer.step(np.concatenate(chunks), st.spec.batch_size)


def own_chunk(st: WorkerState, reduced: np.ndarray, cluster: int) -> np.ndarray:
    """The chunk of this owner's reduced segment that the owner in ``cluster`` sums."""
    return reduced[chunk_slices(len(reduced), st.placement.n_clusters)[cluster]]


def cross_bytes(st: WorkerState, reduced: np.ndarray) -> dict:
    """Bytes this owner moves in the cross-cluster sum (none with one cluster)."""
    values = cross_values(len(reduced), st.placement.n_clusters, st.cluster)
    return {k: v * reduced.itemsize for k, v in values.items()}


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


# --------------------------------------------------------------------------- the tasks


def cdc_map(run_id: str, rank: int, step: int, *segments: np.ndarray) -> dict:
    """Map: the summed gradient ``g_T`` of every sub-batch ``T`` this worker holds, at the
    ``θ`` assembled from the owners' segments (none at ``r = K``: the replica keeps ``θ``)."""
    t0 = time.time()
    st = state(run_id, rank)
    if segments:
        st.replica.set_theta(np.concatenate(segments))
    grads, loss, digests = _map_injected(st, step)
    record_map(run_id, st, step, t0, loss, digests)
    return grads


def _map_injected(st: WorkerState, step: int):
    """:func:`map_grads` with this step's straggler (the ``straggle`` group) injected."""
    injector = Injector(st.spec, st.rank, step, st.throttle is not None)
    out = map_grads(st, step, injector=injector)
    if injector.active:
        record(st.spec.run_id, step=step, rank=st.rank, phase="straggle", **injector.fields())
    return out


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
    extra = cross_bytes(st, reduced) if st.placement.n_clusters > 1 else {}
    record(run_id, step=step, rank=rank, phase="decode", start=t0, stop=time.time(), **extra)
    return reduced


def cdc_chunk(run_id: str, rank: int, step: int, reduced: np.ndarray, cluster: int):
    """The chunk of ``reduced`` the owner in ``cluster`` sums: a task of its own, so that only
    the chunk moves (reduce-scatter)."""
    return own_chunk(state(run_id, rank), reduced, cluster)


def cdc_cross(run_id: str, rank: int, step: int, reduced: np.ndarray, *others: np.ndarray):
    """This owner's chunk summed over the clusters in order: its own chunk of ``reduced`` in
    its cluster's place among ``others`` (the other owners' chunks, cluster order)."""
    st = state(run_id, rank)
    parts = list(others)
    parts.insert(st.cluster, own_chunk(st, reduced, st.cluster))
    return sum_in_order(parts)


def cdc_update(run_id: str, rank: int, step: int, *chunks: np.ndarray) -> np.ndarray:
    """:func:`update_segment`, returning the updated segment (the next maps all-gather it)."""
    t0 = time.time()
    st = state(run_id, rank)
    segment = st.segment = update_segment(st, list(chunks))
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
    grads, loss, digests = _map_injected(st, step)
    record_map(run_id, st, step, t0, loss, digests)
    t1 = time.time()
    update_replicated(st, grads)
    record(run_id, step=step, rank=rank, phase="update", start=t1, stop=time.time(), params=0)
    return step


# --------------------------------------------------------------------------- the graph

#: Steps between two new roots of the graph (see :func:`_rooted`).
ROOT_EVERY = 10


def submit_step(client, spec: RunSpec, workers: list[str], step: int, segments: list) -> list:
    """Submit one CDC step; return the futures of the updated segments, one per worker (at
    ``r = K``: of each worker's step, which keeps ``θ`` in its replica)."""
    p, run = spec.placement, spec.run_id
    K = spec.n_workers

    def submit(fn, rank, kind, *args, key_parts=()):
        return client.submit(
            fn,
            run,
            rank,
            step,
            *args,
            key=task_key(run, kind, step, *key_parts, rank),
            **pinned(workers[rank]),
        )

    if spec.replicated:  # nothing moves: each step waits for the worker's previous one
        return [
            submit(cdc_replicated, k, "rep", *[s for s in segments[k : k + 1] if s is not None])
            for k in range(K)
        ]

    maps = {}
    for j in range(K):
        c = p.cluster_of(j)
        owners = [segments[p.global_id(c, i)] for i in range(p.g)]
        maps[j] = submit(cdc_map, j, "map", *owners)

    received: dict[int, dict] = {k: {} for k in range(K)}
    kind = scheme(spec.shuffle).kind
    plan = spec.hybrid
    for c in range(p.n_clusters):
        for j in range(p.g):
            sender = p.global_id(c, j)
            for tag, receivers in shuffle_sends(p, spec.shuffle, j, plan):
                message = submit(cdc_send, sender, kind, tag, maps[sender], key_parts=tag[1:])
                for k in receivers:
                    received[p.global_id(c, k)][tag] = message

    if p.n_clusters == 1:
        return [submit(cdc_reduce_update, k, "seg", maps[k], received[k]) for k in range(K)]
    reduced = [submit(cdc_reduce, k, "red", maps[k], received[k]) for k in range(K)]
    return _submit_cross(submit, p, reduced)


def _submit_cross(submit, p, reduced: list) -> list:
    """The cross-cluster sum of the ``reduced`` segments and the updates after it: each
    owner's chunks to the other owners of its segment index (reduce-scatter), each owner's
    chunk summed over the clusters, every summed chunk to all of them (all-gather); the
    futures of the updated segments."""
    K, m = p.n_workers, p.n_clusters
    chunks = {
        (k, c): submit(cdc_chunk, k, "red", reduced[k], c, key_parts=("to", c))
        for k in range(K)
        for c in range(m)
        if c != p.cluster_of(k)
    }
    summed = []
    for k in range(K):
        c, i = p.cluster_of(k), p.local(k)
        others = [chunks[p.global_id(o, i), c] for o in range(m) if o != c]
        summed.append(submit(cdc_cross, k, "red", reduced[k], *others, key_parts=("sum",)))
    return [
        submit(cdc_update, k, "seg", *[summed[p.global_id(o, p.local(k))] for o in range(m)])
        for k in range(K)
    ]


def _setup(ctx: Context) -> list:
    """Build every worker's replica (from the checkpoint resumed, if any); the futures of their
    segments, which the first step's maps read."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    run = spec.run_id
    theta0 = ctx.resume.theta if ctx.resume else None
    opt0 = ctx.resume.optimizer if ctx.resume else None
    segments = [
        client.submit(
            registry.setup,
            run,
            k,
            spec,
            theta0,
            opt0,
            key=task_key(run, "seg", ctx.start_step - 1, k),
            **pinned(workers[k]),
        )
        for k in range(spec.n_workers)
    ]
    ctx.wait_all(segments, "worker setup", setup=True)
    ctx.collect("setup")  # setup's records are not training
    return segments


def _rooted(ctx: Context, step: int) -> list:
    """The segments the maps of ``step`` read, from tasks that depend on nothing (the
    driver has waited for the last update): each step's tasks depend on the step before,
    and the scheduler keeps a finished task for as long as one that depends on it
    exists, so without a new root now and then it would keep every task of the run."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    if spec.replicated:  # each step's only dependency is an ordering, already kept
        return [None] * spec.n_workers
    return [
        client.submit(
            registry.own_segment,
            spec.run_id,
            k,
            key=task_key(spec.run_id, "seg", step - 1, "root", k),
            **pinned(workers[k]),
        )
        for k in range(spec.n_workers)
    ]


def train_cdc(ctx: Context) -> np.ndarray:
    """Run CDC steps from ``ctx.start_step`` to ``spec.steps`` on Dask futures; return the
    final ``θ`` (gathered from the owners of cluster 0)."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    run, p = spec.run_id, spec.placement
    segments = _setup(ctx)

    def theta() -> np.ndarray:
        if spec.replicated:
            current = client.submit(
                registry.current_theta, run, 0, segments[0], **pinned(workers[0])
            )
            return ctx.gather(current, "gathering θ")
        return np.concatenate(ctx.gather(segments[: p.g], "gathering θ"))

    def snapshot() -> tuple[np.ndarray, dict]:
        states = [
            client.submit(registry.shard_state, run, k, segments[k], **pinned(workers[k]))
            for k in range(p.g)
        ]
        return theta(), concat_shards(ctx.gather(states, "gathering optimizer shards"))

    per_epoch = ctx.steps_per_epoch
    clock = Clock()
    ahead, done_at = None, 0.0  # the first step starts with the clock
    for step in range(ctx.start_step, spec.steps):
        # a step submitted ahead has been running since the previous one ended; the clock
        # stood still during bookkeeping, so what the driver did since counts here
        t0 = done_at
        if ahead is None and step > ctx.start_step and step % ROOT_EVERY == 0:
            segments = _rooted(ctx, step)
        current = ahead or submit_step(client, spec, workers, step, segments)
        ahead = None
        if spec.pipeline and step + 1 < spec.steps and not bookkeeping_due(ctx, step):
            # the scheduler gets step+1's graph while step runs: its maps wait for the
            # segments by dependency, so nothing changes but the driver's round trip
            ahead = submit_step(client, spec, workers, step + 1, current)
        ctx.wait_all(current, f"step {step}")
        done_at = clock.now()
        segments = current
        ctx.log.driver_step(step, epoch=step // per_epoch, wall_s=done_at, step_s=done_at - t0)
        after_step(ctx, step, clock, theta, snapshot)
    return theta()
