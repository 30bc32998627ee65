"""What a gradient exchange of cdc gives: the :class:`Shuffle` every scheme module implements.

A scheme says, for one cluster of ``g`` workers (local indices) with the ``C(g, r)``
placement, which messages each worker sends and each owner needs (named by *tags*, see
:mod:`dcoded.coding.messages`), how a sender makes a message from its own sub-batch gradients
and how an owner folds its segment ``G[k]`` from its own terms and what it received; the fold
the ``serial`` reference makes from the true gradients, in the same order (bit for bit); what an
owner asks for in place of what late workers did not send, and the most that costs; and the
closed forms the performance model and the loads tables read. The engine, the reference, the
straggler logic, the loads and the model ask the scheme, never its name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import comb

import numpy as np

from dcoded.coding.hybrid import HybridPlan
from dcoded.coding.placement import Placement

#: A plain value an owner asks for: ``("g", T, lo, hi)`` the slice ``lo:hi`` of ``g_T`` (global
#: parameter indices), or ``("v", S, j)`` piece ``j`` of the hybrid value ``v(S, k)`` of the
#: owner ``k`` who asks (``j = -1``: the whole value).
Request = tuple
#: ``(tag, receivers)`` of a message a worker sends; ``(tag, sender)`` of one an owner needs.
Send = tuple[tuple, list[int]]
Receive = tuple[tuple, int]


@dataclass(frozen=True)
class Load:
    """A load in units of ``d`` values per worker per step."""

    multicast: float
    unicast: float

    def bytes(self, d: int, itemsize: int = 4) -> Load:
        return Load(self.multicast * d * itemsize, self.unicast * d * itemsize)


class Shuffle:
    """One gradient exchange. ``name``: its ``coding.shuffle``; ``kind``: the first element of
    its messages' tags (and their Dask key prefix); ``label``: what its messages are, in a
    figure's legend; ``needs_plan``: whether it runs on a
    :class:`~dcoded.coding.hybrid.HybridPlan` (``coding.hybrid_m``), passed as ``plan``."""

    name: str = ""
    kind: str = ""
    label: str = ""
    needs_plan: bool = False

    # -- the messages of one step
    def sends(self, p: Placement, local: int, plan: HybridPlan | None = None) -> list[Send]:
        """``(tag, receivers)`` of every message the worker of local index ``local`` sends."""
        raise NotImplementedError

    def receives(self, p: Placement, local: int, plan: HybridPlan | None = None) -> list[Receive]:
        """``(tag, sender)`` of every message the owner of segment ``local`` needs."""
        raise NotImplementedError

    def needs(self, p: Placement, tag: tuple) -> set:
        """The sub-batches whose gradients the sender of message ``tag`` must have computed."""
        raise NotImplementedError

    def fanout(self, p: Placement, tag: tuple) -> int:
        """How many receivers message ``tag`` has."""
        return 1

    def length(self, p: Placement, tag: tuple) -> Fraction:
        """How long message ``tag`` is, in units of ``d``, exactly (pieces and segments of
        lengths that do not divide evenly differ by one value): a segment's worth, ``1/g``,
        unless the scheme says otherwise."""
        return Fraction(1, p.g)

    # -- the math of a worker
    def payload(
        self, p: Placement, local: int, tag: tuple, grads: Mapping, segments: Sequence[slice]
    ) -> np.ndarray:
        """The message ``tag`` that worker ``local`` sends, from its own gradients ``g_T``."""
        raise NotImplementedError

    def reduce(
        self,
        p: Placement,
        k: int,
        segments: Sequence[slice],
        grads: Mapping,
        received: Mapping,
        plain: Mapping,
        term: Callable[[tuple], np.ndarray],
        plan: HybridPlan | None = None,
    ) -> np.ndarray:
        """``G[k]`` of owner ``k``: its own terms (``term(T)``: ``g_T[k]``, computed or sent
        plain), the messages it received (by tag), decoded, and the ``plain`` values that
        replace what a late worker did not send."""
        raise NotImplementedError

    def reference(
        self, p: Placement, k: int, grads: Mapping, seg: slice, plan: HybridPlan | None = None
    ) -> np.ndarray:
        """``G[k]`` from the true gradients in the order :meth:`reduce` folds it (what the
        ``serial`` reference computes, with no codec)."""
        raise NotImplementedError

    # -- not waiting for stragglers
    def requests(
        self,
        p: Placement,
        k: int,
        seg: slice,
        have: set,
        late: set,
        arrived: set,
        plan: HybridPlan | None = None,
    ) -> tuple[list[Request], list[tuple]]:
        """``(requests, awaited)`` of owner ``k`` for the messages of this scheme when it gives
        up on ``late``: the plain values it asks for in their place, and the tags it still
        waits for (see :func:`dcoded.coding.stragglers.backups`)."""
        raise ValueError(f"shuffle {self.name!r} has no straggler-tolerant delivery")

    def backup(self, p: Placement, k: int, late: set, plan: HybridPlan | None = None) -> Fraction:
        """The plain values owner ``k`` receives (units of ``d``) when each worker in ``late``
        computed and sent nothing (:func:`dcoded.coding.stragglers.backup_bound`). By default,
        for messages that stand alone: each one from a late sender replaced by as many plain
        values, and a late owner's own terms."""
        total = own_if_late(p, k, late)
        for tag, j in self.receives(p, k, plan):
            if j in late:
                total += self.length(p, tag)
        return total

    # -- closed forms
    def load(self, g: int, r: int, m: int | None = None) -> Load:
        """The shuffle's load inside one cluster of ``g`` (:mod:`dcoded.coding.loads`)."""
        raise NotImplementedError

    def symmetric(self, K: int, r: int, m: int | None = None) -> tuple[int, int]:
        """In one cluster of ``K`` too large to enumerate: how many shuffle messages a worker
        sends (and receives), and to how many receivers each goes."""
        raise NotImplementedError

    def enumeration_cost(self, g: int, r: int) -> int:
        """About how many (message, receiver) pairs enumerating one cluster's step visits."""
        return comb(g, min(r + 1, g)) * (r + 1) * r

    def check(self, g: int, r: int, m: int | None) -> str | None:
        """Why this scheme cannot run the layout (``None``: it can)."""
        return None

    def __repr__(self) -> str:
        return f"<shuffle {self.name}>"


