"""The messages of one CDC step: who sends what to whom, how long it is, what it needs.

A shuffle message is named by a *tag* (local indices throughout): ``("pkt", S, j)`` the coded
packet ``P(S, j)``, ``("unc", S, k)`` the value ``v(S, k)`` sent whole, ``("sum", j, k)`` the
sum sender ``j`` pre-adds for owner ``k``, ``("hyb", S, j)`` the hybrid packet over the
pre-summed values ``v(S, ·)`` of group ``S`` (its plan: :func:`plan_of`). Both transports of
the engine, the multicast pacing and the benchmark's bounds read the step from here.

>>> from dcoded.coding.placement import Placement
>>> p = Placement(4, 2)
>>> shuffle_sends(p, "coded", 0)[0]
(('pkt', (0, 1, 2), 0), [1, 2])
>>> sum(size for _, _, size in step_messages(p, "coded")["shuffle"])  # 4 x 3 packets of d/8
1.5
"""

from __future__ import annotations

import numpy as np

from dcoded.coding.cross import cross_messages
from dcoded.coding.hybrid import HybridPlan, best_m, hybrid_plan
from dcoded.coding.placement import Placement
from dcoded.coding.shuffles import of_tag, scheme


def shuffle_sends(
    p: Placement, shuffle: str, local: int, plan: HybridPlan | None = None
) -> list[tuple[tuple, list[int]]]:
    """``(tag, receivers)`` of every message the worker of local index ``local`` sends
    (``plan``: the hybrid shuffle's, for ``shuffle="hybrid"``; see
    :meth:`dcoded.coding.shuffles.Shuffle.sends`)."""
    return scheme(shuffle).sends(p, local, plan)


def shuffle_receives(
    p: Placement, shuffle: str, local: int, plan: HybridPlan | None = None
) -> list[tuple[tuple, int]]:
    """``(tag, sender)`` of every message the owner of segment ``local`` needs."""
    return scheme(shuffle).receives(p, local, plan)


def message_values(p: Placement, tag: tuple) -> float:
    """How long message ``tag`` is, in units of ``d`` (the closed form: pieces and segments
    of lengths that do not divide evenly differ by one value)."""
    return float(of_tag(tag).length(p, tag))


def step_messages(
    p: Placement, shuffle: str, plan: HybridPlan | None = None
) -> dict[str, list[tuple[int, list[int], float]]]:
    """Every message of one step, ``(sender, receivers, length in units of d)`` in global
    ranks: the ``shuffle`` (with the cross-cluster sum's reduce-scatter) and the all-gather
    (``params``, with the cross-cluster sum's all-gather, which overlaps it); ``plan``: the
    hybrid shuffle's."""
    out: dict[str, list] = {"shuffle": [], "params": []}
    if p.redundancy == p.n_workers:  # every worker updates all of θ: nothing moves
        return out
    for c in range(p.n_clusters):
        for j in range(p.g):
            for tag, receivers in shuffle_sends(p, shuffle, j, plan):
                out["shuffle"].append(
                    (
                        p.global_id(c, j),
                        [p.global_id(c, k) for k in receivers],
                        message_values(p, tag),
                    )
                )
            others = [p.global_id(c, i) for i in range(p.g) if i != j]
            out["params"].append((p.global_id(c, j), others, 1 / p.g))
    # the cross-cluster sum (g < K): its reduce-scatter ends the shuffle; its all-gather goes
    # with θ's (each summed chunk is stepped and sent to the cluster as it comes)
    scatter, gather = cross_messages(p)
    out["shuffle"] += scatter
    out["params"] += gather
    return out


def algorithm_messages(
    algorithm: str,
    n_workers: int,
    redundancy: int = 1,
    group_size: int | None = None,
    shuffle: str = "coded",
    hybrid_m: int | None = None,
) -> dict[str, list[tuple[int, list[int], float]]]:
    """Every message of one step of ``algorithm``, ``(sender, receivers, length in units of
    d)``: the gradient exchange (``shuffle``) and the distribution of ``θ`` (``params``).
    Hosts ``0..K-1`` are the workers, ``K`` the driver (the parameter server).

    ``cdc``: :func:`step_messages`; ``ddp``: the ring all-reduce, ``2(K-1)`` chunks of ``d/K``
    from each rank to the next; ``ssgd`` and ``asgd``: every gradient up to the server and
    ``θ`` back down through its one link.

    >>> algorithm_messages("ddp", 4)["shuffle"][0]
    (0, [1], 1.5)
    >>> algorithm_messages("ssgd", 2)
    {'shuffle': [(0, [2], 1.0), (1, [2], 1.0)], 'params': [(2, [0], 1.0), (2, [1], 1.0)]}
    """
    K = n_workers
    if algorithm in ("cdc", "serial"):
        p = Placement(K, redundancy, group_size)
        plan = None
        if scheme(shuffle).needs_plan:  # hybrid_m None: the m of least load, as the engine picks
            plan = hybrid_plan(p.g, p.redundancy, hybrid_m or best_m(p.g, p.redundancy))
        return step_messages(p, shuffle, plan)
    if algorithm == "ddp":
        return {"shuffle": [(i, [(i + 1) % K], 2 * (K - 1) / K) for i in range(K)], "params": []}
    if algorithm in ("ssgd", "asgd"):
        return {
            "shuffle": [(i, [K], 1.0) for i in range(K)],
            "params": [(K, [i], 1.0) for i in range(K)],
        }
    raise ValueError(f"algorithm {algorithm!r} is not known: choose cdc, ddp, ssgd or asgd")


def message_needs(p: Placement, tag: tuple) -> set:
    """The sub-batches whose gradients the sender of message ``tag`` must have computed."""
    return of_tag(tag).needs(p, tag)


def sent_bytes(p: Placement, tag: tuple, message: np.ndarray) -> dict:
    """What a message moves: once (multicast), once per receiver (unicast)."""
    return {"multicast": message.nbytes, "unicast": message.nbytes * of_tag(tag).fanout(p, tag)}
