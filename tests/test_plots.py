"""The shared figures draw what the numbers say: no line hidden under another, phase bars
that account for the whole step, and ``python -m dcoded.plots`` drawing a run's and a sweep's
files as they are."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.image
import matplotlib.pyplot as plt

from dcoded import plots
from dcoded.results import load_sweep, read_history, sweep_table
from dcoded.run import run
from tests.conftest import tiny_config


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


def test_a_scale_model_runs_phases_and_accuracy_are_drawn_in_the_clusters_time(ax, tmp_path):
    """Under the scale model ``time_s`` holds the wall times, TDF times the cluster's: the
    phase bars and the accuracy axis are the cluster's (undilated) times, as the console's."""
    cluster = _summary(0.100, map=0.03, shuffle=0.02)
    dilated = {
        **cluster,
        "time_s": {k: 5 * v for k, v in cluster["time_s"].items()},
        "time_s_undilated": cluster["time_s"],
        "scale_model": {"tdf": 5.0},
    }
    assert plots.stacked(dilated) == plots.stacked(cluster)
    assert plots.unaccounted(dilated) == pytest.approx(plots.unaccounted(cluster))
    (tmp_path / "summary.json").write_text(json.dumps({"status": "finished", **dilated}))
    (tmp_path / "history.csv").write_text("step,wall_s,test_accuracy\n0,5.0,0.5\n1,10.0,0.7\n")
    plots.accuracy_vs_time({"run": tmp_path}, ax)
    assert list(ax.get_lines()[0].get_xdata()) == pytest.approx([1.0, 2.0])


# -- python -m dcoded.plots: a run's and a sweep's figures, from the files the runs wrote ----


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """One real tiny run's folder (two evaluations)."""
    out = tmp_path_factory.mktemp("run")
    run(tiny_config("train.steps=6", "train.eval_every=3"), out_dir=out)
    return out


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory) -> Path:
    """A sweep folder as a multirun leaves it: two real tiny runs over ``coding.redundancy``
    and a job that failed."""
    sweep = tmp_path_factory.mktemp("sweep")
    for num, r in enumerate((1, 2)):
        job = sweep / f"{num}-coding.redundancy={r}"
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- coding.redundancy={r}\n")
        (job / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {num}\n")
        (job / ".hydra" / "config.yaml").write_text(f"coding:\n  redundancy: {r}\n")
        run(tiny_config("train.steps=4", f"coding.redundancy={r}"), out_dir=job)
    failed = sweep / "2-coding.redundancy=9"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text("- coding.redundancy=9\n")
    (failed / "error.txt").write_text("coding.redundancy=9 is not allowed\n")
    return sweep


def _column(history: list[dict], name: str) -> list[float]:
    return [float(r[name]) for r in history if r[name] != ""]


def _is_drawn_image(path: Path, fig) -> None:
    """``path`` is a PNG of ``fig``'s size that is not blank."""
    image = matplotlib.image.imread(path)
    height, width = round(fig.get_figheight() * plots.DPI), round(fig.get_figwidth() * plots.DPI)
    assert image.shape[:2] == (height, width) and image.shape[2] in (3, 4)
    ink = (image[..., :3] < 0.9).any(axis=-1)  # pixels that are not white
    assert 0.02 < ink.mean() < 0.6, ink.mean()


def test_a_runs_figures_are_written_as_images_and_their_paths_printed(tiny_run, tmp_path, capsys):
    assert plots.main([str(tiny_run), "--out", str(tmp_path / "figs")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [str(tmp_path / "figs" / f"{n}.png") for n in plots.RUN_FIGURES]
    for name, fig in plots.run_figures(tiny_run).items():
        _is_drawn_image(tmp_path / "figs" / f"{name}.png", fig)
    assert plots.main([str(tiny_run)]) == 0  # by default into the run's own folder
    assert sorted(p.name for p in (tiny_run / "plots").iterdir()) == sorted(
        f"{n}.png" for n in plots.RUN_FIGURES
    )


def test_the_loss_figure_draws_history_csv(tiny_run):
    history = read_history(tiny_run)
    fig = plots.loss_figure(tiny_run)
    by_step, by_time, accuracy_by_step, accuracy_by_time = fig.axes
    train = {line.get_label(): line for line in by_step.get_lines()}
    assert train["test loss"].get_ydata().tolist() == _column(history, "test_loss")
    line = train["training loss (the step's batch)"]
    assert line.get_ydata().tolist() == _column(history, "train_loss")
    assert line.get_xdata().tolist() == [int(r["step"]) + 1 for r in history]
    assert by_time.get_lines()[0].get_xdata().tolist() == _column(history, "wall_s")
    evaluated = [r for r in history if r["test_accuracy"]]
    assert len(evaluated) == 2
    for ax, x in [(accuracy_by_step, "step"), (accuracy_by_time, "wall_s")]:
        (acc,) = ax.get_lines()
        assert acc.get_ydata().tolist() == _column(evaluated, "test_accuracy")
        shift = 1 if x == "step" else 0
        assert acc.get_xdata().tolist() == [float(r[x]) + shift for r in evaluated]
    assert fig.axes[0].get_ylabel() and fig.axes[2].get_xlabel() == "step"


def test_the_phase_figure_draws_each_steps_phases_and_their_medians(tiny_run):
    history = read_history(tiny_run)
    summary = json.loads((tiny_run / "summary.json").read_text())
    fig = plots.phases_figure(tiny_run)
    per_step, spread = fig.axes
    drawn = {line.get_label(): line.get_ydata().tolist() for line in per_step.get_lines()}
    assert {"step", "map", "shuffle", "params"} <= set(drawn)
    for name, ms in drawn.items():
        assert ms == pytest.approx([1e3 * v for v in _column(history, f"{name}_s")], rel=1e-12)
    medians = {t.get_text() for t in spread.texts}
    summary_ms = {"step": summary["time_s"]["step_median"], **summary["time_s"]}
    assert medians == {f"{1e3 * summary_ms[name]:.2f}" for name in drawn}
    assert [t.get_text() for t in spread.get_yticklabels()] == list(drawn)
    assert not [line for line in spread.get_lines() if line.get_marker() == "D"]  # no netem


def test_a_phase_is_drawn_beside_its_bound_on_the_emulated_topology(tiny_run, tmp_path):
    """A run on ``cluster=netem`` records its network: each exchange phase's bound is drawn."""
    from dcoded.topology import phase_bounds

    shutil.copytree(tiny_run, tmp_path / "run", ignore=shutil.ignore_patterns("plots"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary["environment"]["netem"] = {"topology": "switch", "bandwidth_mbit": 100}
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    spread = plots.phases_figure(tmp_path / "run").axes[1]
    marks = [line for line in spread.get_lines() if line.get_marker() == "D"]
    bounds = phase_bounds(summary)
    assert [m.get_xdata()[0] for m in marks] == [1e3 * bounds["shuffle"], 1e3 * bounds["params"]]
    rows = [t.get_text() for t in spread.get_yticklabels()]
    assert [rows[round(m.get_ydata()[0])] for m in marks] == ["shuffle", "params"]
    assert "100 Mbit/s" in spread.get_legend().get_texts()[0].get_text()


def test_the_bytes_figure_draws_each_count_beside_its_closed_form(tiny_run):
    b = json.loads((tiny_run / "summary.json").read_text())["bytes_per_worker"]
    counts, by_kind = plots.bytes_figure(tiny_run).axes
    widths = [bar.get_width() for bar in counts.patches]
    assert widths == [b[k] for c in ("multicast", "unicast", "params") for k in (c, f"theory_{c}")]
    assert [t.get_text() for t in counts.get_legend().get_texts()] == ["measured", "closed form"]
    assert [bar.get_width() for bar in by_kind.patches] == list(b["transport_by_kind"].values())


def test_a_sweeps_figure_draws_its_table_against_the_swept_setting(tiny_sweep, tmp_path, capsys):
    out = tmp_path / "figs"
    assert plots.main([str(tiny_sweep), "--out", str(out), "--runs"]) == 0
    captured = capsys.readouterr()
    jobs = ["0-coding.redundancy=1", "1-coding.redundancy=2"]
    assert captured.out.splitlines() == [
        str(out / "sweep.png"),
        *(str(out / job / f"{n}.png") for job in jobs for n in plots.RUN_FIGURES),
    ]
    assert "2-coding.redundancy=9: failed, no figures" in captured.err
    fig = plots.sweep_figure(tiny_sweep)
    _is_drawn_image(out / "sweep.png", fig)
    assert "3 jobs (1 without summary.json: not drawn)" in fig.texts[0].get_text()
    rows, _ = sweep_table(load_sweep(tiny_sweep))
    for ax, (metric, *_) in zip(fig.axes, plots.SWEEP_METRICS, strict=True):
        (line,) = ax.get_lines()
        assert ax.get_xlabel() == "coding.redundancy"
        assert line.get_xdata().tolist() == [1, 2]
        assert line.get_ydata().tolist() == [r[metric] for r in rows[:2]]


def test_a_folder_without_a_run_is_refused_in_one_line(tmp_path, capsys):
    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "error.txt").write_text("coding.redundancy=9 is not allowed\nmore\n")
    (tmp_path / "empty").mkdir()
    for where, why in [
        (failed, "has no summary.json: the run failed: coding.redundancy=9 is not allowed"),
        (tmp_path / "empty", "holds no run"),
        (tmp_path / "nowhere", "is not a folder"),
    ]:
        assert plots.main([str(where)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured.err
        assert captured.err.startswith(f"error: {where} ") and why in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "failed"]  # nothing written
    done = subprocess.run(
        [sys.executable, "-m", "dcoded.plots", str(failed)], capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stderr.startswith("error: ") and not done.stdout
