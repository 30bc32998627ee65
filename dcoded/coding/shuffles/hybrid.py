"""The hybrid shuffle: CDC's XOR exchange on pre-summed values, in groups of ``m + 1`` of a
family that covers every ``(r + 1)``-set (:mod:`dcoded.coding.hybrid`: the family, the active
pairs and the charging rule); ``m = r`` is the coded shuffle, ``m = 1`` a summed one."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np

from dcoded.coding.codec import decode_value_piece, encode_values, sum_in_order
from dcoded.coding.hybrid import HybridPlan, best_m, cached, charged_value, check_m, hybrid_plan
from dcoded.coding.hybrid import profile as family_profile
from dcoded.coding.placement import Placement, check_layout, label_without
from dcoded.coding.shuffles.base import Load, Shuffle, own_terms, whole


def hybrid_shuffle(n_workers: int, redundancy: int, m: int | None = None) -> Load:
    """The hybrid shuffle at group size ``m + 1`` (default: :func:`~dcoded.coding.hybrid.best_m`),
    exactly as its family and active pairs send (:mod:`dcoded.coding.hybrid`).

    A worker multicasts one packet of ``(d/K)/m`` values per group where another member's
    value is non-empty, and receives ``m`` such pieces, ``d/K`` values, per value of its own:
    at most ``(m+1)·|𝒮|/(K² m)`` multicast and ``m`` times that unicast, equal when no
    ``v(S, k)`` is empty. ``m = r`` is the coded shuffle.

    >>> hybrid_shuffle(6, 4)  # m = 2, four groups of three: 1/6 of d out, 1/3 in
    Load(multicast=0.16666666666666666, unicast=0.3333333333333333)
    """
    K, r = n_workers, redundancy
    check_layout(K, r)
    if m is not None:
        check_m(K, r, m)
    p = family_profile(K, r, "hybrid", m)
    return Load(float(p.egress_mean / K), float(p.ingress_mean / K))


def plan_of(p: Placement, group: tuple) -> HybridPlan:
    """The hybrid plan a ``hyb`` tag belongs to: groups of ``m + 1`` workers."""
    return hybrid_plan(p.g, p.redundancy, len(group) - 1)


class Hybrid(Shuffle):
    name, kind, label, needs_plan = "hybrid", "hyb", "hybrid packets", True

    def sends(self, p, local, plan=None):
        return [(("hyb", group, local), ks) for group, ks in plan.sends(local)]

    def receives(self, p, local, plan=None):
        return [
            (("hyb", group, j), j) for group in plan.values_for(local) for j in group if j != local
        ]

    def needs(self, p, tag):
        group, j = tag[1], tag[2]
        plan = plan_of(p, group)
        return {t for k in plan.receivers(group, j) for t in plan.charges[(group, k)]}

    def fanout(self, p, tag):
        return len(plan_of(p, tag[1]).receivers(tag[1], tag[2]))

    def length(self, p, tag):  # a packet of pieces of 1/m of a segment
        return Fraction(1, p.g * (len(tag[1]) - 1))

    def payload(self, p, local, tag, grads, segments):
        group, plan = tag[1], plan_of(p, tag[1])
        values = {
            k: charged_value(plan, group, k, grads, segments) for k in plan.receivers(group, local)
        }
        return encode_values(group, local, values)

    def reduce(self, p, k, segments, grads, received, plain, term, plan=None):
        seg = segments[k]
        values = []
        for group in plan.values_for(k):
            if ("v", group, -1) in plain:
                values.append(plain[("v", group, -1)])
                continue
            charged = plan.charges[(group, k)]
            if ("g", charged[0], seg.start, seg.stop) in plain:  # its terms, sent plain
                values.append(sum_in_order([term(t) for t in charged]))
                continue
            known = {
                i: charged_value(plan, group, i, grads, segments)
                for i in plan.active(group)
                if i != k and set(plan.charges[(group, i)]) <= grads.keys()
            }
            pieces = [
                plain[("v", group, j)]
                if ("v", group, j) in plain
                else decode_value_piece(
                    group, j, k, received[("hyb", group, j)], known, seg.stop - seg.start
                )
                for j in label_without(group, k)
            ]
            values.append(np.concatenate(pieces))
        return sum_in_order(own_terms(p, k, term) + values)

    def reference(self, p, k, grads, seg, plan=None):
        own = [grads[t][seg] for t in p.sub_batches if k in t]
        parts = [
            sum_in_order([grads[t][seg] for t in plan.charges[(group, k)]])
            for group in plan.values_for(k)
        ]
        return sum_in_order(own + parts)

    def requests(self, p, k, seg, have, late, arrived, plan=None):
        out, awaited = [], []
        for group in plan.values_for(k):
            label = label_without(group, k)
            plain = []
            for j in label:
                tag = ("hyb", group, j)
                usable = all(
                    set(plan.charges[(group, x)]) <= have
                    for x in plan.active(group)
                    if x not in (j, k)
                )
                if usable and tag in arrived:
                    continue
                if usable and j not in late:
                    awaited.append(tag)
                    continue
                plain.append(j)
            if not plain:
                continue
            if not set(label) - late:  # no member of S∖{k} to sum it: its terms, folded here
                out += [whole(t, seg) for t in plan.charges[(group, k)]]
            elif len(plain) == len(label):
                out.append(("v", group, -1))
            else:
                out += [("v", group, j) for j in plain]
        return out, awaited

    def backup(self, p, k, late, plan=None):
        g, r = p.g, p.redundancy
        total = Fraction(0)
        for group in plan.values_for(k):
            label = set(label_without(group, k))
            # a late owner decodes no packet that XORs in a value of a third member
            plain = {
                j for j in label if j in late or (k in late and set(plan.active(group)) - {j, k})
            }
            if label <= late:  # nobody left to sum it: its terms
                total += Fraction(len(plan.charges[(group, k)]), g)
            elif plain == label:  # the value whole
                total += Fraction(1, g)
            else:  # the pieces it cannot have from their packets
                total += Fraction(len(plain), g * (len(group) - 1))
        if k in late:
            total += Fraction(comb(g - 1, r - 1), g)
        return total

    def load(self, g, r, m=None):
        return hybrid_shuffle(g, r, m)

    def symmetric(self, K, r, m=None):
        # a packet goes to the m others of its group (m not given: the least load's, as the
        # engine and the closed-form load pick it)
        return comb(K - 1, r), m or best_m(K, r)

    def check(self, g, r, m):
        m = m or best_m(g, r)
        if not cached(g, r, m):
            return (
                f"no hybrid family is tabulated for g={g}, r={r}, m={m} "
                "(python -m dcoded.coding.covering extends the table)"
            )
        return None


HYBRID = Hybrid()
