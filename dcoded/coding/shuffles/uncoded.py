"""The uncoded shuffle: the same placement and groups as the coded one, but every value
``v(S, k)`` sent whole, by unicast, by one holder
(:func:`~dcoded.coding.placement.uncoded_sender`)."""

from __future__ import annotations

from math import comb

from dcoded.coding.codec import sum_in_order
from dcoded.coding.placement import check_layout, label_without, uncoded_sender
from dcoded.coding.shuffles.base import Load, Shuffle, stand_ins, whole


def uncoded_shuffle(n_workers: int, redundancy: int) -> Load:
    """Same placement, every ``v(S, k)`` sent whole by one holder: ``C(K-1, r) / K`` both ways."""
    K, r = n_workers, redundancy
    check_layout(K, r)
    return Load(comb(K - 1, r) / K, comb(K - 1, r) / K)


class Uncoded(Shuffle):
    name, kind, label = "uncoded", "unc", "uncoded values"

    def sends(self, p, local, plan=None):
        out = []
        for group in p.groups_of(local):
            out += [(("unc", group, k), [k]) for k in group if uncoded_sender(group, k) == local]
        return out

    def receives(self, p, local, plan=None):
        return [
            (("unc", group, local), uncoded_sender(group, local)) for group in p.groups_of(local)
        ]

    def needs(self, p, tag):
        return {label_without(tag[1], tag[2])}

    def payload(self, p, local, tag, grads, segments):
        group, k = tag[1], tag[2]
        return grads[label_without(group, k)][segments[k]].copy()

    def reduce(self, p, k, segments, grads, received, plain, term, plan=None):
        decoded = {}
        for group in p.groups_of(k):
            tag = ("unc", group, k)
            label = label_without(group, k)
            decoded[label] = received[tag] if tag in received else term(label)
        return sum_in_order([term(t) if k in t else decoded[t] for t in p.sub_batches])

    def reference(self, p, k, grads, seg, plan=None):
        return sum_in_order([grads[t][seg] for t in p.sub_batches])

    def requests(self, p, k, seg, have, late, arrived, plan=None):
        return stand_ins(
            self, p, k, late, arrived, plan, lambda tag, j: [whole(label_without(tag[1], k), seg)]
        )

    def load(self, g, r, m=None):
        return uncoded_shuffle(g, r)

    def symmetric(self, K, r, m=None):
        return comb(K - 1, r), 1


UNCODED = Uncoded()
