"""CDC-SSGD on Dask futures: map, coded (or uncoded) shuffle, reduce, update, all-gather.

Every task is pinned to its worker (``workers=[...]``, ``allow_other_workers=False``). A
worker's map output stays where it was computed; only packets (``pkt``/``unc``), reduced
segments across clusters (``red``) and updated segments (``seg``) move, worker to worker, as
Dask dependencies. The next step's maps depend on the owners' updated segments, so the
all-gather is peer to peer and the driver only submits work and collects metrics.
"""

from __future__ import annotations

import numpy as np

from dcoded.checkpoint import concat_shards
from dcoded.coding import uncoded_sender
from dcoded.engine import tasks
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
    """Submit one CDC step; return the futures of the updated segments, one per worker."""
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

    maps = {}
    for j in range(K):
        c = p.cluster_of(j)
        owners = [segments[p.global_id(c, i)] for i in range(p.g)]
        maps[j] = submit(tasks.cdc_map, j, "map", *owners)

    received: dict[int, dict] = {k: {} for k in range(K)}
    for c in range(p.n_clusters):
        for group in p.groups:
            if spec.shuffle == "coded":
                for j in group:
                    sender = p.global_id(c, j)
                    packet = submit(
                        tasks.cdc_encode, sender, "pkt", group, maps[sender], key_parts=(group,)
                    )
                    for k in group:
                        if k != j:
                            received[p.global_id(c, k)][(group, j)] = packet
            else:
                for k in group:
                    sender = p.global_id(c, uncoded_sender(group, k))
                    value = submit(
                        tasks.cdc_uncoded,
                        sender,
                        "unc",
                        group,
                        k,
                        maps[sender],
                        key_parts=(group, k),
                    )
                    received[p.global_id(c, k)][group] = value

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
        return np.concatenate(ctx.gather(segments[: p.g], "gathering θ"))

    def snapshot() -> tuple[np.ndarray, dict]:
        states = [
            client.submit(tasks.shard_state, run, k, **pinned(workers[k])) for k in range(p.g)
        ]
        return theta(), concat_shards(ctx.gather(states, "gathering optimizer shards"))

    per_epoch = steps_per_epoch(len(ctx.reference.data.y_train), spec.batch_size)
    clock = Clock()
    ahead, done_at = None, 0.0
    for step in range(ctx.start_step, spec.steps):
        # a step submitted ahead has been running since the previous one ended
        t0 = clock.now() if ahead is None else done_at
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
