"""What every shuffle must give, checked for each one registered (a new scheme module is held
to the same): its messages are exactly what its owners need, each made from what its sender
holds; the owners' folds from those messages equal the reference's fold of the true gradients
bit for bit; and its closed-form load is what its messages carry."""

from __future__ import annotations

import numpy as np
import pytest

from dcoded.coding import Placement, best_m, hybrid_plan, segment_slices
from dcoded.coding.messages import message_values
from dcoded.coding.shuffles import KINDS, SCHEMES, SHUFFLES, of_tag, scheme

LAYOUTS = [(3, 1), (4, 1), (4, 2), (4, 3), (5, 2), (6, 3), (6, 4)]


def _plan(name: str, p: Placement):
    return (
        hybrid_plan(p.g, p.redundancy, best_m(p.g, p.redundancy))
        if scheme(name).needs_plan
        else None
    )


def test_the_registry_names_each_scheme_and_kind_once():
    assert SHUFFLES == tuple(SCHEMES) and len(set(SHUFFLES)) == len(SHUFFLES)
    assert {s.kind for s in SCHEMES.values()} == set(KINDS) and len(KINDS) == len(SCHEMES)
    assert all(s.name and s.kind and s.label for s in SCHEMES.values())
    with pytest.raises(ValueError, match=r"coding\.shuffle=.ring. is not known: choose one of"):
        scheme("ring")


@pytest.mark.parametrize(("g", "r"), LAYOUTS)
@pytest.mark.parametrize("name", SHUFFLES)
def test_every_message_sent_is_needed_by_each_of_its_receivers_and_no_other(name, g, r):
    p, s = Placement(g, r), scheme(name)
    plan = _plan(name, p)
    sent = {(tag, k): j for j in range(g) for tag, ks in s.sends(p, j, plan) for k in ks}
    needed = {(tag, k): j for k in range(g) for tag, j in s.receives(p, k, plan)}
    assert sent == needed
    for j in range(g):
        for tag, receivers in s.sends(p, j, plan):
            assert tag[0] == s.kind and of_tag(tag) is s
            assert s.fanout(p, tag) == len(receivers) and j not in receivers
            assert s.needs(p, tag) <= set(p.held_by(j)), (tag, j)


def _gradients(p: Placement, d: int, seed: int) -> dict:
    """A gradient per sub-batch whose values span many exponents (so that the order of a sum
    shows in its bits), with signed zeros among them."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.sub_batches:
        v = rng.standard_normal(d) * 10.0 ** rng.integers(-6, 7, d)
        v[rng.random(d) < 0.05] = -0.0
        out[t] = v.astype(np.float32)
    return out


@pytest.mark.parametrize(("g", "r"), LAYOUTS)
@pytest.mark.parametrize("name", SHUFFLES)
def test_each_owners_fold_equals_the_reference_bit_for_bit(name, g, r):
    """Every worker makes its messages from the gradients it holds; every owner folds its
    segment from its own and what it received: the same bits as the reference's fold of the
    true gradients (``d`` not a multiple of ``g`` or of the pieces)."""
    p, s = Placement(g, r), scheme(name)
    plan = _plan(name, p)
    d = 101
    segments = segment_slices(d, g)
    truth = _gradients(p, d, seed=g * 10 + r)
    held = {j: {t: truth[t] for t in p.held_by(j)} for j in range(g)}
    received: dict[int, dict] = {k: {} for k in range(g)}
    for j in range(g):
        for tag, receivers in s.sends(p, j, plan):
            message = s.payload(p, j, tag, held[j], segments)
            assert abs(message.size - s.length(p, tag) * d) < 1, tag  # pieces differ by one
            for k in receivers:
                received[k][tag] = message
    for k in range(g):
        seg = segments[k]
        got = s.reduce(
            p, k, segments, held[k], received[k], {}, lambda t, k=k, seg=seg: held[k][t][seg], plan
        )
        want = s.reference(p, k, truth, seg, plan)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(("g", "r"), LAYOUTS)
@pytest.mark.parametrize("name", SHUFFLES)
def test_the_closed_form_load_is_what_the_messages_carry(name, g, r):
    """Per worker, in units of ``d``: a message once (multicast), once per receiver (unicast)."""
    p, s = Placement(g, r), scheme(name)
    plan = _plan(name, p)
    messages = [(tag, ks) for j in range(g) for tag, ks in s.sends(p, j, plan)]
    multicast = sum(message_values(p, tag) for tag, _ in messages) / g
    unicast = sum(message_values(p, tag) * len(ks) for tag, ks in messages) / g
    load = s.load(g, r, plan.m if plan else None)
    assert load.multicast == pytest.approx(multicast) and load.unicast == pytest.approx(unicast)
