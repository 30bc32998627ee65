"""The coded shuffle (CDC): in every group ``S`` of ``r + 1`` workers, each member multicasts
one XOR packet ``P(S, j)`` of a piece of every other member's value to the other ``r``; an
owner decodes its pieces with its own values of the group's other members."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np

from dcoded.coding.codec import decode_piece, encode_packet, sum_in_order
from dcoded.coding.placement import check_layout, label_without, piece_slices
from dcoded.coding.shuffles.base import Load, Shuffle


def coded_shuffle(n_workers: int, redundancy: int) -> Load:
    """CDC coded shuffle: ``C(K-1, r) / (K r)`` multicast, ``C(K-1, r) / K`` unicast.

    A worker is in ``C(K-1, r)`` groups and sends one packet of ``(d/K)/r`` values in each,
    heard by ``r`` receivers. Summed over workers this is ``(1/r)(1 - r/K)`` of all
    intermediate values (``C(K, r)`` sub-batch gradients of ``d`` values): CDC's optimum.
    """
    K, r = n_workers, redundancy
    check_layout(K, r)
    return Load(comb(K - 1, r) / (K * r), comb(K - 1, r) / K)


class Coded(Shuffle):
    name, kind, label = "coded", "pkt", "coded packets"

    def sends(self, p, local, plan=None):
        return [
            (("pkt", group, local), [k for k in group if k != local])
            for group in p.groups_of(local)
        ]

    def receives(self, p, local, plan=None):
        return [(("pkt", group, j), j) for group in p.groups_of(local) for j in group if j != local]

    def needs(self, p, tag):
        group, j = tag[1], tag[2]
        return {label_without(group, k) for k in group if k != j}

    def fanout(self, p, tag):
        return len(tag[1]) - 1

    def length(self, p, tag):  # a packet of pieces of 1/r of a segment
        return Fraction(1, p.g * (len(tag[1]) - 1))

    def payload(self, p, local, tag, grads, segments):
        return encode_packet(tag[1], local, grads, segments)

    def reduce(self, p, k, segments, grads, received, plain, term, plan=None):
        seg = segments[k]
        decoded = {}
        for group in p.groups_of(k):
            label = label_without(group, k)
            pieces = piece_slices(seg.stop - seg.start, len(group) - 1)
            value = []
            for i, j in enumerate(label):
                key = ("g", label, seg.start + pieces[i].start, seg.start + pieces[i].stop)
                if key in plain:
                    value.append(plain[key])
                else:
                    packet = received[("pkt", group, j)]
                    value.append(decode_piece(group, j, k, packet, grads, segments))
            decoded[label] = np.concatenate(value)
        return sum_in_order([term(t) if k in t else decoded[t] for t in p.sub_batches])

    def reference(self, p, k, grads, seg, plan=None):
        return sum_in_order([grads[t][seg] for t in p.sub_batches])

    def requests(self, p, k, seg, have, late, arrived, plan=None):
        out, awaited = [], []
        n = seg.stop - seg.start
        for group in p.groups_of(k):
            label = label_without(group, k)
            pieces = piece_slices(n, len(group) - 1)
            for i, j in enumerate(label):
                tag = ("pkt", group, j)
                # decoding P(S, j) takes k's own v(S, k'), k' in S∖{j, k}
                usable = all(label_without(group, x) in have for x in label if x != j)
                if usable and tag in arrived:
                    continue
                if usable and j not in late:
                    awaited.append(tag)
                    continue
                out.append(("g", label, seg.start + pieces[i].start, seg.start + pieces[i].stop))
        return out, awaited

    def backup(self, p, k, late, plan=None):
        g, r = p.g, p.redundancy
        if k in late:  # its own terms, and undecodable: every value whole
            return Fraction(comb(g - 1, r - 1), g) + Fraction(comb(g - 1, r), g)
        return sum(
            (self.length(p, tag) for tag, j in self.receives(p, k, plan) if j in late),
            Fraction(0),
        )

    def load(self, g, r, m=None):
        return coded_shuffle(g, r)

    def symmetric(self, K, r, m=None):
        return comb(K - 1, r), r


CODED = Coded()
