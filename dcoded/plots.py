"""Figures shared by the notebooks and ``paper/``: they only read results and draw.

Every function takes a matplotlib ``Axes`` and returns it, so callers compose figures freely.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dcoded.coding import Placement, load_table
from dcoded.coding.shuffles import SCHEMES
from dcoded.results import (
    PHASES,
    SEED,
    dilation,
    is_run_folder,
    load_run,
    load_sweep,
    read_history,
    run_name,
    sweep_table,
    times,
    varying,
)
from dcoded.topology import phase_bounds


def placement(p: Placement, ax, cluster: int = 0):
    """Who computes which sub-batch (rows: workers; columns: sub-batches ``T``)."""
    held = np.array([[local in t for t in p.sub_batches] for local in range(p.g)], dtype=float)
    ax.imshow(held, cmap="Blues", vmin=0, vmax=1.4, aspect="auto")
    ax.set_xticks(range(p.n_sub_batches), ["".join(map(str, t)) for t in p.sub_batches])
    ax.set_yticks(range(p.g), [f"worker {p.global_id(cluster, i)}" for i in range(p.g)])
    ax.set_xlabel("sub-batch T")
    ax.set_title(f"placement: K={p.n_workers}, r={p.redundancy}, g={p.g}")
    return ax


def loads(n_workers: int, ax, group_size: int | None = None):
    """Closed-form communication per worker per step (units of d) against ``r``.

    Curves can coincide: the uncoded shuffle's count equals the coded shuffle's unicast count
    at every ``r`` (a coded packet for ``r`` receivers is sent ``r`` times without multicast),
    and at small ``g`` all four shuffle curves can be one. Each shuffle curve is drawn thinner
    than the one before it, the first ones as wide pale bands, so that every one shows.
    """
    rows = load_table(n_workers, group_size)
    r = [row["r"] for row in rows]
    for key, label, style in [
        ("uncoded_uc", "uncoded", {"lw": 9, "alpha": 0.3, "marker": "s", "ms": 11}),
        ("reduce_scatter", "summed reduce-scatter", {"lw": 5, "alpha": 0.5, "marker": "^"}),
        ("coded_mc", "coded, multicast", {"lw": 2.5, "marker": "o"}),
        ("coded_uc", "coded, unicast", {"lw": 1.5, "ls": "--", "marker": "o", "mfc": "none"}),
        ("ring_allreduce", "ring all-reduce", {"lw": 3, "ls": ":"}),  # = the server at K=2
        ("param_server_up", "parameter server (up)", {"ls": "-."}),
    ]:
        ax.plot(r, [row[key] for row in rows], label=label, **style)
    ax.set_xticks(r)
    ax.set_xlabel("redundancy r")
    ax.set_ylabel("per worker per step (units of d)")
    ax.set_title(f"communication loads, K={n_workers}")
    ax.legend(fontsize="small")
    return ax


def topology_bounds(n_workers: int, axes):
    """What one step needs on a switch and on a bus against ``r`` (two ``Axes``), per scheme,
    in units of ``d`` (:func:`dcoded.coding.loads.step_bounds`): over a link's rate, the
    step's communication time bound there."""
    from dcoded.coding.loads import step_bounds

    rows = [row for r in range(1, n_workers + 1) for row in step_bounds(n_workers, r)]
    for ax, where in zip(axes, ("switch", "bus"), strict=True):
        for scheme in dict.fromkeys(row["scheme"] for row in rows):
            mine = [row for row in rows if row["scheme"] == scheme]
            ax.plot([row["r"] for row in mine], [row[where] for row in mine], "o-", label=scheme)
        ax.set_xticks(range(1, n_workers + 1))
        ax.set_xlabel("redundancy r")
        ax.set_ylabel("per step (units of d)")
        ax.set_title(f"{where}: " + ("busiest host" if where == "switch" else "all on the medium"))
    axes[0].legend(fontsize="small")
    return axes


#: The bar segment of the step time that no phase accounts for.
OTHER = "other: scheduling, waits"


