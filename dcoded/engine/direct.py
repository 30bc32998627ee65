"""CDC-SSGD with a direct data plane (``transport=direct``).

Dask places the work, launches it, watches it and notices a lost worker, as for
``transport=dask``; but a step's shuffle messages, reduced segments and updated segments go
straight from worker process to worker process, over one Dask comm per pair of workers opened
once per run (Dask's own comm layer: its addressing, its serialisation and, with
``cluster.tls.*``, its TLS). A worker pushes a message as ``{"op": "dcoded_push", ...}`` on its
connection; the receiving worker's handler drops it in the run's mailbox, where the step loop
waits for exactly the messages it expects (with ``train.step_timeout_s``).

Each worker runs the steps in one task per *chunk*: by default every step up to the next
evaluation, checkpoint or record collection (``transport.steps_per_task=0``), or ``N`` steps a task.
The math of a step is that of ``transport=dask`` (:mod:`dcoded.engine.cdc`), in the same order,
so both give ``serial``'s ``param_sha256``.

A worker that dies breaks its connections: its peers' sends fail (:class:`PeerLost`), the
driver finds the worker gone, and tearing the run down wakes every loop still waiting
(:meth:`Link.close`), so no thread is left stuck in a surviving worker.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
from distributed import get_worker

from dcoded.checkpoint import concat_shards
from dcoded.coding.messages import message_needs, sent_bytes, shuffle_receives, shuffle_sends
from dcoded.engine import registry
from dcoded.engine.cdc import (
    cdc_replicated,
    map_grads,
    payload,
    record_map,
    reduce_segment,
    update_segment,
)
from dcoded.engine.driver import (
    Clock,
    Context,
    after_step,
    bookkeeping_due,
    pinned,
)
from dcoded.engine.link import Link
from dcoded.engine.multicast import MulticastLink
from dcoded.engine.registry import WorkerState, record, task_key
from dcoded.engine.spec import RunSpec
from dcoded.errors import Aborted, PeerLost, PeerTimeout, StepTimeout, WorkerLost

# --------------------------------------------------------------------------- on the workers


def setup(run_id: str, rank: int, spec: RunSpec, peers: list[str], theta, optimizer_state):
    """:func:`dcoded.engine.registry.setup`, the push handler, and this rank's :class:`Link`."""
    out = registry.setup(run_id, rank, spec, theta, optimizer_state)
    if spec.transport == "multicast":
        link = MulticastLink(
            run_id,
            rank,
            peers,
            get_worker(),
            receiver_sets(spec, rank),
            spec.pace_mbit,
            spec.test_drop,
            spec.seed,
            spec.repair_after_s,
        )
    else:
        link = Link(run_id, rank, peers, get_worker())
    registry.find_state(run_id, rank).link = link
    return out


def receiver_sets(spec: RunSpec, rank: int) -> list[tuple[int, ...]]:
    """Every set of two or more receivers, ``rank`` among them, that a message of the run
    goes to (global ranks): coded packets, the all-gather, the cross-cluster sum."""
    p = spec.placement
    c, me = p.cluster_of(rank), p.local(rank)
    sets = set()
    if not spec.replicated:
        for j in range(p.g):
            for _, receivers in shuffle_sends(p, spec.shuffle, j, spec.hybrid):
                sets.add(tuple(p.global_id(c, k) for k in receivers))
            sets.add(tuple(p.global_id(c, i) for i in range(p.g) if i != j))
        for o in range(p.n_clusters):
            sets.add(tuple(p.global_id(x, me) for x in range(p.n_clusters) if x != o))
    return sorted(s for s in sets if len(s) > 1 and rank in s)


def _key(step: int, *parts) -> str:
    return "/".join(map(str, (step, *parts)))


