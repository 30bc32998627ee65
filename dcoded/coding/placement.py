"""Who computes what: sub-batches, multicast groups, segments, pieces and clusters.

Everything here is a pure function of ``(K, r, g)`` and lengths, shared by the Dask engine,
the serial reference and the tests, so the three cannot disagree about the layout.

Notation (as in ``docs/algorithm.md``): ``K`` workers ``0..K-1``, redundancy ``r``, group size
``g`` (``g`` divides ``K``, ``r <= g``), parameter vector of length ``d``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

Subset = tuple[int, ...]


def check_layout(
    n_workers: int,
    redundancy: int,
    group_size: int | None = None,
    names: Mapping[str, str] | None = None,
) -> int:
    """Validate ``(K, r, g)`` and return the effective group size ``g``.

    ``names`` spells the settings in the message as the caller knows them (the config's
    ``coding.redundancy``, say); by default they are ``n_workers``, ``redundancy``,
    ``group_size``.

    Raises
    ------
    ValueError
        With the offending value and the allowed range in the message.

    >>> check_layout(4, 2)
    4
    >>> check_layout(6, 2, 3)
    3
    >>> check_layout(4, 5, names={"redundancy": "coding.redundancy"})
    Traceback (most recent call last):
    ...
    ValueError: coding.redundancy=5 is not allowed with n_workers=4: it must be an integer in 1..4
    """
    n = _names(names)
    if not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(
            f"{n['n_workers']}={n_workers!r} is not allowed: it must be an integer >= 1"
        )
    g = n_workers if group_size is None else group_size
    if not isinstance(g, int) or not 1 <= g <= n_workers or n_workers % g:
        divisors = [x for x in range(1, n_workers + 1) if n_workers % x == 0]
        raise ValueError(
            f"{n['group_size']}={g!r} is not allowed with {n['n_workers']}={n_workers}: "
            f"it must divide {n['n_workers']}, one of {divisors}"
        )
    if not isinstance(redundancy, int) or not 1 <= redundancy <= g:
        # name the setting g came from: group_size when it was given, else n_workers
        limit = f"{n['n_workers']}={n_workers}" if group_size is None else f"{n['group_size']}={g}"
        raise ValueError(
            f"{n['redundancy']}={redundancy!r} is not allowed with {limit}: "
            f"it must be an integer in 1..{g}"
        )
    return g


def _names(names: Mapping[str, str] | None) -> dict[str, str]:
    """Each setting's name in messages: the caller's spelling, or the bare name."""
    keys = ("n_workers", "redundancy", "group_size", "batch_size", "hybrid_m")
    return {k: (names or {}).get(k, k) for k in keys}


def subsets(n: int, r: int) -> list[Subset]:
    """The ``C(n, r)`` sub-batch labels ``T``: ``r``-subsets of ``range(n)``, lexicographic."""
    return list(itertools.combinations(range(n), r))


def groups(n: int, r: int) -> list[Subset]:
    """The multicast groups ``S``: ``(r+1)``-subsets of ``range(n)``, lexicographic.

    Empty when ``r == n`` (one sub-batch computed by everybody, nothing to shuffle).
    """
    return list(itertools.combinations(range(n), r + 1))


def array_split_slices(length: int, n: int) -> list[slice]:
    """Slices of ``numpy.array_split(range(length), n)``: the first ``length % n`` parts are one
    longer than the rest."""
    if n < 1:
        raise ValueError(f"cannot split into n={n} parts: n must be >= 1")
    q, m = divmod(length, n)
    bounds = [0]
    for i in range(n):
        bounds.append(bounds[-1] + q + (1 if i < m else 0))
    return [slice(bounds[i], bounds[i + 1]) for i in range(n)]


def segment_slices(d: int, n_owners: int) -> list[slice]:
    """Segment ``k`` of a length-``d`` vector for ``n_owners`` owners (array_split)."""
    return array_split_slices(d, n_owners)


def piece_slices(length: int, r: int) -> list[slice]:
    """The ``r`` pieces of a value of ``length`` elements; piece ``i`` is sent by the ``i``-th
    member of the sub-batch label in sorted order."""
    return array_split_slices(length, r)


def clusters(n_workers: int, group_size: int) -> list[Subset]:
    """Hierarchical CDC: ``K/g`` consecutive clusters of ``g`` workers each."""
    check_layout(n_workers, 1, group_size)
    return [
        tuple(range(c * group_size, (c + 1) * group_size)) for c in range(n_workers // group_size)
    ]


def uncoded_sender(group: Subset, receiver: int) -> int:
    """Uncoded shuffle: ``v(S, k)`` is sent whole by the member of ``S`` that follows ``k`` in
    ``S``, cyclically, so every member of every group sends exactly one value there and every
    worker sends ``C(K-1, r)`` values in all (the lowest holder would send 6/4/2/0 at K=4, r=2).

    >>> [uncoded_sender((0, 1, 3), k) for k in (0, 1, 3)]
    [1, 3, 0]
    """
    i = group.index(receiver)
    return group[(i + 1) % len(group)]


def summed_plan(n: int, r: int, receiver: int) -> dict[int, list[Subset]]:
    """Summed shuffle: sender -> the sub-batches ``T ∌ receiver`` it pre-sums for ``receiver``.

    The senders are the ``n - r`` workers that follow ``receiver`` cyclically; every
    ``r``-subset of the other ``n - 1`` workers meets them, and ``T`` is charged to its member
    closest after ``receiver``. So each worker sends one sum of ``d/n`` values to each of the
    ``n - r`` workers before it: ``(n - r)/n · d`` sent and received per worker, the
    receive-side optimum. Senders ascending, each list of ``T`` in lexicographic order (the
    order in which they are summed, on the workers and in ``serial``).

    >>> summed_plan(4, 2, 0)
    {1: [(1, 2), (1, 3)], 2: [(2, 3)]}
    >>> summed_plan(4, 4, 0)
    {}
    """
    plan: dict[int, list[Subset]] = {}
    for label in subsets(n, r):
        if receiver in label:
            continue
        sender = min(label, key=lambda j: (j - receiver) % n)
        plan.setdefault(sender, []).append(label)
    return dict(sorted(plan.items()))


@dataclass(frozen=True)
class Placement:
    """The layout of one CDC step for ``K`` workers, redundancy ``r`` and group size ``g``.

    Workers are numbered globally ``0..K-1``; inside a cluster they have a *local* index
    ``0..g-1``, and sub-batch labels, groups and segment numbers are local to the cluster.

    >>> p = Placement(4, 2)
    >>> p.n_sub_batches, p.sub_batches[:2], len(p.groups)
    (6, [(0, 1), (0, 2)], 4)
    >>> p.held_by(0)
    [(0, 1), (0, 2), (0, 3)]
    """

    n_workers: int
    redundancy: int
    group_size: int | None = None

    def __post_init__(self):
        g = check_layout(self.n_workers, self.redundancy, self.group_size)
        object.__setattr__(self, "group_size", g)

    @property
    def g(self) -> int:
        return self.group_size  # type: ignore[return-value]

    @property
    def n_clusters(self) -> int:
        return self.n_workers // self.g

    @cached_property
    def sub_batches(self) -> list[Subset]:
        """Labels ``T`` of the ``C(g, r)`` sub-batches of one cluster (local indices)."""
        return subsets(self.g, self.redundancy)

    @property
    def n_sub_batches(self) -> int:
        return math.comb(self.g, self.redundancy)

    @cached_property
    def groups(self) -> list[Subset]:
        """The ``C(g, r+1)`` multicast groups of one cluster (local indices)."""
        return groups(self.g, self.redundancy)

    def cluster_of(self, worker: int) -> int:
        return worker // self.g

    def local(self, worker: int) -> int:
        """Local index of a global worker inside its cluster (= the segment it owns)."""
        return worker % self.g

    def global_id(self, cluster: int, local: int) -> int:
        return cluster * self.g + local

    def held_by(self, local: int) -> list[Subset]:
        """Sub-batches computed by the worker of local index ``local``: ``C(g-1, r-1)`` of them."""
        return [t for t in self.sub_batches if local in t]

    def groups_of(self, local: int) -> list[Subset]:
        """Multicast groups the worker of local index ``local`` belongs to: ``C(g-1, r)``."""
        return [s for s in self.groups if local in s]

    def cluster_batch_slices(self, batch_size: int) -> list[slice]:
        """Cluster ``c`` gets the ``c``-th of ``K/g`` consecutive parts of the batch."""
        return array_split_slices(batch_size, self.n_clusters)

    def sub_batch_slices(self, batch_size: int) -> list[list[slice]]:
        """``[c][t]``: the samples of sub-batch ``sub_batches[t]`` of cluster ``c``, as slices of
        the whole batch (in order, sizes as equal as possible)."""
        out = []
        for part in self.cluster_batch_slices(batch_size):
            n = part.stop - part.start
            out.append(
                [
                    slice(part.start + s.start, part.start + s.stop)
                    for s in array_split_slices(n, self.n_sub_batches)
                ]
            )
        return out

    def check_batch(self, batch_size: int, names: Mapping[str, str] | None = None) -> None:
        """Every sub-batch must hold at least one sample (``names``: as in
        :func:`check_layout`)."""
        need = self.n_clusters * self.n_sub_batches
        if batch_size < need:
            n = _names(names)
            raise ValueError(
                f"{n['batch_size']}={batch_size} is too small for "
                f"{n['redundancy']}={self.redundancy}, {n['group_size']}={self.g}, "
                f"{n['n_workers']}={self.n_workers}: it must be >= {need} "
                f"({self.n_clusters} cluster(s) x C({self.g},{self.redundancy})="
                f"{self.n_sub_batches} sub-batches)"
            )

    def segments(self, d: int) -> list[slice]:
        """The ``g`` segments of a length-``d`` parameter vector (segment ``i`` is owned by local
        index ``i`` of every cluster)."""
        return segment_slices(d, self.g)

    def pieces(self, d: int, group: Subset, receiver: int) -> dict[int, slice]:
        """Sender -> slice of ``v(S, k)`` it carries, for receiver ``k`` in group ``S``.

        ``v(S,k) = g_{S∖{k}}[k]`` has the length of segment ``k``; it is cut into ``r`` pieces,
        piece ``i`` carried by the ``i``-th member of ``S∖{k}`` (sorted).
        """
        holders = [m for m in group if m != receiver]
        seg = self.segments(d)[receiver]
        return dict(zip(holders, piece_slices(seg.stop - seg.start, self.redundancy), strict=True))


def label_without(group: Sequence[int], member: int) -> Subset:
    """``S∖{k}``: the sub-batch whose segment ``k`` is exchanged in group ``S``."""
    return tuple(m for m in group if m != member)