def stacked(summary: Mapping) -> dict[str, float]:
    """Each phase's median in seconds, as they add up: ``ddp``'s all-reduce (its ``shuffle``)
    runs inside its backward pass, so its ``map`` counts here without it.

    >>> stacked({"algorithm": "ddp", "time_s": {"map": 0.05, "shuffle": 0.02}})["map"]
    0.030000000000000002
    """
    t = {p: times(summary).get(p) or 0.0 for p in PHASES}
    if summary.get("algorithm") == "ddp":
        t["map"] = max(0.0, t["map"] - t["shuffle"])
    return t


def unaccounted(summary: Mapping) -> float:
    """Seconds of the median step that no phase's median covers: the scheduler's and the
    driver's round trips, waits for the slowest worker, serialisation (never below 0).

    >>> unaccounted({"time_s": {"step_median": 0.1, "map": 0.03, "shuffle": 0.02}})
    0.05
    """
    return max(0.0, times(summary)["step_median"] - sum(stacked(summary).values()))


def phases(summaries: Sequence[Mapping], ax, label=lambda s: str(s["redundancy"])):
    """Median time per step split by phase (stacked bars), one bar per run; what the phases
    do not cover is a segment of its own (:data:`OTHER`), so every bar reaches the step."""
    bottom = np.zeros(len(summaries))
    for phase in PHASES:
        ms = np.array([1e3 * stacked(s)[phase] for s in summaries])
        ax.bar(range(len(summaries)), ms, bottom=bottom, label=phase)
        bottom += ms
    gap = np.array([1e3 * unaccounted(s) for s in summaries])
    ax.bar(
        range(len(summaries)),
        gap,
        bottom=bottom,
        label=OTHER,
        color="0.85",
        hatch="//",
        edgecolor="0.5",
    )
    steps = [1e3 * times(s)["step_median"] for s in summaries]
    ax.plot(range(len(summaries)), steps, "k_", markersize=20, label="step (median)")
    ax.set_xticks(range(len(summaries)), [label(s) for s in summaries])
    ax.set_ylabel("ms per step")
    ax.legend(fontsize="small")
    return ax


def accuracy_vs_time(runs: Mapping[str, str | Path], ax):
    """Test accuracy against training wall time, one line per run directory (under the scale
    model the emulated cluster's time: the wall time over the run's dilation factor)."""
    for name, run_dir in runs.items():
        rows = [r for r in read_history(run_dir) if r["test_accuracy"]]
        tdf = dilation(load_run(run_dir)["summary"] or {})
        ax.plot(
            [float(r["wall_s"]) / tdf for r in rows],
            [float(r["test_accuracy"]) for r in rows],
            "o-",
            label=name,
        )
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize="small")
    return ax


# -- whole figures of one run or one sweep: ``python -m dcoded.plots`` ------------------------

#: The figures of one run (:func:`run_figures`), each written as ``<name>.png``.
RUN_FIGURES = ("loss", "phases", "bytes")
#: The figure of a sweep (:func:`sweep_figure`), written as ``sweep.png``.
SWEEP_FIGURE = "sweep"
#: What :func:`sweep_figure` draws against each swept setting: ``(column of the sweep's
#: table, panel title, y label, whether the y axis starts at 0)``.
SWEEP_METRICS = (
    ("step_ms", "median step", "ms per step", True),
    ("multicast_bytes", "gradient exchange, each message once", "bytes per worker per step", True),
    ("unicast_bytes", "gradient exchange, once per receiver", "bytes per worker per step", True),
    ("test_accuracy", "final test accuracy", "test accuracy", False),
)
#: The counts of ``bytes_per_worker`` that :func:`bytes_figure` draws, with their labels; each
#: beside ``theory_<count>`` where the summary has it.
BYTE_COUNTS = (
    ("multicast", "gradient exchange,\neach message once"),
    ("unicast", "gradient exchange,\nonce per receiver"),
    ("params", "parameters"),
    ("backup", "backup values\n(stragglers)"),
    ("allreduced", "handed to DDP's\nall-reduce"),
    ("wire", "network interface\n(wire)"),
)
#: What the kinds of message that ``transport_by_kind`` and ``dask_transfer_by_kind`` count
#: are; a kind not named here is drawn by its own name.
MESSAGE_KINDS = {
    **{s.kind: s.label for s in SCHEMES.values()},
    "red": "cross-cluster sums",
    "seg": "parameter segments",
    "grad": "gradients to the server",
    "backup": "backup values",
    "ask": "backup requests",
    "notice": "map notices",
}
#: The resolution of the written PNGs.
DPI = 120


