"""Not waiting for stragglers, bit for bit: what an owner asks for in place of what a late
worker did not send (``coding.stragglers``).

The ``r`` holders of a sub-batch ``T`` compute ``g_T`` with the same bits, and an owner folds
its terms in a fixed order, so any holder can stand in for any other. With the ``C(g, r)``
placement any ``g - s`` workers of a cluster, ``s <= r - 1``, hold every sub-batch. When owner
``k`` gives up on the workers in ``late``, it replaces each message it still lacks from them,
and each term its own (abandoned) map did not compute, by *plain* values from a worker that
finished its map (:func:`backups`):

- a term of its own, ``g_T[k]`` with ``k ∈ T``: the term itself (``("g", T, lo, hi)``);
- a summed part from sender ``j``: every term ``g_T[k]`` charged to ``j``, folded by the owner in
  the sender's order (the result is the part, bit for bit);
- a whole value ``v(S, k)`` (uncoded): the term ``g_{S∖k}[k]``;
- a coded packet ``P(S, j)``: the plain piece ``piece_j(v(S, k))``, a slice of ``g_{S∖k}[k]``;
- a hybrid packet ``P(S, j)``: the plain piece ``piece_j(v(S, k))`` of the pre-summed value
  (``("v", S, j)``), which every member of ``S∖{k}`` computes the same way; the whole value
  (``j = -1``) when no piece of ``S`` can be decoded; and where every member of ``S∖{k}`` is
  late (groups smaller than ``s + 1``), the terms charged to ``v(S, k)``, folded by the owner.

A packet can be decoded only with the owner's own values of the group's other members; an
owner whose map was abandoned asks for the plain piece of every packet it cannot decode.

>>> from dcoded.coding.placement import Placement, segment_slices
>>> p = Placement(4, 2)
>>> segs = segment_slices(40, 4)
>>> wanted, awaited = backups(p, "summed", None, 0, segs, have=set(p.held_by(0)),
...                           late={1}, arrived=set())
>>> wanted  # sender 1's part for owner 0 was the fold of g_(1,2)[0] and g_(1,3)[0]
[('g', (1, 2), 0, 10), ('g', (1, 3), 0, 10)]
>>> awaited  # sender 2 is not late: its part is still awaited
[('sum', 2, 0)]
>>> holder(wanted[0], 0, done={2, 3})  # the lowest finished holder of (1, 2)
2
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from math import comb

import numpy as np

from dcoded.coding.hybrid import HybridPlan
from dcoded.coding.placement import Placement, label_without, piece_slices
from dcoded.coding.shuffles import Request, scheme
from dcoded.coding.shuffles.base import whole


def check_stragglers(s, p: Placement, shuffle: str, transport: str) -> int:
    """``coding.stragglers`` checked against the layout and the transport (``ValueError``).

    >>> check_stragglers(2, Placement(4, 3), "coded", "direct")
    2
    >>> check_stragglers(2, Placement(4, 2), "coded", "direct")
    Traceback (most recent call last):
    ...
    ValueError: coding.stragglers=2 is not allowed with coding.redundancy=2: it must be an integer in 0..1 (any g - s workers must hold every sub-batch: s <= r - 1)
    """  # noqa: E501
    r = p.redundancy
    if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= r - 1:
        raise ValueError(
            f"coding.stragglers={s!r} is not allowed with coding.redundancy={r}: it must be an "
            f"integer in 0..{r - 1} (any g - s workers must hold every sub-batch: s <= r - 1)"
        )
    if s and r == p.n_workers:
        raise ValueError(
            f"coding.stragglers={s} does nothing at coding.redundancy={r} = cluster.n_workers: "
            "every worker computes the whole batch and waits for no other (set it to 0)"
        )
    if s and transport == "dask":
        raise ValueError(
            f"coding.stragglers={s} needs transport=direct or transport=multicast: on "
            "transport=dask every dependency of a step is fixed before it starts, so a step "
            "cannot change whom it waits for"
        )
    return s


def backups(
    p: Placement,
    shuffle: str,
    plan: HybridPlan | None,
    k: int,
    segments: Sequence[slice],
    have: set,
    late: set,
    arrived: set,
) -> tuple[list[Request], list[tuple]]:
    """``(requests, awaited)`` of owner ``k`` (local index) giving up on the workers ``late``:
    the plain values it asks for, in the order it folds them, and the tags of the messages it
    still waits for (from workers not late, or decodable). ``have``: the sub-batches its own
    map computed; ``arrived``: the tags of the messages it has."""
    seg = segments[k]
    # its own terms its (abandoned) map did not compute, then what the scheme's messages need
    out: list[Request] = [
        whole(label, seg) for label in p.sub_batches if k in label and label not in have
    ]
    wanted, awaited = scheme(shuffle).requests(p, k, seg, have, late, arrived, plan)
    return out + wanted, awaited


@dataclass(frozen=True)
class Round:
    """What owner ``k`` does next in a step that may not wait for every worker
    (:func:`next_round`): ``on_time`` (everyone is: wait for every message, ask for nothing),
    else whom it gives up on (``late``), the requests it asks each finished holder for now
    (``ask``: holder -> requests, in the order it folds them), the tags it still waits for
    from workers not late (``awaited``), and whether every request it needs has been asked
    (``settled``: once the awaited messages and the replies are in, it can reduce)."""

    on_time: bool
    late: set = field(default_factory=set)
    ask: dict = field(default_factory=dict)
    awaited: list = field(default_factory=list)
    settled: bool = False


def next_round(
    p: Placement,
    shuffle: str,
    plan: HybridPlan | None,
    k: int,
    segments: Sequence[slice],
    have: set,
    heard: Mapping[int, str],
    arrived: set,
    asked: Mapping[Request, int],
) -> Round:
    """Owner ``k``'s next move from what it has heard: ``heard`` (local index -> ``"done"`` or
    ``"gave-up"``: the workers that finished their map, and those that fell behind and said
    so), the tags ``arrived``, the sub-batches its own map computed (``have``; all it holds:
    complete) and what it already ``asked`` (request -> holder). A worker that gave up is
    never waited for; each value it did not send is asked once, of the lowest holder that has
    finished (none finished yet: asked in a later round). Nothing here depends on timing, so
    owners that heard different things still fold the same bits."""
    done = {j for j, what in heard.items() if what == "done"}
    late = {j for j, what in heard.items() if what == "gave-up"}
    complete = len(have) == comb(p.g - 1, p.redundancy - 1)  # every sub-batch it holds
    if complete and not late and not asked:
        return Round(on_time=True)
    requests, awaited = backups(p, shuffle, plan, k, segments, have, late, arrived)
    fresh: dict[int, list] = {}
    now = dict(asked)
    for request in requests:
        h = holder(request, k, done)
        if request not in now and h is not None:  # else: once a holder has finished
            now[request] = h
            fresh.setdefault(h, []).append(request)
    settled = all(q in now for q in requests)
    return Round(False, late, fresh, [t for t in awaited if t not in arrived], settled)


def holder(request: Request, k: int, done: Iterable[int]) -> int | None:
    """Who sends a plain value to owner ``k``: the lowest-ranked worker that finished its map
    and holds it (``None``: none yet)."""
    members = request[1] if request[0] == "g" else label_without(request[1], k)
    ready = sorted(set(members) & set(done) - {k})
    return ready[0] if ready else None


def length(request: Request, k: int, segments: Sequence[slice]) -> int:
    """How many float32 values the plain ``request`` of owner ``k`` is."""
    if request[0] == "g":
        return request[3] - request[2]
    seg = segments[k]
    n = seg.stop - seg.start
    if request[2] < 0:
        return n
    s = piece_slices(n, len(request[1]) - 1)[label_without(request[1], k).index(request[2])]
    return s.stop - s.start


def value_piece(group, k: int, j: int, value: np.ndarray) -> np.ndarray:
    """Piece ``j`` of ``v(S, k)`` (all of it for ``j = -1``)."""
    if j < 0:
        return value
    return value[piece_slices(len(value), len(group) - 1)[label_without(group, k).index(j)]]


def encode_requests(requests: Sequence[Request], p: Placement, plan: HybridPlan | None):
    """The requests as a flat uint32 array, four numbers each (what goes on the wire).

    >>> p = Placement(4, 2)
    >>> rows = encode_requests([("g", (1, 3), 5, 9)], p, None)
    >>> decode_requests(rows, p, None)
    [('g', (1, 3), 5, 9)]
    """
    labels = {t: i for i, t in enumerate(p.sub_batches)}
    rows = []
    for r in requests:
        if r[0] == "g":
            rows.append((0, labels[r[1]], r[2], r[3]))
        else:
            rows.append((1, plan.family.index(r[1]), r[2] + 1, 0))
    return np.array(rows, dtype=np.uint32).reshape(-1)


def decode_requests(data, p: Placement, plan: HybridPlan | None) -> list[Request]:
    """The inverse of :func:`encode_requests`."""
    rows = np.asarray(data, dtype=np.uint32).reshape(-1, 4)
    out = []
    for kind, index, a, b in rows.tolist():
        if kind == 0:
            out.append(("g", p.sub_batches[index], a, b))
        else:
            out.append(("v", plan.family[index], a - 1))
    return out


def backup_bound(p: Placement, shuffle: str, plan: HybridPlan | None, late: set) -> Fraction:
    """The plain values one cluster's owners receive in a step that did not wait for the
    workers ``late`` (local indices), in units of ``d``, when each late worker computed and
    sent nothing (so the most: a late worker that got further needs less), from the closed
    forms: in place of each late sender's message, one of the same length (for the summed
    shuffle, every term of its part: ``|part|`` values of ``d/g``; for a hybrid value no member
    of whose group is left, its charged terms); a late owner also receives its own
    ``C(g-1, r-1)`` terms and, unable to decode, every coded value ``C(g-1, r)`` or hybrid
    value whole.

    >>> p = Placement(4, 3)
    >>> backup_bound(p, "coded", None, {1})  # owner 1: C(3,2)/4 + C(3,3)/4; three owners: 1/12 each
    Fraction(5, 4)
    """
    shuffle_ = scheme(shuffle)
    return sum((shuffle_.backup(p, k, late, plan) for k in range(p.g)), Fraction(0))
