"""Closed-form communication loads, per worker per step, in units of ``d`` float32 values.

Two counts are given for every scheme:

* ``multicast``: every packet counted once, however many receivers it has (what a broadcast
  medium would carry);
* ``unicast``: every packet counted once per receiver (what a unicast fabric such as TCP or
  Dask transfers carries).

With group size ``g`` (hierarchical CDC) the shuffle runs inside clusters of ``g`` workers on
segments of ``d/g`` values, so ``K`` is replaced by ``g``; the sum of the ``K/g`` replicas of
each segment adds :func:`cross_cluster_sum` (a reduce-scatter and all-gather among them).
"""

from __future__ import annotations

from dcoded.coding.hybrid import best_m, profile
from dcoded.coding.placement import check_layout
from dcoded.coding.shuffles import SCHEMES, Load
from dcoded.coding.shuffles.coded import coded_shuffle
from dcoded.coding.shuffles.hybrid import hybrid_shuffle
from dcoded.coding.shuffles.summed import summed_shuffle
from dcoded.coding.shuffles.uncoded import uncoded_shuffle

#: What this module gives (the schemes' own closed forms among them, each from its module).
__all__ = [
    "Load",
    "allgather",
    "coded_shuffle",
    "cross_cluster_sum",
    "exchange_table",
    "hybrid_shuffle",
    "load_table",
    "parameter_server",
    "ring_allreduce",
    "shuffle",
    "step_bounds",
    "summed_shuffle",
    "uncoded_shuffle",
]


def allgather(n_workers: int) -> Load:
    """All-gather of the updated segments: ``1/K`` multicast (own segment once), ``(K-1)/K``
    unicast (own segment to each of the ``K-1`` others)."""
    K = n_workers
    check_layout(K, 1)
    return Load(1 / K, (K - 1) / K)


def parameter_server(n_workers: int) -> tuple[Load, Load]:
    """``(up, down)`` per worker: the gradient up, ``θ`` down, ``d`` values each.

    The server itself moves ``K`` times this.
    """
    check_layout(n_workers, 1)
    return Load(1.0, 1.0), Load(1.0, 1.0)


def ring_allreduce(n_workers: int) -> Load:
    """Ring all-reduce (torch DDP): ``2(K-1)/K`` sent per worker (reduce-scatter + all-gather)."""
    K = n_workers
    check_layout(K, 1)
    return Load(2 * (K - 1) / K, 2 * (K - 1) / K)


def cross_cluster_sum(n_workers: int, group_size: int) -> Load:
    """Hierarchical CDC: the ``m = K/g`` owners of a segment index add their reduced segments
    (``d/g`` values each) by a reduce-scatter and an all-gather among themselves
    (:mod:`dcoded.coding.cross`): each sends ``m - 1`` chunks of ``d/K``, one per other owner,
    then its summed chunk to all ``m - 1`` of them.

    ``m/K = 1/g`` multicast (the all-gather's chunk sent once), ``2(m - 1)/K`` unicast.

    >>> cross_cluster_sum(16, 4)
    Load(multicast=0.25, unicast=0.375)
    """
    check_layout(n_workers, 1, group_size)
    m = n_workers // group_size
    if m == 1:
        return Load(0.0, 0.0)
    return Load(m / n_workers, 2 * (m - 1) / n_workers)


def shuffle(
    n_workers: int,
    redundancy: int,
    group_size: int | None = None,
    scheme: str = "coded",
    hybrid_m: int | None = None,
) -> Load:
    """The gradient exchange ``scheme`` (``coded``, ``uncoded``, ``summed`` or ``hybrid`` at
    ``hybrid_m``) with group size ``g``: the shuffle inside a cluster of ``g`` plus the
    cross-cluster sum.

    >>> shuffle(4, 2, scheme="summed")
    Load(multicast=0.5, unicast=0.5)
    """
    g = check_layout(n_workers, redundancy, group_size)
    if scheme not in SCHEMES:
        raise ValueError(f"shuffle scheme {scheme!r} is not known: choose one of {tuple(SCHEMES)}")
    inner = SCHEMES[scheme].load(g, redundancy, hybrid_m)
    extra = cross_cluster_sum(n_workers, g)
    return Load(inner.multicast + extra.multicast, inner.unicast + extra.unicast)


