"""The shared figures draw what the numbers say: no line hidden under another, and phase bars
that account for the whole step."""

from __future__ import annotations

import itertools

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from dcoded import plots


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


@pytest.mark.parametrize("n_workers,group_size", [(4, None), (6, None), (4, 2), (2, None)])
def test_no_load_line_is_hidden_under_an_equal_one(ax, n_workers, group_size):
    """The coded shuffle's unicast count equals the uncoded one at every r, and its line was
    drawn exactly under the uncoded line."""
    plots.loads(n_workers, ax, group_size)
    lines = ax.get_lines()  # in drawing order: a later line covers an earlier one
    equal = [
        (below, above)
        for below, above in itertools.combinations(lines, 2)
        if np.array_equal(below.get_ydata(), above.get_ydata())
    ]
    assert {(b.get_label(), a.get_label()) for b, a in equal} >= {("uncoded", "coded, unicast")}
    for below, above in equal:
        assert below.get_linewidth() >= above.get_linewidth() + 1, (below, above)


def _summary(step: float, **phases: float) -> dict:
    return {"redundancy": 2, "time_s": {"step_median": step, **phases}}


def test_the_phase_bars_reach_the_step_with_the_rest_named(ax):
    runs = [_summary(0.100, map=0.03, shuffle=0.02), _summary(0.080, map=0.09)]
    plots.phases(runs, ax)
    tops = np.zeros(len(runs))
    for bars in ax.containers:
        tops = np.maximum(tops, [b.get_y() + b.get_height() for b in bars])
    # the first bar reaches its step; the second's phases already exceed it (medians of
    # different steps need not add up), and nothing is added
    assert tops == pytest.approx([100.0, 90.0])
    other = next(c for c in ax.containers if c.get_label() == plots.OTHER)
    assert [b.get_height() for b in other] == pytest.approx([50.0, 0.0])