def stand_ins(
    shuffle: Shuffle,
    p: Placement,
    k: int,
    late: set,
    arrived: set,
    plan: HybridPlan | None,
    stand_in: Callable[[tuple, int], list[Request]],
) -> tuple[list[Request], list[tuple]]:
    """``(requests, awaited)`` of a scheme whose messages stand alone (each decodable by
    itself): every message from a late sender not yet arrived replaced by ``stand_in(tag,
    sender)``, every other one awaited."""
    out: list[Request] = []
    awaited: list[tuple] = []
    for tag, j in shuffle.receives(p, k, plan):
        if tag in arrived:
            continue
        if j in late:
            out += stand_in(tag, j)
        else:
            awaited.append(tag)
    return out, awaited


def own_if_late(p: Placement, k: int, late: set) -> Fraction:
    """What a late owner is sent of its own terms (``C(g-1, r-1)`` values of ``d/g``)."""
    return Fraction(comb(p.g - 1, p.redundancy - 1), p.g) if k in late else Fraction(0)


def own_terms(p: Placement, k: int, term: Callable[[tuple], np.ndarray]) -> list[np.ndarray]:
    """Owner ``k``'s own ``g_T[k]`` (``T ∋ k``), in lexicographic order of ``T``."""
    return [term(t) for t in p.sub_batches if k in t]


def whole(label: tuple, seg: slice) -> Request:
    """The request of the term ``g_label`` over the segment ``seg``."""
    return ("g", label, seg.start, seg.stop)