def load_table(n_workers: int, group_size: int | None = None) -> list[dict[str, float]]:
    """One row per redundancy ``r = 1..g``: every scheme, both counts (units of ``d``)."""
    g = check_layout(n_workers, 1, group_size)
    rows = []
    for r in range(1, g + 1):
        coded = shuffle(n_workers, r, g, "coded")
        uncoded = shuffle(n_workers, r, g, "uncoded")
        summed = shuffle(n_workers, r, g, "summed")
        hybrid = shuffle(n_workers, r, g, "hybrid")
        ag = allgather(g)
        ps_up, _ = parameter_server(n_workers)
        rows.append(
            {
                "r": r,
                "compute": r / n_workers,
                "coded_mc": coded.multicast,
                "coded_uc": coded.unicast,
                "uncoded_mc": uncoded.multicast,
                "uncoded_uc": uncoded.unicast,
                "reduce_scatter": summed.unicast,
                "hybrid_m": best_m(g, r),
                "hybrid_mc": hybrid.multicast,
                "hybrid_uc": hybrid.unicast,
                "allgather_mc": ag.multicast,
                "allgather_uc": ag.unicast,
                "ring_allreduce": ring_allreduce(n_workers).unicast,
                "param_server_up": ps_up.unicast,
            }
        )
    return rows


#: The gradient exchanges compared by :func:`exchange_table`, in order of preference on a tie.
COMPARED = ("summed", "coded", "hybrid")


def exchange_table(n_workers: int, group_size: int | None = None) -> list[dict]:
    """Per redundancy ``r = 1..g``, the coded, summed and hybrid shuffles inside a cluster of
    ``g``, in units of ``d/g`` (one segment) per worker: each one's egress (what a worker
    sends, a multicast packet once; mean and busiest), ingress (what a worker receives) and bus
    total (every worker's egress: what one shared medium carries), and the best scheme on a
    switch (least ``max(busiest egress, busiest ingress)``) and on a bus (least total).

    The cross-cluster sum of ``g < K`` is the same for every scheme and is left out.
    """
    g = check_layout(n_workers, 1, group_size)
    rows = []
    for r in range(1, g + 1):
        m = best_m(g, r)
        row = {"r": r, "hybrid_m": m}
        for name in COMPARED:
            p = profile(g, r, name, m if name == "hybrid" else None)
            row[name] = p
        switch = {n: max(row[n].egress_max, row[n].ingress_max) for n in COMPARED}
        bus = {n: row[n].bus for n in COMPARED}
        row["best_switch"] = "=".join(n for n in COMPARED if switch[n] == min(switch.values()))
        row["best_bus"] = "=".join(n for n in COMPARED if bus[n] == min(bus.values()))
        rows.append(row)
    return rows


def step_bounds(n_workers: int, redundancy: int) -> list[dict]:
    """What one step needs on each topology, gradient exchange plus the distribution of ``θ``,
    in units of ``d`` (``g = K``): ``switch`` is the busiest host's ``max(sent, received)``,
    ``bus`` the total on one shared medium (a multicast frame once). Divided by a link's rate
    (``d`` float32 values per second) each is the step's communication time bound there.

    >>> [(row["scheme"], row["switch"], row["bus"]) for row in step_bounds(4, 2)][:2]
    [('DDP ring all-reduce', 1.5, 6.0), ('parameter server', 4.0, 8.0)]
    """
    K, r = n_workers, redundancy
    check_layout(K, r)
    ag = allgather(K)
    if r == K:  # every worker updates all of θ: nothing is gathered
        ag = Load(0.0, 0.0)
    ring, coded, summed = ring_allreduce(K), coded_shuffle(K, r), summed_shuffle(K, r)
    rows = [
        ("DDP ring all-reduce", ring.unicast, ring.unicast, K * ring.unicast),
        ("parameter server", 1.0, float(K), 2.0 * K),  # the server's one link
        ("cdc coded, unicast", coded.unicast + ag.unicast, None, None),
        ("cdc coded, multicast", coded.multicast + ag.multicast, None, None),
        ("summed, unicast", summed.unicast + ag.unicast, None, None),
        ("summed, multicast all-gather", summed.multicast + ag.multicast, None, None),
    ]
    received = {  # per worker; equal for every worker in these balanced schemes
        "cdc": coded.unicast + ag.unicast,
        "summed": summed.unicast + ag.unicast,
    }
    out = []
    for scheme, sent, switch, bus in rows:
        if switch is None:
            got = received["cdc" if scheme.startswith("cdc") else "summed"]
            switch, bus = max(sent, got), K * sent
        out.append({"scheme": scheme, "r": r, "sent": sent, "switch": switch, "bus": bus})
    return out