def _floats(history: Sequence[Mapping], column: str) -> np.ndarray:
    """One column of ``history.csv`` as floats, ``nan`` where a row has no value.

    >>> _floats([{"a": "0.5"}, {"a": ""}, {}], "a")
    array([0.5, nan, nan])
    """
    return np.array([float(r.get(column) or "nan") for r in history])


def run_history(run_dir: str | Path) -> list[dict]:
    """A run's ``history.csv`` as drawn: the steps that no later attempt did again (a recovery
    marks the steps it redid ``replayed``), none where the run wrote no step."""
    if not (Path(run_dir) / "history.csv").exists():
        return []
    return [r for r in read_history(run_dir) if not r.get("replayed")]


def run_summary(run_dir: str | Path) -> dict:
    """A run's ``summary.json``; ``FileNotFoundError`` saying why where it has none."""
    run = load_run(run_dir)
    if run["summary"] is not None:
        return run["summary"]
    why = "the run did not finish (killed, or still running)"
    if run["status"] == "failed":
        why = "the run failed" + "".join(f": {line}" for line in run["error"].splitlines()[:1])
    raise FileNotFoundError(f"{run_dir} has no summary.json: {why}")


def describe(summary: Mapping) -> str:
    """One line naming a run from its summary: algorithm, layout, model, data, steps.

    >>> describe({"algorithm": "cdc", "n_workers": 4, "redundancy": 2, "group_size": 4,
    ...           "shuffle": "coded", "transport": "direct", "model": "dnn",
    ...           "dataset": "digits", "steps_done": 60, "batch_size": 96})
    'cdc K=4 r=2 g=4 coded via direct, dnn on digits, 60 steps of B=96'
    """
    head = run_name(summary)
    head += (
        f", {summary['model']} on {summary['dataset']}, "
        f"{summary['steps_done']} steps of B={summary['batch_size']}"
    )
    if summary.get("status", "finished") != "finished":
        head += f" ({summary['status']})"
    return head


def _figure(title: str, **kw):
    from matplotlib.figure import Figure

    fig = Figure(layout="constrained", **kw)
    fig.suptitle(title, fontsize="medium")
    return fig


def _whole_steps(axis) -> None:
    """Ticks of ``axis`` at whole steps only."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def _none_drawn(ax, text: str) -> None:
    """``text`` in grey amid ``ax``: why the panel is empty."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def loss_figure(run_dir: str | Path):
    """Training loss and test accuracy against the step and against the training loop's wall
    time (four panels; the test loss beside the training loss at each evaluation). Steps
    count from 1, as the progress bar's do. Returns the ``Figure``."""
    summary, history = run_summary(run_dir), run_history(run_dir)
    fig = _figure(f"{describe(summary)}\n{run_dir}", figsize=(10, 6.5))
    axes = fig.subplots(2, 2, sharex="col", sharey="row")
    steps = _floats(history, "step") + 1
    wall = _floats(history, "wall_s")
    train, test_loss = _floats(history, "train_loss"), _floats(history, "test_loss")
    accuracy = _floats(history, "test_accuracy")
    evaluated, tested = ~np.isnan(accuracy), ~np.isnan(test_loss)
    on = summary.get("evaluated_on", "test")  # "validation" where dataset.validation is set
    for col, (x, xlabel) in enumerate([(steps, "step"), (wall, "training wall time (s)")]):
        top, bottom = axes[0, col], axes[1, col]
        top.plot(x, train, lw=1, label="training loss (the step's batch)")
        if tested.any():
            top.plot(x[tested], test_loss[tested], "o-", ms=4, label=f"{on} loss")
        bottom.plot(x[evaluated], accuracy[evaluated], "o-", ms=4, color="C2")
        if not evaluated.any():
            _none_drawn(bottom, "no evaluation in history.csv")
        top.grid(alpha=0.3)
        bottom.grid(alpha=0.3)
        bottom.set_xlabel(xlabel)
    _whole_steps(axes[1, 0].xaxis)
    axes[0, 0].set_ylabel("loss (cross-entropy)")
    axes[1, 0].set_ylabel(f"accuracy on the {on} set")
    axes[0, 0].set_title("against the step")
    axes[0, 1].set_title("against the training loop's wall time")
    axes[0, 0].legend(fontsize="small")
    if not history:
        _none_drawn(axes[0, 0], "history.csv holds no step")
    return fig


