"""``paper/``: every experiment's sweep composes into valid runs at both sizes, and the two
stages, run for real on a small local cluster, give tables that agree with the runs' own
summaries and with the closed forms."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from dcoded.coding import load_table
from dcoded.config import CONFIG_DIR, build_spec, compose_config
from paper import paths, report, table_time
from paper.sweep import split_overrides
from paper.table_time import reduction

ROOT = Path(__file__).resolve().parent.parent


def sweep_jobs(experiment: str, size: str) -> list[list[str]]:
    """The override lists of every job of the experiment's multirun, as Hydra expands them."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "config", [f"experiment={experiment}", f"size={size}"], return_hydra_config=True
        )
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    jobs = [[]]
    for o in parsed:
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
        jobs = [[*job, f"{o.get_key_element()}={v}"] for job in jobs for v in values]
    return [[f"experiment={experiment}", f"size={size}", *job] for job in jobs]


@pytest.mark.parametrize("size", paths.SIZES)
@pytest.mark.parametrize("experiment", list(paths.EXPERIMENTS))
def test_every_job_of_every_sweep_is_a_valid_run(experiment, size):
    jobs = sweep_jobs(experiment, size)
    assert len(jobs) >= 4
    for job in jobs:
        build_spec(compose_config(job))  # raises ConfigError on anything impossible


def test_the_sweeps_cover_what_the_results_need():
    def values(experiment, key):
        return {
            o.split("=", 1)[1]
            for job in sweep_jobs(experiment, "small")
            for o in job
            if o.startswith(f"{key}=")
        }

    assert values("paper_time", "algorithm") == {"ssgd", "asgd", "ddp"}
    assert values("paper_time", "model") == values("paper_phases", "model") == {"dnn", "cnn"}
    assert values("paper_phases", "coding.redundancy") == {"1", "2", "3", "4"}
    assert values("paper_loads", "coding.shuffle") == {"coded", "uncoded"}
    assert values("paper_accuracy", "algorithm") == {"ssgd", "asgd", "ddp", "cdc"}
    assert values("paper_accuracy", "model") == {"dnn", "cnn"}  # Figure 4 showed the DNN only
    assert len(values("paper_bandwidth", "cluster.bandwidth_mbit")) >= 3
    # Table 1 sets paper_time's baselines beside paper_phases' cdc: same conditions
    time, phases = (compose_config([f"experiment={e}"]) for e in ("paper_time", "paper_phases"))
    for key in ("cluster", "dataset", "train", "optimizer"):
        assert time[key] == phases[key]


def test_full_size_is_one_override():
    small = compose_config(["experiment=paper_time"])
    full = compose_config(["experiment=paper_time", "size=full"])
    assert full.dataset.n_samples == 60000 and full.train.epochs == 1
    assert (small.dataset.n_samples, small.train.epochs) != (60000, 1)
    assert compose_config(["size=full"]) == compose_config([])  # no experiment: no change


def test_overrides_for_one_experiment():
    shared, own = split_overrides(["model=dnn", "paper_phases:coding.redundancy=1,2", "x=a:b"])
    assert shared == ["model=dnn", "x=a:b"]
    assert own == {"paper_phases": ["coding.redundancy=1,2"]}
    with pytest.raises(SystemExit, match="no experiment"):
        split_overrides(["paper_typo:train.steps=3"])


def test_reductions_and_verdicts():
    assert reduction(46.03, 100.0) == pytest.approx(53.97)
    assert reduction(120.0, 100.0) == pytest.approx(-20.0)
    assert "does not hold" in report.verdict(-3.0, 26.89)
    assert report.verdict(50.0, 53.97).startswith("**holds**,")
    assert "smaller" in report.verdict(10.0, 53.97)
    assert "larger" in report.verdict(80.0, 26.89)


def _fake_sweep(results: Path, experiment: str, summaries: list[dict]) -> None:
    """What stage 1 leaves: a finished sweep of these summaries, one job folder each."""
    where = paths.sweep_dir(results, "small", experiment)
    for num, summary in enumerate(summaries):
        (where / f"{num}-job").mkdir(parents=True)
        (where / f"{num}-job" / "summary.json").write_text(json.dumps(summary))
    (where / "complete.json").write_text(json.dumps({"jobs": len(summaries)}))


