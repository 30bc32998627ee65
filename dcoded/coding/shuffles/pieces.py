"""The coded shuffle with the XOR taken out: in every group ``S`` of ``r + 1`` workers, each
member sends every other member ``k`` the very piece of ``v(S, k)`` it would have XORed into
its packet, plain, by unicast. The same placement, groups, senders, pieces and fold as the
coded shuffle (the same bits); only the coding is gone, so the two side by side measure what
the XOR alone buys: ``r`` messages of ``1/r`` of a packet where CDC multicasts one.

Against the uncoded shuffle (every ``v(S, k)`` whole, by one holder) it moves the same bytes,
spread over all ``r`` holders of each value, and a late holder costs only its own pieces.
"""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np

from dcoded.coding.codec import piece, sum_in_order
from dcoded.coding.placement import check_layout, label_without, piece_slices
from dcoded.coding.shuffles.base import Load, Shuffle, stand_ins


def pieces_shuffle(n_workers: int, redundancy: int) -> Load:
    """CDC's pieces sent plain: ``C(K-1, r) / K`` both ways, the uncoded shuffle's load.

    A worker is in ``C(K-1, r)`` groups and sends ``r`` pieces of ``(d/K)/r`` values in each,
    one to each other member.

    >>> pieces_shuffle(4, 2)
    Load(multicast=0.75, unicast=0.75)
    """
    K, r = n_workers, redundancy
    check_layout(K, r)
    return Load(comb(K - 1, r) / K, comb(K - 1, r) / K)


def _piece_at(group: tuple, sender: int, k: int, seg: slice) -> slice:
    """Where in ``G[k]``'s segment ``seg`` the piece of ``v(S, k)`` that ``sender`` sends lies
    (global parameter indices): the coded shuffle's piece ``i`` of ``v(S, k)``, ``i`` the
    sender's place in ``S∖{k}`` (what :func:`~dcoded.coding.codec.piece` cuts)."""
    label = label_without(group, k)
    piece = piece_slices(seg.stop - seg.start, len(group) - 1)[label.index(sender)]
    return slice(seg.start + piece.start, seg.start + piece.stop)


class Pieces(Shuffle):
    name, kind, label = "pieces", "pcs", "plain pieces"

    def sends(self, p, local, plan=None):
        return [
            (("pcs", group, local, k), [k])
            for group in p.groups_of(local)
            for k in group
            if k != local
        ]

    def receives(self, p, local, plan=None):
        return [
            (("pcs", group, j, local), j)
            for group in p.groups_of(local)
            for j in group
            if j != local
        ]

    def needs(self, p, tag):
        return {label_without(tag[1], tag[3])}

    def length(self, p, tag):  # a piece: 1/r of a segment
        return Fraction(1, p.g * (len(tag[1]) - 1))

    def payload(self, p, local, tag, grads, segments):
        return piece(grads, segments, tag[1], tag[3], local).copy()

    def reduce(self, p, k, segments, grads, received, plain, term, plan=None):
        seg = segments[k]
        decoded = {}
        for group in p.groups_of(k):
            label = label_without(group, k)
            value = []
            for j in label:
                at = _piece_at(group, j, k, seg)
                key = ("g", label, at.start, at.stop)
                value.append(plain[key] if key in plain else received[("pcs", group, j, k)])
            decoded[label] = np.concatenate(value)
        return sum_in_order([term(t) if k in t else decoded[t] for t in p.sub_batches])

    def reference(self, p, k, grads, seg, plan=None):
        return sum_in_order([grads[t][seg] for t in p.sub_batches])

    def requests(self, p, k, seg, have, late, arrived, plan=None):
        def stand_in(tag, j):
            at = _piece_at(tag[1], j, k, seg)
            return [("g", label_without(tag[1], k), at.start, at.stop)]

        return stand_ins(self, p, k, late, arrived, plan, stand_in)

    def load(self, g, r, m=None):
        return pieces_shuffle(g, r)

    def symmetric(self, K, r, m=None):
        return comb(K - 1, r) * r, 1


PIECES = Pieces()
