"""Reading results: a sweep's jobs, one table of them (``dcoded.results``), and a multirun
that goes on past a bad job and ends with that table in its folder."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dcoded.results import load_sweep, sweep_table, write_sweep_table
from tests.conftest import TINY

ROOT = Path(__file__).resolve().parent.parent


def _job(sweep: Path, num: int, overrides: list[str], summary=None, error=None) -> Path:
    """A job folder as Hydra and the app leave it."""
    folder = sweep / f"{num}-{','.join(overrides)}"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (folder / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {num}\n")
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    if error is not None:
        (folder / "error.txt").write_text(error + "\n")
    return folder


def _summary(step_s: float, accuracy: float, status: str = "finished") -> dict:
    return {
        "status": status,
        "time_s": {"step_median": step_s, "total": 40 * step_s},
        "bytes_per_worker": {
            "unicast": 1000.0,
            "multicast": 500.0,
            "params": 2000.0,
            "dask_transfer": 3000.0,
        },
        "final": {"test_accuracy": accuracy},
    }


def test_a_sweep_is_read_in_job_order_with_what_each_job_left(tmp_path):
    # job 10 sorts before job 2 by name: the order must come from Hydra's job number
    _job(tmp_path, 10, ["model=dnn", "coding.redundancy=3"], _summary(0.1, 0.9))
    _job(tmp_path, 2, ["model=dnn", "coding.redundancy=5"], error="coding.redundancy=5 bad")
    _job(tmp_path, 1, ["model=dnn", "coding.redundancy=2"], _summary(0.2, 0.8, "interrupted"))
    _job(tmp_path, 0, ["model=dnn", "coding.redundancy=1"])  # killed: left nothing
    (tmp_path / "netem-4-workers").mkdir()  # a shared emulated cluster's logs: not a job
    jobs = load_sweep(tmp_path)
    assert [j["job"] for j in jobs] == [0, 1, 2, 10]
    assert [j["status"] for j in jobs] == ["missing", "interrupted", "failed", "finished"]
    assert jobs[2]["error"] == "coding.redundancy=5 bad"
    assert jobs[3]["overrides"] == {"model": "dnn", "coding.redundancy": "3"}


def test_the_table_has_the_overrides_that_vary_and_each_jobs_numbers(tmp_path):
    _job(tmp_path, 0, ["model=dnn", "coding.redundancy=1"], _summary(0.25, 0.91))
    _job(tmp_path, 1, ["model=dnn", "coding.redundancy=9"], error="bad\nmore lines")
    rows, columns = sweep_table(load_sweep(tmp_path))
    assert columns[:3] == ["job", "coding.redundancy", "status"] and "model" not in columns
    assert rows[0]["step_ms"] == 250.0 and rows[0]["total_s"] == 10.0
    assert rows[0]["unicast_bytes"] == 1000.0 and rows[0]["dask_bytes"] == 3000.0
    assert rows[0]["test_accuracy"] == 0.91 and rows[0]["error"] is None
    assert rows[1]["status"] == "failed" and rows[1]["error"] == "bad"
    assert rows[1]["step_ms"] is None


def test_overrides_come_back_with_the_types_the_config_gave_them(tmp_path):
    folder = _job(tmp_path, 0, ["model=cnn", "coding.redundancy=2", "+tag=a"], _summary(0.1, 0.9))
    (folder / ".hydra" / "config.yaml").write_text(
        "coding:\n  redundancy: 2\nmodel:\n  name: cnn\ntag: a\n"
    )
    (job,) = load_sweep(tmp_path)
    assert job["overrides"] == {"model": "cnn", "coding.redundancy": 2, "+tag": "a"}


def test_the_table_has_each_phase_and_the_parameters_digest(tmp_path):
    summary = _summary(0.25, 0.91)
    summary["time_s"].update(map=0.1, shuffle=0.05)
    summary["param_sha256"] = "ab" * 32
    _job(tmp_path, 0, ["coding.redundancy=1"], summary)
    _job(tmp_path, 1, ["coding.redundancy=2"], error="bad")
    rows, columns = sweep_table(load_sweep(tmp_path))
    assert {"map_ms", "shuffle_ms", "params_ms", "param_sha256"} <= set(columns)
    assert rows[0]["map_ms"] == 100.0 and rows[0]["shuffle_ms"] == 50.0
    assert rows[0]["param_sha256"] == "ab" * 32 and rows[1]["param_sha256"] is None
    write_sweep_table(tmp_path)
    assert "| abababababab… |" in (tmp_path / "results.md").read_text()


def test_one_runs_folder_is_read_not_written(tmp_path):
    """Given one run's folder the reader once said "0 jobs", exited 0 and wrote its tables
    into that run's folder; then titled it "Sweep ...: 1 run"."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(_summary(0.25, 0.91)))
    done = subprocess.run(
        [sys.executable, "-m", "dcoded.results", str(run)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Run {run}: bytes per worker per step")
    assert "Sweep" not in done.stdout and "| - | finished | 250 |" in done.stdout
    assert sorted(p.name for p in run.iterdir()) == ["summary.json"]
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "dcoded.results", str(empty)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "holds no run" in done.stderr
    assert list(empty.iterdir()) == []


def test_a_folder_that_is_not_there_is_said_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_sweep(tmp_path / "nowhere")


@pytest.mark.timeout(1200)  # its own subprocess bounds add up past the default 300 s
def test_a_multirun_goes_on_past_a_bad_job_and_tabulates_every_job(tmp_path):
    """`-m coding.redundancy=5,1` stopped at job 0; job 1 never ran. (A job whose config is
    refused now stops the sweep before it starts; this job fails while it runs.)"""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dcoded",
            "-m",
            *TINY,
            "train.steps=2",
            "train.step_timeout_s=0.000001,300",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of 2 jobs failed: job 0: step")  # steps 0..1, direct's
    (bad,) = tmp_path.glob("0-*")
    (good,) = tmp_path.glob("1-*")
    assert "train.step_timeout_s=1e-06" in (bad / "error.txt").read_text()
    assert not (bad / "summary.json").exists()
    summary = json.loads((good / "summary.json").read_text())  # job 1 ran
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["train.step_timeout_s"], r["status"]) for r in rows] == [
        ("0", "1e-06", "failed"),
        ("1", "300", "finished"),
    ]
    assert float(rows[1]["step_ms"]) == pytest.approx(1e3 * summary["time_s"]["step_median"])
    assert float(rows[1]["unicast_bytes"]) == summary["bytes_per_worker"]["unicast"]
    assert float(rows[1]["test_accuracy"]) == summary["final"]["test_accuracy"]
    assert "| 0 | 1e-06 | failed |" in (tmp_path / "results.md").read_text()
    # the command line reads the same table
    again = subprocess.run(
        [sys.executable, "-m", "dcoded.results", str(tmp_path)], capture_output=True, text=True
    )
    assert again.returncode == 1 and "| 1 | 300 | finished |" in again.stdout