def phase_times(history: Sequence[Mapping]) -> dict[str, np.ndarray]:
    """Each step's time (``step``) and each phase's, in ms per step, for those that some
    step timed above 0 (a phase the algorithm does not have is left out).

    >>> t = phase_times([{"step_s": "0.02", "map_s": "0.01", "encode_s": "0.0"}])
    >>> {k: v.tolist() for k, v in t.items()}
    {'step': [20.0], 'map': [10.0]}
    """
    out = {}
    for name in ("step", *PHASES):
        ms = 1e3 * _floats(history, f"{name}_s")
        if (ms > 0).any():
            out[name] = ms
    return out


def _phase_color(name: str) -> str:
    """The step in black, each phase in its own colour, the same in every run's figure."""
    return "k" if name == "step" else f"C{PHASES.index(name)}"


def _bound_label(summary: Mapping) -> str:
    """What a phase's bound is: the least time on the run's emulated topology.

    >>> _bound_label({"environment": {"netem": {"topology": "bus", "bandwidth_mbit": 100}}})
    'bound: the least time on the emulated bus at 100 Mbit/s'
    """
    net = summary["environment"]["netem"]
    return (
        f"bound: the least time on the emulated {net.get('topology', 'switch')} "
        f"at {net['bandwidth_mbit']:g} Mbit/s"
    )


def phases_figure(run_dir: str | Path):
    """Each phase's time per step: against the step (left, log scale), and its spread over
    the steps (right: median, quartiles, 5th to 95th percentile) beside the phase's bound on
    the run's emulated topology where it ran on one. Returns the ``Figure``."""
    summary, history = run_summary(run_dir), run_history(run_dir)
    times = phase_times(history)
    fig = _figure(f"{describe(summary)}\n{run_dir}", figsize=(11, 5.2))
    left, right = fig.subplots(1, 2, width_ratios=(1.3, 1))
    _phase_lines(left, history, times)
    _phase_spread(right, summary, times)
    return fig


def _phase_lines(ax, history: Sequence[Mapping], times: Mapping[str, np.ndarray]) -> None:
    """The left panel of :func:`phases_figure`: each phase's time against the step."""
    steps = _floats(history, "step") + 1
    for name, ms in times.items():
        ax.plot(steps, ms, label=name, color=_phase_color(name), lw=1.5 if name == "step" else 1)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    _whole_steps(ax.xaxis)
    ax.set_ylabel("ms (log scale)")
    ax.set_title("time per step")
    ax.grid(alpha=0.3, which="both")
    if times:
        ax.legend(
            fontsize="small",
            ncol=len(times),
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            frameon=False,
            handlelength=1.2,
            columnspacing=1.0,
        )
    else:
        _none_drawn(ax, "no step timed in history.csv")


