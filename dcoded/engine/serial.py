"""The serial reference: exactly the CDC math in one process, without Dask or the codec.

Same placement, same per-sub-batch summed gradients, same fixed summation order (sub-batches
in lexicographic order, then clusters in order), the same optimizer sharded by segment. Each
sub-batch gradient is computed once here (``r`` times on the cluster), and ``G[k]`` is summed
directly from the true gradients, so agreement with ``cdc`` bit for bit checks the placement,
the shuffle, the codec and the plumbing at once.
"""

from __future__ import annotations

import numpy as np

from dcoded.coding import sum_in_order
from dcoded.engine.driving import Clock, after_step, steps_per_epoch
from dcoded.engine.record import TrainingLog
from dcoded.engine.replica import Replica
from dcoded.engine.spec import RunSpec
from dcoded.optim import SegmentOptimizer


def train_serial(
    spec: RunSpec,
    client,
    workers,
    log: TrainingLog,
    reference: Replica,
    progress=None,
    theta0: np.ndarray | None = None,
) -> np.ndarray:
    """Run ``spec.steps`` steps of the CDC math in this process; return the final ``θ``."""
    p = spec.placement
    replica = reference
    theta = replica.theta if theta0 is None else theta0.copy()
    segments = p.segments(len(theta))
    shards = [SegmentOptimizer(theta[s], spec.optimizer) for s in segments]
    per_epoch = steps_per_epoch(len(replica.data.y_train), spec.batch_size)
    clock = Clock()
    for step in range(spec.steps):
        t0 = clock.now()
        replica.set_theta(theta)
        _, idx = replica.step_samples(step)
        reduced, loss = [], 0.0
        for cluster_slices in p.sub_batch_slices(spec.batch_size):
            grads = {}
            for label, samples in zip(p.sub_batches, cluster_slices, strict=True):
                grads[label], sub_loss = replica.grad_sum(idx[samples])
                loss += sub_loss
            reduced.append([sum_in_order([grads[t][s] for t in p.sub_batches]) for s in segments])
        t1 = clock.now()
        theta = np.concatenate(
            [
                shard.step(
                    sum_in_order([per_cluster[i] for per_cluster in reduced]), spec.batch_size
                )
                for i, shard in enumerate(shards)
            ]
        )
        t2 = clock.now()
        log.driver_step(
            step,
            epoch=step // per_epoch,
            wall_s=t2,
            step_s=t2 - t0,
            train_loss=loss / spec.batch_size,
            map_s=t1 - t0,
            update_s=t2 - t1,
        )
        after_step(
            step, spec, log, clock, lambda theta=theta: theta, replica.evaluate, None, progress
        )
    return theta
