"""The cross-cluster sum of hierarchical CDC (``g < K``): a reduce-scatter and an all-gather.

Each of the ``m = K/g`` clusters reduces every segment inside itself; the ``m`` owners of one
segment index (one per cluster) then add their reduced segments. Each cuts its reduced
segment into ``m`` chunks (:func:`chunk_slices`); chunk ``c`` goes to the owner in cluster
``c`` (reduce-scatter), which adds the ``m`` copies in cluster order and sends the sum to the
other ``m - 1`` owners (all-gather). A worker sends ``(m-1)/K`` of ``d`` in each half,
``2(m-1)/K`` in all, instead of ``(m-1)/g`` for sending its whole segment to every other owner:
the cost falls with ``g`` instead of growing with ``K``.

Every chunk is summed with :func:`~dcoded.coding.codec.sum_in_order` over the clusters in
order, by the engine and the serial reference alike (:func:`cross_sum`), so they agree bit for
bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dcoded.coding.codec import sum_in_order
from dcoded.coding.placement import Placement, array_split_slices

__all__ = ["chunk_slices", "cross_chunks", "cross_messages", "cross_sum", "cross_values"]


def chunk_slices(length: int, n_clusters: int) -> list[slice]:
    """The ``n_clusters`` chunks of a reduced segment of ``length`` values; the owner in
    cluster ``c`` sums chunk ``c`` (the first ``length % n_clusters`` are one longer)."""
    return array_split_slices(length, n_clusters)


def cross_chunks(p: Placement, segment: slice) -> list[slice] | None:
    """The chunks of ``segment``'s optimizer: one per cluster (each stepped as its sum comes,
    by every owner of the segment's index), or ``None`` with one cluster.

    >>> cross_chunks(Placement(4, 1, 2), slice(10, 15))
    [slice(0, 3, None), slice(3, 5, None)]
    """
    if p.n_clusters == 1:
        return None
    return chunk_slices(segment.stop - segment.start, p.n_clusters)


def cross_sum(reduced: Sequence[np.ndarray]) -> np.ndarray:
    """The sum of one segment's reduced copies (one per cluster, in cluster order), chunk by
    chunk as the owners compute it: what every owner holds after the all-gather.

    >>> cross_sum([np.float32([1, 2, 3]), np.float32([10, 20, 30])])
    array([11., 22., 33.], dtype=float32)
    """
    if len(reduced) == 1:
        return sum_in_order(reduced)
    return np.concatenate(
        [
            sum_in_order([part[chunk] for part in reduced])
            for chunk in chunk_slices(len(reduced[0]), len(reduced))
        ]
    )


def cross_values(n_values: int, n_clusters: int, cluster: int) -> dict[str, int]:
    """Values one owner in ``cluster`` moves for a segment of ``n_values``: sent once
    (``multicast``: its chunks for the others, then its summed chunk once) and once per
    receiver (``unicast``: the summed chunk to each of the other ``m - 1``)."""
    if n_clusters == 1:
        return {"multicast": 0, "unicast": 0}
    own = len(range(n_values)[chunk_slices(n_values, n_clusters)[cluster]])
    scattered = n_values - own
    return {"multicast": scattered + own, "unicast": scattered + own * (n_clusters - 1)}


def cross_messages(p: Placement) -> tuple[list, list]:
    """``(reduce_scatter, all_gather)``: every message of the cross-cluster sum, ``(sender,
    receivers, length in units of d)`` in global ranks (the closed form: chunks of lengths
    that do not divide evenly differ by one value)."""
    m, K = p.n_clusters, p.n_workers
    scatter, gather = [], []
    if m == 1:
        return scatter, gather
    for k in range(K):
        owners = [p.global_id(o, p.local(k)) for o in range(m)]
        scatter += [(k, [o], 1 / K) for o in owners if o != k]
        gather.append((k, [o for o in owners if o != k], 1 / K))
    return scatter, gather
