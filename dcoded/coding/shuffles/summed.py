"""The summed shuffle: a reduce-scatter that sums before sending, on the CDC placement. Every
owner's lacking terms are split among ``g - r`` senders
(:func:`~dcoded.coding.placement.summed_plan`), each sending their sum once, by unicast."""

from __future__ import annotations

from fractions import Fraction

from dcoded.coding.codec import sum_in_order
from dcoded.coding.placement import check_layout, summed_plan
from dcoded.coding.shuffles.base import Load, Shuffle, own_if_late, own_terms, stand_ins, whole


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


class Summed(Shuffle):
    name, kind, label = "summed", "sum", "pre-added sums"

    def sends(self, p, local, plan=None):
        return [
            (("sum", local, k), [k])
            for k in range(p.g)
            if k != local and local in summed_plan(p.g, p.redundancy, k)
        ]

    def receives(self, p, local, plan=None):
        return [(("sum", j, local), j) for j in summed_plan(p.g, p.redundancy, local)]

    def needs(self, p, tag):
        return set(summed_plan(p.g, p.redundancy, tag[2])[tag[1]])

    def payload(self, p, local, tag, grads, segments):
        k = tag[2]
        part = summed_plan(p.g, p.redundancy, k)[local]
        return sum_in_order([grads[t][segments[k]] for t in part])

    def reduce(self, p, k, segments, grads, received, plain, term, plan=None):
        parts = summed_plan(p.g, p.redundancy, k)
        return sum_in_order(
            own_terms(p, k, term)
            + [
                received[tag] if tag in received else sum_in_order([term(t) for t in parts[j]])
                for tag, j in self.receives(p, k)
            ]
        )

    def reference(self, p, k, grads, seg, plan=None):
        own = [grads[t][seg] for t in p.sub_batches if k in t]
        parts = summed_plan(p.g, p.redundancy, k)
        return sum_in_order(
            own + [sum_in_order([grads[t][seg] for t in ts]) for ts in parts.values()]
        )

    def requests(self, p, k, seg, have, late, arrived, plan=None):
        parts = summed_plan(p.g, p.redundancy, k)
        return stand_ins(
            self, p, k, late, arrived, plan, lambda tag, j: [whole(t, seg) for t in parts[j]]
        )

    def backup(self, p, k, late, plan=None):
        parts = summed_plan(p.g, p.redundancy, k)
        total = own_if_late(p, k, late)
        for _, j in self.receives(p, k, plan):
            if j in late:
                total += Fraction(len(parts[j]), p.g)
        return total

    def load(self, g, r, m=None):
        return summed_shuffle(g, r)

    def symmetric(self, K, r, m=None):
        return K - r, 1

    def enumeration_cost(self, g, r):
        return g**3  # planning who sends which sum costs about g^3


SUMMED = Summed()