def run_steps(run_id: str, rank: int, start: int, stop: int, *after) -> int:
    """Steps ``start..stop-1`` of this rank; ``after``: its previous task (an ordering)."""
    st = registry.state(run_id, rank)
    link: Link = st.link
    for step in range(start, stop):
        t0, repairs = time.time(), link.repair_counts()
        if st.spec.replicated:
            cdc_replicated(run_id, rank, step)  # r = K: nothing moves, as on Dask
        else:
            _step(run_id, st, link, step)
        link.flush(st.spec.step_timeout_s)
        record(
            run_id,
            step=step,
            rank=rank,
            phase="step",
            start=t0,
            stop=time.time(),
            sent=link.drain_sent(),
            repairs={k: v - repairs[k] for k, v in link.repair_counts().items()},
        )
    return stop


def _step(run_id: str, st: WorkerState, link: Link, step: int) -> None:
    """Map, shuffle, reduce (and sum across clusters), update, all-gather: one CDC step."""
    spec, p, rank = st.spec, st.placement, st.rank
    c, me, timeout = st.cluster, st.local, spec.step_timeout_s

    def peer(local: int) -> int:
        return p.global_id(c, local)

    def phase(name: str, start: float, **extra) -> float:
        now = time.time()
        record(run_id, step=step, rank=rank, phase=name, start=start, stop=now, **extra)
        return now

    def exchange(name: str, part: str, messages, expected) -> dict:
        """Send, then wait for what this rank expects; record when it began to send and
        when it had everything (the driver times the exchange across ranks)."""
        start = time.time()
        if messages:
            link.send(messages)
        got = link.take(expected, timeout)
        phase(name, start, exchange=part)
        return got

    # each message leaves as soon as the sub-batches it needs are computed (with
    # transport.overlap), so the network works while the map goes on
    unsent = {
        tag: (receivers, message_needs(p, tag))
        for tag, receivers in shuffle_sends(p, spec.shuffle, me, spec.hybrid)
    }
    counts, encoding = defaultdict(int), [0.0]

    def send_ready(grads: dict) -> None:
        ready = [tag for tag, (_, needs) in unsent.items() if needs <= grads.keys()]
        t = time.time()
        out = []
        for tag in ready:
            receivers, _ = unsent.pop(tag)
            message = payload(st, tag, grads)
            for field, n in sent_bytes(p, tag, message).items():
                counts[field] += n
            out += [(peer(k), _key(step, *tag), tag[0], message) for k in receivers]
        encoding[0] += time.time() - t
        if out:
            link.send(out)

    t = time.time()
    grads, loss, digests = map_grads(st, step, on_grad=send_ready if spec.overlap else None)
    if not spec.overlap:
        send_ready(grads)
    now = time.time()
    record_map(run_id, st, step, t, loss, digests, stop=now - encoding[0])
    record(
        run_id, step=step, rank=rank, phase="encode", start=now - encoding[0], stop=now, **counts
    )
    wanted = shuffle_receives(p, spec.shuffle, me, spec.hybrid)
    got = exchange("shuffle", "inner", [], {_key(step, *tag): peer(j) for tag, j in wanted})

    t = time.time()
    received = {tag: got[_key(step, *tag)] for tag, _ in wanted}
    reduced = reduce_segment(st, grads, received)
    parts = [reduced]
    if p.n_clusters > 1:  # the owners of this segment index in the other clusters
        others = {p.global_id(o, me): o for o in range(p.n_clusters) if o != c}
        phase("decode", t, multicast=reduced.nbytes, unicast=reduced.nbytes * len(others))
        got = exchange(
            "shuffle",
            "red",
            [(k, _key(step, "red", c), "red", reduced) for k in others],
            {_key(step, "red", o): k for k, o in others.items()},
        )
        parts = [reduced if o == c else got[_key(step, "red", o)] for o in range(p.n_clusters)]
    else:
        phase("decode", t)

    t = time.time()
    segment = update_segment(st, parts)
    phase("update", t, params=segment.nbytes * (p.g - 1))

    got = exchange(
        "params",
        "seg",
        [(peer(i), _key(step, "seg", me), "seg", segment) for i in range(p.g) if i != me],
        {_key(step, "seg", i): peer(i) for i in range(p.g) if i != me},
    )
    segments = [segment if i == me else got[_key(step, "seg", i)] for i in range(p.g)]
    t = time.time()
    st.replica.set_theta(np.concatenate(segments))
    phase("update", t)  # installing θ for the next map