def _phase_spread(ax, summary: Mapping, times: Mapping[str, np.ndarray]) -> None:
    """The right panel of :func:`phases_figure`: each phase's spread over the steps, beside
    its bound where the run was on the emulated network."""
    bounds = {k: v for k, v in phase_bounds(summary).items() if k in PHASES}
    names = list(times)
    for y, name in enumerate(names):
        ms = times[name][~np.isnan(times[name])]
        p5, p25, med, p75, p95 = np.percentile(ms, [5, 25, 50, 75, 95])
        color = _phase_color(name)
        ax.hlines(y, p5, p95, color=color, lw=1)
        ax.barh(y, p75 - p25, left=p25, height=0.5, color=color, alpha=0.35)
        ax.plot([med, med], [y - 0.3, y + 0.3], color=color, lw=2.5)
        ax.annotate(
            f"{med:.2f}",
            (max(p95, 1e3 * bounds.get(name, 0.0)), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize="small",
        )
        if name in bounds:
            ax.plot(
                1e3 * bounds[name],
                y,
                "D",
                mfc="none",
                mec="k",
                ms=8,
                mew=1.5,
                label=None if ax.get_legend_handles_labels()[0] else _bound_label(summary),
            )
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(left=0)
    ax.margins(x=0.15)
    ax.set_xlabel("ms per step")
    ax.set_title(
        "over the steps: median (its value at right),\nquartiles (box), 5th to 95th percentile",
        fontsize="medium",
    )
    ax.grid(alpha=0.3, axis="x")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    if summary.get("algorithm") == "ddp":
        ax.text(
            0.98,
            0.02,
            "ddp: map includes the all-reduce (shuffle)",
            ha="right",
            transform=ax.transAxes,
            fontsize="small",
            color="0.4",
        )


def byte_counts(summary: Mapping) -> list[tuple[str, float | None, float | None]]:
    """``(count, measured, theory)`` per worker per step for each of :data:`BYTE_COUNTS` the
    run has (measured or in closed form); ``None`` where a side is not there.

    >>> byte_counts({"bytes_per_worker": {"multicast": 10.0, "theory_multicast": 9.0,
    ...                                   "params": None, "theory_params": 0.0}})
    [('multicast', 10.0, 9.0), ('params', None, 0.0)]
    """
    b = summary["bytes_per_worker"]
    out = []
    for count, _ in BYTE_COUNTS:
        measured, theory = b.get(count), b.get(f"theory_{count}")
        if measured is not None or theory is not None:
            out.append((count, measured, theory))
    return out


def _thousands(axis) -> None:
    """Tick labels of ``axis`` with thousands separated (``51,678``), at most five."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(5))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def bytes_figure(run_dir: str | Path):
    """Bytes per worker per step: each count measured beside its closed form (left), and
    what the run's transport moved, by kind of message (right, where the summary splits it).
    Returns the ``Figure``."""
    summary = run_summary(run_dir)
    b = summary["bytes_per_worker"]
    by_kind = b.get("transport_by_kind") or b.get("dask_transfer_by_kind") or {}
    fig = _figure(f"{describe(summary)}\n{run_dir}", figsize=(11 if by_kind else 7.5, 4.8))
    axes = fig.subplots(1, 2, width_ratios=(1.6, 1)) if by_kind else [fig.subplots()]
    _byte_counts_panel(axes[0], byte_counts(summary))
    if by_kind:
        _bytes_by_kind(axes[1], by_kind, summary.get("transport"))
    return fig


def _byte_counts_panel(ax, counts: Sequence[tuple]) -> None:
    """The left panel of :func:`bytes_figure`: each of ``counts`` (:func:`byte_counts`)
    measured beside its closed form."""
    top = max([v for _, m, t in counts for v in (m, t) if v is not None] or [1.0]) or 1.0
    _byte_count_bars(ax, counts, top)
    labels = dict(BYTE_COUNTS)
    ax.set_yticks(range(len(counts)), [labels[c] for c, _, _ in counts])
    ax.set_ylim(len(counts) - 0.5, -0.5)
    ax.set_xlim(0, 1.65 * top)
    _thousands(ax.xaxis)
    ax.set_xlabel("bytes per worker per step (mean over the steps)")
    ax.set_title("measured beside the closed form")
    ax.grid(alpha=0.3, axis="x")
    handles, names = ax.get_legend_handles_labels()
    if handles:  # measured first, whichever side the first count drew
        order = sorted(range(len(names)), key=lambda i: names[i] != "measured")
        ax.legend(
            [handles[i] for i in order],
            [names[i] for i in order],
            fontsize="small",
            loc="lower right",
        )


def _byte_count_bars(ax, counts: Sequence[tuple], top: float) -> None:
    """A bar for each side of each count, its value beside it (and the measured one's ratio to
    the closed form); where a side is missing, a grey note says so (``top``: the longest bar,
    which places the notes)."""
    labelled = set()
    for y, (_, measured, theory) in enumerate(counts):
        for dy, value, side, color in [
            (-0.2, measured, "measured", "C0"),
            (0.2, theory, "closed form", "C1"),
        ]:
            if value is None:
                ax.text(
                    0.01 * top,
                    y + dy,
                    "not measured" if side == "measured" else "no closed form",
                    va="center",
                    fontsize="small",
                    color="0.4",
                )
                continue
            ax.barh(
                y + dy, value, height=0.4, color=color, label=None if side in labelled else side
            )
            labelled.add(side)
            text = f"{value:,.0f}"
            if side == "measured" and theory:
                text += f" ({value / theory:.4f} × the closed form)"
            ax.annotate(
                text,
                (value, y + dy),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize="small",
            )


def _bytes_by_kind(ax, by_kind: Mapping[str, float], transport: str | None) -> None:
    """The right panel of :func:`bytes_figure`: what ``transport`` moved (Dask, where none
    is named), by kind of message."""
    kinds = list(by_kind)
    ax.barh(range(len(kinds)), [by_kind[k] for k in kinds], height=0.5, color="C2")
    for y, k in enumerate(kinds):
        ax.annotate(
            f"{by_kind[k]:,.0f}",
            (by_kind[k], y),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize="small",
        )
    ax.set_yticks(range(len(kinds)), [f"{MESSAGE_KINDS.get(k, k)}\n({k})" for k in kinds])
    ax.set_ylim(len(kinds) - 0.5, -0.5)
    ax.set_xlim(0, 1.35 * max(by_kind.values()) or 1.0)
    _thousands(ax.xaxis)
    ax.set_xlabel("bytes per worker per step")
    moved = f"moved by transport={transport}" if transport else "Dask transfers"
    ax.set_title(f"{moved}, by kind")
    ax.grid(alpha=0.3, axis="x")


def run_figures(run_dir: str | Path) -> dict:
    """Every figure of one run: ``{name: Figure}`` for each of :data:`RUN_FIGURES`."""
    draw = {"loss": loss_figure, "phases": phases_figure, "bytes": bytes_figure}
    return {name: draw[name](run_dir) for name in RUN_FIGURES}


def _label(value) -> str:
    return "-" if value is None else str(value)


def _numeric(values) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _under(i: int, n: int) -> dict:
    """The style of the ``i``-th of ``n`` lines that may coincide: each drawn wider and paler
    than the next, so that an equal line drawn over it leaves it showing.

    >>> _under(0, 3)["lw"], _under(2, 3)["lw"]
    (5.5, 1.5)
    """
    below = min(n - 1 - i, 4)
    return {"lw": 1.5 + 2 * below, "ms": 4 + 2 * below, "alpha": 0.55 if below else 1.0}


def sweep_figure(sweep_dir: str | Path):
    """The sweep's table (:func:`dcoded.results.sweep_table`) drawn: each of
    :data:`SWEEP_METRICS` (columns) against each setting the sweep varied (rows), one line
    per value of the other settings; over seeds (``train.seed``), the mean with the standard
    deviation across them. Jobs without a summary (failed, killed) are left out and counted
    in the title; ``FileNotFoundError`` where no job has one. Returns the ``Figure``."""
    jobs = load_sweep(sweep_dir)
    rows, _ = sweep_table(jobs)
    done = [r for r, j in zip(rows, jobs, strict=True) if j["summary"] is not None]
    keys = varying([j for j in jobs if j["summary"] is not None])
    if not done:
        raise FileNotFoundError(f"{sweep_dir} holds no job with a summary.json: nothing to draw")
    xs = [k for k in keys if k != SEED] or keys or ["job"]
    left_out = len(rows) - len(done)
    title = f"sweep {sweep_dir}: {len(rows)} job{'s' * (len(rows) != 1)}"
    if left_out:
        title += f" ({left_out} without summary.json: not drawn)"
    if SEED in keys and SEED not in xs:
        title += f"; mean and standard deviation over {SEED}"
    fig = _figure(title, figsize=(3.6 * len(SWEEP_METRICS), 3.2 * len(xs) + 0.6))
    axes = np.atleast_2d(fig.subplots(len(xs), len(SWEEP_METRICS), squeeze=False))
    for i, key in enumerate(xs):
        against = _Against.of(key, [k for k in keys if k not in (key, SEED)], done)
        for col, (metric, heading, ylabel, from_zero) in enumerate(SWEEP_METRICS):
            _sweep_panel(axes[i, col], against, metric, heading, ylabel, from_zero)
        if against.others:
            axes[i, -1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1))
    return fig


@dataclass
class _Against:
    """The finished jobs' rows of a sweep's table as :func:`sweep_figure` draws them against
    one swept setting (``key``): its values in the order along x (sorted where they are all
    numbers), each one's x (``position``, by its ``repr``), and the rows grouped by the
    ``others`` settings (the seed apart), one line per group."""

    key: str
    others: list[str]
    values: list
    numeric: bool
    position: dict[str, object]
    groups: dict[tuple, list[dict]]

    @classmethod
    def of(cls, key: str, others: list[str], done: Sequence[Mapping]) -> _Against:
        values = list(dict.fromkeys(r[key] for r in done))
        numeric = _numeric(values)
        if numeric:
            values = sorted(values)
        position = {repr(v): (v if numeric else j) for j, v in enumerate(values)}
        groups: dict[tuple, list[dict]] = {}
        for r in done:
            groups.setdefault(tuple(repr(r[k]) for k in others), []).append(r)
        return cls(key, others, values, numeric, position, groups)

    def points(self, mine: Sequence[Mapping], metric: str) -> tuple[list, list, list]:
        """``(x, y, err)`` of one group's line: at each value of the setting where some row
        has ``metric``, the mean over those rows and their standard deviation (0 for one).

        >>> a = _Against.of("r", [], [{"r": 2, "m": 1.0}, {"r": 1, "m": 3.0}, {"r": 1, "m": 5.0}])
        >>> a.points(next(iter(a.groups.values())), "m")
        ([1, 2], [4.0, 1.0], [1.4142135623730951, 0.0])
        """
        x, y, err = [], [], []
        for v in self.values:
            here = [r[metric] for r in mine if repr(r[self.key]) == repr(v)]
            here = [m for m in here if m is not None]
            if here:
                x.append(self.position[repr(v)])
                y.append(float(np.mean(here)))
                err.append(float(np.std(here, ddof=1)) if len(here) > 1 else 0.0)
        return x, y, err


def _sweep_panel(
    ax, against: _Against, metric: str, heading: str, ylabel: str, from_zero: bool
) -> None:
    """One panel of :func:`sweep_figure`: ``metric`` against the setting, a line per group."""
    drawn = False
    for g, mine in enumerate(against.groups.values()):
        x, y, err = against.points(mine, metric)
        drawn = drawn or bool(x)
        label = ", ".join(f"{k}={_label(mine[0][k])}" for k in against.others) or None
        ax.errorbar(
            x,
            y,
            yerr=err if any(err) else None,
            fmt="o-",
            capsize=3,
            color=f"C{g}",
            label=label,
            **_under(g, len(against.groups)),
        )
    if not against.numeric:
        ax.set_xticks(range(len(against.values)), [_label(v) for v in against.values])
    elif all(isinstance(v, int) for v in against.values):
        ax.set_xticks(against.values)
    ax.set_xlabel(against.key)
    ax.set_ylabel(ylabel)
    ax.set_title(heading, fontsize="medium")
    ax.grid(alpha=0.3)
    if from_zero:
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1e-9))
    if metric.endswith("_bytes"):
        _thousands(ax.yaxis)
    if not drawn:
        _none_drawn(ax, "not measured")


def comparison(rows: Sequence[Mapping], axes):
    """The first comparison's runs beside the closed forms (two ``Axes``), from
    :func:`dcoded.compare.rows`: each run's median step (its interquartile range as the error
    bar) with the least time its exchange needs on the links (the bound) and the step
    ``dcoded.predict`` predicts; and the gradient exchange's bytes a worker sent per step
    beside the closed form's. On loopback there is no bound to draw."""
    _steps_beside_bounds(rows, axes[0])
    ax, x = axes[1], np.arange(len(rows))
    sent = [np.nan if r.get("sent_B") is None else r["sent_B"] for r in rows]
    theory = [np.nan if r.get("theory_B") is None else r["theory_B"] for r in rows]
    ax.bar(x - 0.2, sent, 0.4, label="sent (measured)")
    ax.bar(x + 0.2, theory, 0.4, label="theory (closed form)", color="0.6")
    ax.set_xticks(x, [r["run"] for r in rows], rotation=20, ha="right")
    ax.set_ylabel("bytes per worker per step")
    ax.set_title("gradient exchange (DDP's ring: theory only)")
    _thousands(ax.yaxis)
    ax.legend(fontsize="small")
    return axes