def _timed(model: str, algorithm: str, total: float, r: int | None = None) -> dict:
    """A summary with what Table 1 and its report read."""
    step = {"step_median": total / 40, "map": 0.01, "shuffle": 0.01, "params": 0.01}
    return {
        "model": model,
        "algorithm": algorithm,
        "redundancy": r,
        "shuffle": "coded" if r else None,
        "n_workers": 4,
        "n_params": 1000,
        "time_s": {"total": total, **step},
        "bytes_per_worker": {"unicast": 4000.0},
        "environment": {},
    }


def test_the_verdict_rests_on_coding_in_play_not_on_r_1_or_r_K(tmp_path):
    """REPORT.md said "holds, and the saving is larger than the paper's" where the fastest
    cdc was r = K = 4 (the DNN) or r = 1 (the CNN): runs where nothing is coded."""
    baselines = [("ssgd", 100.0), ("asgd", 90.0), ("ddp", 20.0)]
    _fake_sweep(
        tmp_path,
        "paper_time",
        [_timed(m, a, t) for m in ("dnn", "cnn") for a, t in baselines],
    )
    cdc = {"dnn": [50.0, 80.0, 95.0, 30.0], "cnn": [60.0, 110.0, 120.0, 70.0]}  # r = 1..4
    _fake_sweep(
        tmp_path,
        "paper_phases",
        [_timed(m, "cdc", t, r) for m in cdc for r, t in enumerate(cdc[m], start=1)],
    )
    dnn, cnn = table_time.compute(tmp_path, "small")
    assert (dnn["coded_best_r"], dnn["coded_s"], cnn["coded_best_r"]) == (2, 80.0, 2)
    assert dnn["less_than_ssgd_pct"] == pytest.approx(20.0)
    assert (dnn["r1_s"], dnn["rK_s"]) == (50.0, 30.0)
    text = report.result_time(tmp_path, "small")
    dnn_part, cnn_part = text.split("**CNN**")
    assert "against SSGD: 20.0% less time here" in dnn_part
    assert "holds in direction**, but the saving is smaller" in dnn_part
    assert "r = 1 and r = 4 are faster than any coded r here" in dnn_part
    assert "against SSGD: 10.0% *more* time here" in cnn_part and "does not hold" in cnn_part
    assert "larger than the paper's" not in text


def test_every_figure_is_embedded_once():
    figures = [f for *_, embedded in report.SECTIONS for f in embedded]
    assert len(figures) == len(set(figures))