# --------------------------------------------------------------------------- the driver


def chunk_end(ctx: Context, start: int) -> int:
    """The step after the last one of the task that starts at ``start``: the next step with
    bookkeeping (evaluation, checkpoint, record collection, the last), or ``steps_per_task``."""
    spec = ctx.spec
    most = spec.steps_per_task or spec.steps
    step = start
    while step + 1 < spec.steps and step + 1 - start < most and not bookkeeping_due(ctx, step):
        step += 1
    return step + 1


def train_direct(ctx: Context) -> np.ndarray:
    """Run CDC steps from ``ctx.start_step`` to ``spec.steps`` over direct connections;
    return the final ``θ`` (from rank 0)."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    run, p = spec.run_id, spec.placement
    theta0 = ctx.resume.theta if ctx.resume else None
    opt0 = ctx.resume.optimizer if ctx.resume else None
    last = [
        client.submit(
            setup,
            run,
            k,
            spec,
            list(workers),
            theta0,
            opt0,
            key=task_key(run, "setup", ctx.start_step - 1, k),
            **pinned(workers[k]),
        )
        for k in range(spec.n_workers)
    ]
    ctx.wait_all(last, "worker setup")
    ctx.collect("setup")  # setup's records are not training

    def theta() -> np.ndarray:
        current = client.submit(registry.current_theta, run, 0, last[0], **pinned(workers[0]))
        return ctx.gather(current, "gathering θ")

    def snapshot() -> tuple[np.ndarray, dict]:
        states = [
            client.submit(registry.shard_state, run, k, last[k], **pinned(workers[k]))
            for k in range(p.g)
        ]
        return theta(), concat_shards(ctx.gather(states, "gathering optimizer shards"))

    def submit(start: int, stop: int, after: list) -> list:
        return [
            client.submit(
                run_steps,
                run,
                k,
                start,
                stop,
                after[k],
                key=task_key(run, "steps", start, k),
                **pinned(workers[k]),
            )
            for k in range(spec.n_workers)
        ]

    per_epoch = ctx.steps_per_epoch
    clock = Clock()
    ahead, done_at, step = None, 0.0, ctx.start_step  # from the clock's start
    while step < spec.steps:
        stop = chunk_end(ctx, step)
        # the clock stood still during bookkeeping: what the driver did since counts here
        t0 = done_at
        current = ahead or submit(step, stop, last)
        ahead = None
        if spec.pipeline and stop < spec.steps and not bookkeeping_due(ctx, stop - 1):
            # the next task waits on this one on each worker: no driver round trip between
            ahead = submit(stop, chunk_end(ctx, stop), current)
        what = f"step {step}" if stop - step == 1 else f"steps {step}..{stop - 1}"
        wait_direct(ctx, current, what, spec.step_timeout_s * (stop - step))
        done_at = clock.now()
        last = current
        if stop - step == 1:
            ctx.log.driver_step(step, epoch=step // per_epoch, wall_s=done_at, step_s=done_at - t0)
        else:
            with clock.paused():
                ctx.collect(f"after step {stop - 1}")
            ctx.log.chunk_rows(range(step, stop), t0, done_at, per_epoch)
        for s in range(step, stop):
            after_step(ctx, s, clock, theta, snapshot)
        step = stop
    return theta()


def wait_direct(ctx: Context, futures: list, what: str, timeout: float) -> None:
    """:meth:`Context.wait_all`, with the workers' own failures told as the driver's: a lost
    peer is :class:`WorkerLost` (naming the dead worker when the scheduler knows it), a peer
    that never sent is :class:`StepTimeout`."""
    try:
        ctx.wait_all(futures, what, timeout=timeout)
    except (PeerLost, Aborted) as e:
        ctx.check_cluster(what)
        raise WorkerLost(f"{what}: {e}") from None
    except PeerTimeout as e:
        ctx.check_cluster(what)
        raise StepTimeout(f"{what}: {e}") from None