def _steps_beside_bounds(rows: Sequence[Mapping], ax) -> None:
    """Each run's median step (bar, p25-p75), its bound and its predicted step (markers)."""
    x = np.arange(len(rows))
    step = np.array([r["step_ms"] for r in rows], dtype=float)
    low = np.array([r.get("p25_ms") or r["step_ms"] for r in rows], dtype=float)
    high = np.array([r.get("p75_ms") or r["step_ms"] for r in rows], dtype=float)
    spread = [step - low, high - step]
    ax.bar(x, step, yerr=spread, ecolor="0.4", color="C0", label="measured (median, p25-p75)")
    for column, marker, name in (
        ("comm_bound_ms", "C1_", "bound: the exchange's bytes at the links' rate"),
        ("predicted_ms", "C3x", "predicted (dcoded.predict)"),
    ):
        values = [r.get(column) for r in rows]
        if any(v is not None for v in values):
            ys = [np.nan if v is None else v for v in values]
            wide = marker.endswith("_")
            ax.plot(x, ys, marker, markersize=24 if wide else 8, mew=3 if wide else 2, label=name)
    ax.set_xticks(x, [r["run"] for r in rows], rotation=20, ha="right")
    ax.set_ylabel("ms per step")
    bound = any(r.get("comm_bound_ms") is not None for r in rows)
    ax.set_title("time per step" + ("" if bound else " (no emulated link: no bound)"))
    ax.legend(fontsize="small")