def _paper(stage: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"paper.{stage}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_drawing_without_results_says_what_to_run(tmp_path):
    result = _paper("draw", "--results", str(tmp_path / "none"), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "python -m paper.sweep" in result.stderr
    text = (tmp_path / "out" / "REPORT.md").read_text()
    assert text.count("not run") == 6  # one per section


def test_a_bad_mnist_folder_fails_before_any_run(tmp_path):
    result = _paper("sweep", "--mnist", str(tmp_path), "--results", str(tmp_path / "results"))
    assert result.returncode != 0 and "train-images-idx3-ubyte" in result.stderr
    assert not (tmp_path / "results").exists()


# Small enough for a test: 3 workers, a tiny DNN, 4 steps, r in {1, 2}, on cluster=local.
SMALL = [
    "model=dnn",
    "model.hidden=[16]",
    "cluster.n_workers=3",
    "dataset.n_samples=600",
    "dataset.n_test=100",
    "train.batch_size=24",
    "train.steps=4",
    "paper_accuracy:train.eval_every=2",
    "paper_phases:coding.redundancy=1,2",
    "paper_loads:coding.redundancy=1,2",
]


def _stage1(results: Path) -> subprocess.CompletedProcess:
    args = ["--cluster", "local", "--results", str(results), "--", *SMALL]
    return _paper("sweep", *args, timeout=900)


def _summaries(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]


def _csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_both_stages_end_to_end_on_a_local_cluster(tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    first = _stage1(results)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    small = results / "small"
    counts = {e: len(_summaries(small / e)) for e in paths.EXPERIMENTS}
    assert counts == {
        "paper_time": 3,
        "paper_phases": 2,
        "paper_loads": 4,
        "paper_accuracy": 4,
        "paper_bandwidth": 0,
        "paper_topology": 0,
        "paper_topology_base": 0,
    }
    for netem_only in paths.NEEDS_NETEM:
        assert (small / netem_only / "skipped.json").exists()
    meta = json.loads((small / "paper_time" / "complete.json").read_text())
    assert meta["cluster"] == "local" and meta["jobs"] == 3 and "synthetic" in meta["data"]

    # stage 1 again: every finished sweep is kept as it is
    stamp = {p: p.stat().st_mtime_ns for p in small.glob("*/*/summary.json")}
    again = _stage1(results)
    assert again.returncode == 0 and again.stdout.count("finished earlier, kept") == 4
    assert {p: p.stat().st_mtime_ns for p in small.glob("*/*/summary.json")} == stamp

    before = {p: p.stat().st_mtime_ns for p in results.rglob("*") if p.is_file()}
    drawn = _paper("draw", "--results", str(results), "--out", str(out), timeout=300)
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in results.rglob("*") if p.is_file()} == before
    for name in ("fig2_loads", "fig3_phases", "fig4_accuracy"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 10_000
    assert not (out / "figures" / "fig5_bandwidth.png").exists()
    assert not (out / "figures" / "fig6_topology.png").exists()

    # Table 1 against the runs' own summaries
    runs = _summaries(small / "paper_time") + _summaries(small / "paper_phases")
    ssgd = next(s for s in runs if s["algorithm"] == "ssgd")["time_s"]["total"]
    asgd = next(s for s in runs if s["algorithm"] == "asgd")["time_s"]["total"]
    by_r = {s["redundancy"]: s for s in runs if s["algorithm"] == "cdc"}
    cdc = by_r[2]  # the only r with coding in play at K = 3 (r = 1 codes nothing)
    (row,) = _csv(out / "tables" / "table1_training_time.csv")
    assert int(row["coded_best_r"]) == 2
    assert float(row["coded_s"]) == cdc["time_s"]["total"]
    assert float(row["r1_s"]) == by_r[1]["time_s"]["total"] and row["rK_s"] == ""
    assert float(row["less_than_ssgd_pct"]) == pytest.approx(
        100 * (ssgd - cdc["time_s"]["total"]) / ssgd
    )
    assert float(row["less_than_asgd_pct"]) == pytest.approx(
        100 * (asgd - cdc["time_s"]["total"]) / asgd
    )
    assert float(row["paper_less_than_ssgd_pct"]) == 53.97

    # Figure 2's table against the closed forms: the transport moved the shuffle plus the
    # all-gather
    for r in _csv(out / "tables" / "fig2_loads.csv"):
        if not r["r"]:
            continue
        t = load_table(3)[int(r["r"]) - 1]
        shuffle = t["coded_uc"] if r["shuffle"] == "coded" else t["uncoded_uc"]
        assert float(r["theory_sent_d"]) == pytest.approx(shuffle + t["allgather_uc"])
        assert float(r["moved_d"]) == pytest.approx(float(r["theory_sent_d"]), rel=0.01)

    # Figure 4: the synchronous algorithms reach the same accuracy, as the report says
    acc = {r["run"]: float(r["test_accuracy"]) for r in _csv(out / "tables" / "fig4_accuracy.csv")}
    assert set(acc) == {"ssgd", "asgd", "ddp", "cdc r=2"}
    assert abs(acc["cdc r=2"] - acc["ssgd"]) <= 0.01

    text = (out / "REPORT.md").read_text()
    assert "local Dask cluster" in text and "synthetic, MNIST-sized" in text
    assert "53.97%" in text and "not run: `paper_bandwidth`" in text
    assert "coding in play: cdc at r = 2" in text
    assert text.count("](figures/fig3_phases.png)") == 1
