"""The serial reference: exactly the CDC math in one process, without Dask or the codec.

Same placement, same per-sub-batch summed gradients, same fixed summation order (sub-batches
in lexicographic order, or the summed or hybrid shuffle's order; then clusters in order, chunk
by chunk as the owners' reduce-scatter sums them), the same
optimizer sharded by segment. Each sub-batch gradient is computed once here (``r`` times on
the cluster), and ``G[k]`` is summed directly from the true gradients, so agreement with
``cdc`` bit for bit checks the placement, the shuffle, the codec and the plumbing at once.
"""

from __future__ import annotations

import numpy as np

from dcoded.checkpoint import concat_shards, slice_state
from dcoded.coding import HybridPlan, Placement, cross_sum
from dcoded.coding.cross import cross_chunks
from dcoded.coding.shuffles import scheme
from dcoded.engine.driver import Clock, Context, after_step
from dcoded.optim import SegmentOptimizer


def reduce_in_order(
    p: Placement, shuffle: str, grads: dict, seg: slice, k: int, plan: HybridPlan | None = None
) -> np.ndarray:
    """``G[k]`` of one cluster from the true sub-batch gradients, in the order the workers sum.

    Coded and uncoded: every ``g_T[k]`` in lexicographic order of ``T``. Summed: the owner's
    own ``g_T[k]`` (``T ∋ k``), then each sender's pre-added part in ascending order of sender,
    each part summed in lexicographic order of ``T``. Hybrid (``plan``): the owner's own
    ``g_T[k]``, then each non-empty ``v(S, k)`` in family order, each the sum of its charged
    ``g_T[k]`` in lexicographic order of ``T`` (no codec: the true gradients).
    """
    return scheme(shuffle).reference(p, k, grads, seg, plan)


def train_serial(ctx: Context) -> np.ndarray:
    """Run the CDC math in this process from ``ctx.start_step`` to ``spec.steps``; return the
    final ``θ``."""
    spec, replica = ctx.spec, ctx.reference
    p = spec.placement
    theta = ctx.resume.theta.copy() if ctx.resume else replica.theta
    segments = p.segments(len(theta))
    shards = [SegmentOptimizer(theta[s], spec.optimizer, cross_chunks(p, s)) for s in segments]
    for shard, s in zip(shards, segments, strict=True):
        shard.load_state_arrays(slice_state(ctx.resume.optimizer if ctx.resume else None, s))

    def snapshot() -> tuple[np.ndarray, dict]:
        return theta, concat_shards([shard.state_arrays() for shard in shards])

    per_epoch = ctx.steps_per_epoch
    clock = Clock()
    for step in range(ctx.start_step, spec.steps):
        t0 = clock.now()
        replica.set_theta(theta)
        _, idx = replica.step_samples(step)
        reduced, loss = [], 0.0
        for cluster_slices in p.sub_batch_slices(spec.batch_size):
            grads = {}
            for label, samples in zip(p.sub_batches, cluster_slices, strict=True):
                grads[label], sub_loss = replica.grad_sum(idx[samples])
                loss += sub_loss
            reduced.append(
                [
                    reduce_in_order(p, spec.shuffle, grads, s, k, spec.hybrid)
                    for k, s in enumerate(segments)
                ]
            )
        t1 = clock.now()
        theta = np.concatenate(
            [
                shard.step(cross_sum([per_cluster[i] for per_cluster in reduced]), spec.batch_size)
                for i, shard in enumerate(shards)
            ]
        )
        t2 = clock.now()
        ctx.log.driver_step(
            step,
            epoch=step // per_epoch,
            wall_s=t2,
            step_s=t2 - t0,
            train_loss=loss / spec.batch_size,
            map_s=t1 - t0,
            update_s=t2 - t1,
        )
        after_step(ctx, step, clock, lambda theta=theta: theta, snapshot)
    return theta