def test_write_sweep_table_returns_what_it_wrote(tmp_path):
    _job(tmp_path, 0, ["a=1"], _summary(0.1, 0.5))
    _job(tmp_path, 1, ["a=2"], _summary(0.3, 0.7))
    rows = write_sweep_table(tmp_path)
    with open(tmp_path / "results.csv") as f:
        written = list(csv.DictReader(f))
    assert [float(r["step_ms"]) for r in written] == [r["step_ms"] for r in rows] == [100, 300]


def test_a_seed_sweep_is_grouped_by_every_other_override_with_its_spread(tmp_path):
    """results_by_seed: per group of the same overrides but the seed, the mean, the standard
    deviation (n - 1) and the t interval of the mean, checked against numpy and scipy."""
    import numpy as np
    from scipy import stats

    from dcoded.results import SEED_STEM, paired

    acc = {"ssgd": [0.80, 0.84, 0.79, 0.83, 0.81], "cdc": [0.81, 0.83, 0.80, 0.84, 0.80]}
    num = 0
    for seed in range(5):  # seeds outermost, as the paper's sweeps run them
        for algorithm in ("ssgd", "cdc"):
            _job(
                tmp_path,
                num,
                [f"train.seed={seed}", f"algorithm={algorithm}"],
                _summary(0.01 * (seed + 1), acc[algorithm][seed]),
            )
            num += 1
    write_sweep_table(tmp_path)
    with open(tmp_path / f"{SEED_STEM}.csv") as f:
        rows = {r["algorithm"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"ssgd", "cdc"} and rows["cdc"]["n"] == "5"
    for algorithm, values in acc.items():
        x = np.array(values)
        half = stats.t.ppf(0.975, 4) * x.std(ddof=1) / np.sqrt(5)
        r = rows[algorithm]
        assert float(r["test_accuracy_mean"]) == pytest.approx(x.mean())
        assert float(r["test_accuracy_std"]) == pytest.approx(x.std(ddof=1))
        assert float(r["test_accuracy_lo"]) == pytest.approx(x.mean() - half)
        assert float(r["test_accuracy_hi"]) == pytest.approx(x.mean() + half)
    assert "± " in (tmp_path / f"{SEED_STEM}.md").read_text()
    diff = paired(dict(enumerate(acc["cdc"])), dict(enumerate(acc["ssgd"])))
    d = np.array(acc["cdc"]) - np.array(acc["ssgd"])
    assert diff["mean"] == pytest.approx(d.mean()) and diff["std"] == pytest.approx(d.std(ddof=1))


def test_a_sweep_without_seeds_writes_no_seed_table(tmp_path):
    from dcoded.results import SEED_STEM

    _job(tmp_path, 0, ["algorithm=ssgd"], _summary(0.01, 0.8))
    _job(tmp_path, 1, ["algorithm=cdc"], _summary(0.01, 0.8))
    write_sweep_table(tmp_path)
    assert not (tmp_path / f"{SEED_STEM}.md").exists()


def test_results_help_exits_0_and_says_what_it_does(capsys):
    """``python -m dcoded.results --help`` exited 2 with the usage line."""
    from dcoded.results import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m dcoded.results") and "Exit status" in out


def test_a_sweep_with_a_bad_job_is_refused_whole_before_any_job_runs(tmp_path):
    """`-m coding.redundancy=5,2` started, failed job 0 and went on: a 2-hour sweep should
    say what is wrong with every job before the first one starts."""
    result = subprocess.run(
        [sys.executable, "-m", "dcoded", "-m", *TINY, "coding.redundancy=5,2,7",
         "train.seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and len(lines) == 5, lines
    assert lines[0].startswith(
        "error: job 0 (coding.redundancy=5 train.seed=0): coding.redundancy=5 is not allowed"
    )
    assert [ln.split(" (")[0] for ln in lines[:4]] == [f"error: job {n}" for n in (0, 1, 4, 5)]
    assert lines[-1] == (
        "error: the sweep was not started: 4 job(s) cannot run (nothing was written)"
    )
    assert not (tmp_path / "sweep").exists()


def test_a_seed_table_never_gives_a_time_interval_below_zero():
    """ddp's ``step_ms [-0.26, 30.68]`` over 3 seeds: a t interval of skewed times. Times now
    get a log-scale interval (positive, and containing the geometric mean); accuracies keep
    Student's t."""
    import math

    from dcoded.results import seed_table

    steps = [0.0163, 0.0159, 0.0198 * 1.5]  # seconds, one slow seed
    jobs = [
        {"overrides": {"algorithm": "ddp", "train.seed": s}, "status": "finished",
         "summary": {"time_s": {"step_median": t, "total": 10 * t},
                     "final": {"test_accuracy": a}}}
        for s, (t, a) in enumerate(zip(steps, (0.9, 0.91, 0.95), strict=True))
    ]  # fmt: skip
    (row,), _ = seed_table(jobs)
    ms = [1e3 * t for t in steps]
    geo = math.exp(sum(map(math.log, ms)) / 3)
    assert 0 < row["step_ms_lo"] < geo < row["step_ms_hi"]
    assert row["step_ms_mean"] == pytest.approx(sum(ms) / 3)
    t_half = 4.302652729911275 * row["test_accuracy_std"] / 3**0.5  # t(0.975, 2)
    assert row["test_accuracy_lo"] == pytest.approx(row["test_accuracy_mean"] - t_half)


def test_an_accuracy_interval_is_clamped_to_0_1(tmp_path):
    """Two seeds gave ``test_accuracy [-0.17, 1.28]``: Student's t interval, clipped to where
    an accuracy lies, and the table says so."""
    import numpy as np
    from scipy import stats

    from dcoded.results import SEED_STEM

    acc = {"cdc": [0.55, 0.99], "ssgd": [0.90, 0.91]}
    for num, (algorithm, seed) in enumerate((a, s) for a in acc for s in (0, 1)):
        summary = _summary(0.01, acc[algorithm][seed])
        _job(tmp_path, num, [f"algorithm={algorithm}", f"train.seed={seed}"], summary)
    write_sweep_table(tmp_path)
    with open(tmp_path / f"{SEED_STEM}.csv") as f:
        rows = {r["algorithm"]: r for r in csv.DictReader(f)}
    for algorithm, values in acc.items():
        x = np.array(values)
        half = stats.t.ppf(0.975, 1) * x.std(ddof=1) / np.sqrt(2)
        lo, hi = np.clip([x.mean() - half, x.mean() + half], 0, 1)
        assert float(rows[algorithm]["test_accuracy_lo"]) == pytest.approx(lo)
        assert float(rows[algorithm]["test_accuracy_hi"]) == pytest.approx(hi)
    cdc = rows["cdc"]
    assert (float(cdc["test_accuracy_lo"]), float(cdc["test_accuracy_hi"])) == (0, 1)
    text = (tmp_path / f"{SEED_STEM}.md").read_text()
    assert "test_accuracy, clamped to [0, 1]" in text and "[0, 1] |" in text


@pytest.mark.parametrize("seeds", [["0", "1"], ["0", "0"]])
def test_the_sweeps_last_line_names_each_table_it_wrote(tmp_path, capsys, seeds):
    """The seed table was written but the last line named results.md only."""
    from omegaconf import OmegaConf

    from dcoded.callbacks import SweepTable
    from dcoded.results import SEED_STEM

    for num, seed in enumerate(seeds):
        _job(tmp_path, num, [f"train.seed={seed}", f"a={num}"], _summary(0.01, 0.8))
    SweepTable().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    written = (tmp_path / f"{SEED_STEM}.md").exists()
    assert written == (seeds == ["0", "1"])
    assert (f"{tmp_path / SEED_STEM}.md" in last) == written
    assert last.startswith(f"sweep: 2 jobs, table in {tmp_path / 'results'}.md")


def test_a_job_value_from_its_own_hydra_config_does_not_refuse_the_sweep(tmp_path):
    """``${hydra:runtime.output_dir}`` has its value only in the job: the check before the
    sweep leaves it to the job instead of refusing every job."""
    result = subprocess.run(
        [sys.executable, "-m", "dcoded", "-m", *TINY, "train.steps=2", "train.seed=0,1",
         "+where=${hydra:runtime.output_dir}", f"hydra.sweep.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    where = [json.loads(p.read_text())["config"]["where"] for p in tmp_path.glob("*/summary.json")]
    assert sorted(where) == sorted(str(p.parent) for p in tmp_path.glob("*/summary.json"))


def test_a_failed_runs_cluster_teardown_logs_into_its_folder_not_the_console(
    tmp_path, monkeypatch, capfd
):
    """A multirun's failed job closes the cluster it kept; what Dask logs while it goes (a comm
    closed under a pending task, seen with a traceback in CI) belongs in the job's dcoded.log
    with the rest of its Dask logs, not on the console the sweep prints its one line to."""
    import logging

    from dcoded import run as run_module
    from dcoded.errors import DcodedError
    from tests.conftest import tiny_config

    closed = []

    def noisy_close():
        logging.getLogger("distributed.batched").error("Error in batched write (teardown)")
        closed.append(True)
        real_close()

    real_close = run_module.close_kept_cluster
    monkeypatch.setattr(run_module, "close_kept_cluster", noisy_close)
    cfg = tiny_config("train.step_timeout_s=0.000001")
    with pytest.raises(DcodedError):
        run_module.run(cfg, out_dir=tmp_path, reuse_cluster=True)
    assert closed
    assert "Error in batched write" not in capfd.readouterr().err
    assert "Error in batched write (teardown)" in (tmp_path / "dcoded.log").read_text()
