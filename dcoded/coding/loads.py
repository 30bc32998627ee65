"""Closed-form communication loads, per worker per step, in units of ``d`` float32 values.

Two counts are given for every scheme:

* ``multicast``: every packet counted once, however many receivers it has (what a broadcast
  medium would carry);
* ``unicast``: every packet counted once per receiver (what a unicast fabric such as TCP or
  Dask transfers carries).

With group size ``g`` (hierarchical CDC) the shuffle runs inside clusters of ``g`` workers on
segments of ``d/g`` values, so ``K`` is replaced by ``g``; the sum of the ``K/g`` replicas of
each segment adds :func:`cross_cluster_sum`.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from dcoded.coding.hybrid import best_m, check_m, profile
from dcoded.coding.placement import check_layout


@dataclass(frozen=True)
class Load:
    """A load in units of ``d`` values per worker per step."""

    multicast: float
    unicast: float

    def bytes(self, d: int, itemsize: int = 4) -> Load:
        return Load(self.multicast * d * itemsize, self.unicast * d * itemsize)


def coded_shuffle(n_workers: int, redundancy: int) -> Load:
    """CDC coded shuffle: ``C(K-1, r) / (K r)`` multicast, ``C(K-1, r) / K`` unicast.

    A worker is in ``C(K-1, r)`` groups and sends one packet of ``(d/K)/r`` values in each,
    heard by ``r`` receivers. Summed over workers this is ``(1/r)(1 - r/K)`` of all
    intermediate values (``C(K, r)`` sub-batch gradients of ``d`` values): CDC's optimum.
    """
    K, r = n_workers, redundancy
    check_layout(K, r)
    return Load(comb(K - 1, r) / (K * r), comb(K - 1, r) / K)


def uncoded_shuffle(n_workers: int, redundancy: int) -> Load:
    """Same placement, every ``v(S, k)`` sent whole by one holder: ``C(K-1, r) / K`` both ways."""
    K, r = n_workers, redundancy
    check_layout(K, r)
    return Load(comb(K - 1, r) / K, comb(K - 1, r) / K)


def summed_shuffle(n_workers: int, redundancy: int) -> Load:
    """The summed shuffle (a reduce-scatter that sums before sending, with the CDC placement):
    ``(K-r)/K`` sent and received per worker.

    The sub-batches owner ``k`` lacks are the ``r``-subsets of the other ``K-1`` workers; any
    ``K-r`` of those workers hit every one of them, so ``K-r`` pre-summed vectors of ``d/K``
    values suffice (``(K-1)/K`` at ``r = 1``, the plain reduce-scatter; see
    :func:`~dcoded.coding.placement.summed_plan`). Each has one receiver, so the multicast and
    unicast counts are equal. CDC does not exploit summation, which is why this is below the
    coded shuffle's unicast count for most ``(K, r)``, and the least any scheme can give a
    receiver on a switch.
    """
    K, r = n_workers, redundancy
    check_layout(K, r)
    return Load((K - r) / K, (K - r) / K)


def hybrid_shuffle(n_workers: int, redundancy: int, m: int | None = None) -> Load:
    """The hybrid shuffle at group size ``m + 1`` (default: :func:`~dcoded.coding.hybrid.best_m`),
    exactly as its family and active pairs send (:mod:`dcoded.coding.hybrid`).

    A worker multicasts one packet of ``(d/K)/m`` values per group where another member's
    value is non-empty, and receives ``m`` such pieces, ``d/K`` values, per value of its own:
    at most ``(m+1)·|𝒮|/(K² m)`` multicast and ``m`` times that unicast, equal when no
    ``v(S, k)`` is empty. ``m = r`` is :func:`coded_shuffle`.

    >>> hybrid_shuffle(6, 4)  # m = 2, four groups of three: 1/6 of d out, 1/3 in
    Load(multicast=0.16666666666666666, unicast=0.3333333333333333)
    """
    K, r = n_workers, redundancy
    check_layout(K, r)
    if m is not None:
        check_m(K, r, m)
    p = profile(K, r, "hybrid", m)
    return Load(float(p.egress_mean / K), float(p.ingress_mean / K))


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
    """Hierarchical CDC: each owner sends its reduced segment (``d/g`` values) to the other
    ``K/g - 1`` owners of the same segment index, which all sum in cluster order.

    The same segment goes to every other owner: ``1/g`` multicast (sent once), ``(K/g - 1)/g``
    unicast (once per receiver)."""
    check_layout(n_workers, 1, group_size)
    m = n_workers // group_size
    return Load(1 / group_size if m > 1 else 0.0, (m - 1) / group_size)


#: The gradient exchanges of one placement (``coding.shuffle``).
SCHEMES = {
    "coded": coded_shuffle,
    "uncoded": uncoded_shuffle,
    "summed": summed_shuffle,
    "hybrid": hybrid_shuffle,
}


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
    if scheme == "hybrid":
        inner = hybrid_shuffle(g, redundancy, hybrid_m)
    else:
        inner = SCHEMES[scheme](g, redundancy)
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