def save(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (made new, :func:`dcoded.files.create`)."""
    from dcoded import files

    path.parent.mkdir(parents=True, exist_ok=True)
    with files.create(path, "wb") as f:
        fig.savefig(f, format="png", dpi=DPI)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcoded.plots RUN_DIR|SWEEP_DIR [--out DIR] [--runs]``: write the figures
    of one run, or of a sweep, as PNGs, and print their paths. Exits 2 with one line where
    the folder holds neither a run with ``summary.json`` nor a sweep with a finished job."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dcoded.plots",
        description=(
            "Write the figures of one run or of a sweep as PNGs and print their paths. "
            f"A run's folder: {', '.join(f'{n}.png' for n in RUN_FIGURES)} (loss and test "
            "accuracy against the step and the wall time; each phase's time per step beside "
            "its bound; bytes per worker per step beside the closed forms). A sweep's folder "
            f"(a multirun's hydra.sweep.dir): {SWEEP_FIGURE}.png (time per step, bytes and "
            "final accuracy against each swept setting). Exit status: 0, or 2 where the "
            "folder holds neither."
        ),
    )
    parser.add_argument("path", type=Path, metavar="PATH", help="one run's folder, or a sweep's")
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="where to write (default: PATH/plots)"
    )
    parser.add_argument(
        "--runs",
        action="store_true",
        help="a sweep: also the figures of each job that has a "
        "summary.json, each into DIR/<job folder>/",
    )
    args = parser.parse_args(argv)
    where: Path = args.path
    out: Path = args.out or where / "plots"
    written = []
    try:
        if not where.is_dir():
            raise FileNotFoundError(f"{where} is not a folder")
        if is_run_folder(where):
            for name, fig in run_figures(where).items():
                written.append(save(fig, out / f"{name}.png"))
        else:
            jobs = load_sweep(where)
            if not jobs:
                raise FileNotFoundError(
                    f"{where} holds no run: give one run's folder (with summary.json) or a "
                    "multirun's (hydra.sweep.dir)"
                )
            written.append(save(sweep_figure(where), out / f"{SWEEP_FIGURE}.png"))
            for job in jobs if args.runs else ():
                if job["summary"] is None:
                    print(f"{job['dir']}: {job['status']}, no figures", file=sys.stderr)
                    continue
                for name, fig in run_figures(job["dir"]).items():
                    written.append(save(fig, out / job["dir"].name / f"{name}.png"))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
