"""CDC-SSGD on Dask futures (``transport=dask``): map, shuffle (coded, uncoded, summed or hybrid),
reduce, update, all-gather; every transfer is a Dask dependency, which the dashboard shows.

Every task is pinned to its worker (``workers=[...]``, ``allow_other_workers=False``). A
worker's map output stays where it was computed; only shuffle messages
(``pkt``/``unc``/``sum``/``hyb``), reduced segments across clusters (``red``) and updated segments
(``seg``) move, worker to worker, as Dask dependencies. The next step's maps depend on the
owners' updated segments, so the all-gather is peer to peer and the driver only submits work
and collects metrics. At ``r = K`` nothing moves: each worker's step waits on its previous one.
"""

from __future__ import annotations

import numpy as np

from dcoded.checkpoint import concat_shards
from dcoded.engine import tasks
from dcoded.engine.direct import train_direct
from dcoded.engine.driving import (
    Clock,
    Context,
    after_step,
    bookkeeping_due,
    pinned,
    steps_per_epoch,
)
from dcoded.engine.spec import RunSpec
from dcoded.engine.tasks import task_key


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
        return [submit(tasks.cdc_replicated, k, "rep", segments[k]) for k in range(K)]

    maps = {}
    for j in range(K):
        c = p.cluster_of(j)
        owners = [segments[p.global_id(c, i)] for i in range(p.g)]
        maps[j] = submit(tasks.cdc_map, j, "map", *owners)

    received: dict[int, dict] = {k: {} for k in range(K)}
    kind = {"coded": "pkt", "uncoded": "unc", "summed": "sum", "hybrid": "hyb"}[spec.shuffle]
    plan = spec.hybrid
    for c in range(p.n_clusters):
        for j in range(p.g):
            sender = p.global_id(c, j)
            for tag, receivers in tasks.shuffle_sends(p, spec.shuffle, j, plan):
                message = submit(tasks.cdc_send, sender, kind, tag, maps[sender], key_parts=tag[1:])
                for k in receivers:
                    received[p.global_id(c, k)][tag] = message

    if p.n_clusters == 1:
        return [submit(tasks.cdc_reduce_update, k, "seg", maps[k], received[k]) for k in range(K)]
    reduced = [submit(tasks.cdc_reduce, k, "red", maps[k], received[k]) for k in range(K)]
    updated = []
    for k in range(K):
        replicas = [reduced[p.global_id(c, p.local(k))] for c in range(p.n_clusters)]
        updated.append(submit(tasks.cdc_update, k, "seg", *replicas))
    return updated


def train_cdc(ctx: Context) -> np.ndarray:
    """Run CDC steps from ``ctx.start_step`` to ``spec.steps``; return the final ``θ``
    (gathered from the owners of cluster 0)."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    if spec.transport != "dask":  # direct or multicast: the same loop, another link
        return train_direct(ctx)
    run, p = spec.run_id, spec.placement
    theta0 = ctx.resume.theta if ctx.resume else None
    opt0 = ctx.resume.optimizer if ctx.resume else None
    segments = [
        client.submit(
            tasks.setup,
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
    ctx.wait_all(segments, "worker setup")
    ctx.pull("setup")  # setup's records are not training

    def theta() -> np.ndarray:
        if spec.replicated:
            current = client.submit(tasks.current_theta, run, 0, segments[0], **pinned(workers[0]))
            return ctx.gather(current, "gathering θ")
        return np.concatenate(ctx.gather(segments[: p.g], "gathering θ"))

    def snapshot() -> tuple[np.ndarray, dict]:
        states = [
            client.submit(tasks.shard_state, run, k, segments[k], **pinned(workers[k]))
            for k in range(p.g)
        ]
        return theta(), concat_shards(ctx.gather(states, "gathering optimizer shards"))

    per_epoch = steps_per_epoch(len(ctx.reference.data.y_train), spec.batch_size)
    clock = Clock()
    ahead, done_at = None, clock.now()
    for step in range(ctx.start_step, spec.steps):
        # a step submitted ahead has been running since the previous one ended; the clock
        # stood still during bookkeeping, so what the driver did since counts here
        t0 = done_at
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
