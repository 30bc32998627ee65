"""``python -m dcoded`` as users run it: Hydra's help, config printing, multirun, outputs,
and the default experiment on real worker processes."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dcoded
import dcoded.cluster
import dcoded.run
from dcoded import provenance
from dcoded.engine.record import HISTORY_COLUMNS
from tests.conftest import TINY

ROOT = Path(__file__).resolve().parent.parent

SUMMARY_KEYS = {
    "algorithm",
    "n_workers",
    "redundancy",
    "group_size",
    "shuffle",
    "model",
    "dataset",
    "batch_size",
    "steps",
    "seed",
    "n_params",
    "final",
    "time_s",
    "bytes_per_worker",
    "param_sha256",
}


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dcoded", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_the_config_groups():
    result = _cli("--help")
    assert result.returncode == 0
    for group in ("algorithm", "model", "dataset", "cluster", "optimizer", "experiment"):
        assert f"{group}:" in result.stdout


def test_cfg_job_prints_the_composed_config():
    result = _cli("--cfg", "job", "coding.redundancy=3", "model=cnn")
    assert result.returncode == 0
    assert "redundancy: 3" in result.stdout and "name: cnn" in result.stdout


def test_an_experiment_overrides_the_defaults():
    """An experiment file wins over config.yaml's own values (``_self_`` comes first)."""
    from dcoded.config import compose_config

    cfg = compose_config(["experiment=smoke"])
    assert cfg.train.steps == 20 and cfg.train.eval_every == 10 and cfg.cluster.n_workers == 3
    assert compose_config(["experiment=smoke", "train.steps=7"]).train.steps == 7
    assert compose_config([]).train.steps == 200


def test_run_writes_summary_history_and_hydra_record(tmp_path):
    result = _cli(
        *TINY, "train.steps=6", "train.eval_every=3", "progress=true", f"hydra.run.dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr
    assert "test accuracy" in result.stdout and "bytes per worker" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert set(summary["final"]) == {"test_accuracy", "test_loss", "train_loss"}
    assert {"total", "step_median", "map", "encode", "shuffle", "decode", "update"} <= set(
        summary["time_s"]
    )
    assert {
        "multicast",
        "unicast",
        "theory_multicast",
        "theory_unicast",
        "params",
        "dask_transfer",
        "wire",
    } <= set(summary["bytes_per_worker"])
    assert len(summary["param_sha256"]) == 64
    with open(tmp_path / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == HISTORY_COLUMNS
    assert [int(r["step"]) for r in rows] == list(range(6))
    evaluated = [int(r["step"]) for r in rows if r["test_accuracy"]]
    assert evaluated == [2, 5]
    assert (tmp_path / ".hydra" / "overrides.yaml").exists()
    # the whole config, resolved, and the code that ran it
    config = summary["config"]
    assert config["optimizer"]["lr"] == config["train"]["lr"] == 0.05
    assert config["model"]["hidden"] == [16] and config["train"]["steps"] == 6
    assert summary["dcoded"]["version"] == dcoded.__version__
    assert summary["dcoded"]["commit"] == (provenance.commit() or provenance.NOT_A_CHECKOUT)
    # the table is in the run's log too, and no progress bar wrote \r into a pipe
    assert "param_sha256" in (tmp_path / "dcoded.log").read_text()
    assert "\r" not in result.stderr and "cdc: step 6/6" in result.stderr


def test_a_failed_run_leaves_its_error_in_its_folder(tmp_path):
    result = _cli(*TINY, "coding.redundancy=9", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert "coding.redundancy=9" in (tmp_path / "error.txt").read_text()
    assert "error: coding.redundancy=9" in (tmp_path / "dcoded.log").read_text()


@pytest.mark.slow
@pytest.mark.parallel_safe
def test_multirun_sweeps_redundancy(tmp_path):
    result = _cli("-m", *TINY, "coding.redundancy=1,2", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    summaries = sorted(tmp_path.glob("*/summary.json"))
    assert len(summaries) == 2
    assert {json.loads(p.read_text())["redundancy"] for p in summaries} == {1, 2}
    # the jobs ran on one cluster, started once (a short job spent most of its time on it)
    workers = [json.loads(p.read_text())["environment"]["workers"] for p in summaries]
    assert workers[0] == workers[1] and len(workers[0]) == 4


def test_a_kept_cluster_is_reused_with_the_same_settings_and_closed_after_a_failure():
    from dcoded.cluster import _KEPT
    from dcoded.config import compose_config
    from dcoded.errors import RunError

    try:
        first = dcoded.run.run(compose_config(TINY), reuse_cluster=True)
        again = dcoded.run.run(compose_config([*TINY, "train.seed=1"]), reuse_cluster=True)
        assert first["environment"]["workers"] == again["environment"]["workers"]
        kept = _KEPT["session"]
        other = dcoded.run.run(compose_config([*TINY, "cluster.n_workers=3"]), reuse_cluster=True)
        assert len(other["environment"]["workers"]) == 3 and _KEPT["session"] is not kept
        with pytest.raises(RunError, match=r"train\.step_timeout_s=1e-06s a step"):
            dcoded.run.run(
                compose_config([*TINY, "train.step_timeout_s=0.000001"]), reuse_cluster=True
            )
        assert "session" not in _KEPT  # a failed run leaves the next a new cluster
    finally:
        dcoded.cluster.close_kept_cluster()


@pytest.mark.timeout(1200)  # its own subprocess bounds add up past the default 300 s
@pytest.mark.slow
@pytest.mark.parallel_safe
def test_default_experiment_on_worker_processes(tmp_path):
    """What `make run` runs: 4 worker processes, r=2, digits; it must reach 0.90, and equal
    the serial reference bit for bit."""
    result = _cli("progress=false", f"hydra.run.dir={tmp_path / 'cdc'}", timeout=600)
    assert result.returncode == 0, result.stderr
    cdc = json.loads((tmp_path / "cdc" / "summary.json").read_text())
    assert cdc["final"]["test_accuracy"] >= 0.90
    assert cdc["environment"]["cluster"] == "local" and len(cdc["environment"]["workers"]) == 4
    assert all(w.startswith("tcp://127.0.0.1:") for w in cdc["environment"]["workers"])
    # four worker processes on fewer cores take turns on them: said, once
    shared = cdc["environment"]["cores"] < 4
    assert ("worker processes share" in result.stderr) == shared, result.stderr
    assert sum("worker processes share" in e for e in cdc["events"]) == shared
    result = _cli("algorithm=serial", "progress=false", f"hydra.run.dir={tmp_path / 'serial'}")
    assert result.returncode == 0, result.stderr
    serial = json.loads((tmp_path / "serial" / "summary.json").read_text())
    assert cdc["param_sha256"] == serial["param_sha256"]


def test_a_setting_the_algorithm_ignores_is_warned_of_on_the_console_and_in_the_summary(capsys):
    from dcoded.config import compose_config

    summary = dcoded.run.run(compose_config([*TINY, "algorithm=ssgd", "coding.stragglers=1"]))
    line = "algorithm=ssgd ignores coding.stragglers=1 (cdc only)"
    assert f"warning: {line}\n" in capsys.readouterr().err
    assert line in summary["events"]


def test_the_console_names_ddps_bytes_the_wire_and_what_happened():
    """ddp's rows said "measured -" where its buckets and the wire are known; the table said
    nothing of the network, the stragglers, a recovery or repairs."""
    import copy

    from dcoded.config import compose_config
    from dcoded.summary import format_results

    summary = dcoded.run.run(compose_config([*TINY, "algorithm=ssgd"]))
    assert "stragglers:" not in format_results(summary)  # nothing happened: no line
    ddp = copy.deepcopy(summary)
    ddp["algorithm"] = "ddp"
    ddp["bytes_per_worker"].update(allreduced=4.0 * ddp["n_params"], wire=123_456.0)
    ddp["environment"]["netem"] = {
        "topology": "switch", "bandwidth_mbit": 100.0, "driver_bandwidth_mbit": 100.0,
        "queue_ms": 20.0,
    }  # fmt: skip
    ddp["recoveries"] = [
        {"lost": [{"rank": 1}], "at_step": 2, "resumed_from": 0, "steps_replayed": 2,
         "replaced": 1}
    ]  # fmt: skip
    text = format_results(ddp)
    buckets = f"{4 * ddp['n_params']:,}"
    assert re.search(rf"all-reduce buckets \(gloo\) +{buckets} +{buckets}\n", text), text
    assert re.search(r"on the wire \(every packet\) +123,456\n", text)
    assert "  network: emulated, switch at 100 Mbit/s, queues of 20 ms\n" in text
    assert "  recovery: rank 1 lost at step 2, went on from step 0 (2 steps again" in text
    assert "inside map's backward" in text and "gradient exchange" not in text


@pytest.mark.parametrize(
    "overrides, phases, multicast",
    [
        (["algorithm=ssgd"], "map shuffle update params", False),
        (["algorithm=asgd"], "map shuffle update params", False),
        (["algorithm=serial"], "map update", False),
        (["transport=dask"], "map encode shuffle decode update params", True),
        (["transport=direct"], "map encode shuffle decode update params", True),
        (["algorithm=ddp"], "map shuffle update", False),
    ],
)
def test_the_console_shows_only_the_phases_and_bytes_an_algorithm_has(overrides, phases, multicast):
    """An ssgd run printed a multicast row and ``encode 0.00 decode 0.00``: a parameter
    server codes nothing and multicasts nothing (summary.json keeps every key)."""
    from dcoded.config import compose_config
    from dcoded.summary import format_results

    ddp = overrides == ["algorithm=ddp"]  # worker processes: its table from an ssgd summary
    summary = dcoded.run.run(compose_config([*TINY, *(["algorithm=ssgd"] if ddp else overrides)]))
    if ddp:
        summary["algorithm"] = "ddp"
        summary["bytes_per_worker"]["allreduced"] = 4.0 * summary["n_params"]
    text = format_results(summary)
    shown = re.search(r"\n    step_median ([^\n]*)\n", text).group(1).split()
    assert shown[1::2] == phases.split(), text
    assert ("gradient exchange, multicast" in text) == multicast, text
    serial = overrides == ["algorithm=serial"]
    assert ("Dask transfers (all)" in text) == (not serial), text
    assert set(summary["time_s"]) >= {"map", "encode", "shuffle", "decode", "update", "params"}
    assert {"multicast", "unicast", "params"} <= set(summary["bytes_per_worker"])


def test_the_console_says_which_network_carried_the_run():
    """A local run's console never said its network was loopback (nor that in-process workers
    use none): only an emulated one was named."""
    from distributed import LocalCluster

    from dcoded.config import compose_config
    from dcoded.summary import format_results

    def network(summary) -> list[str]:
        return [ln for ln in format_results(summary).splitlines() if "network:" in ln]

    in_process = dcoded.run.run(compose_config([*TINY, "algorithm=ssgd"]))
    assert network(in_process) == [
        "  network: none, in-process workers (cluster=local, processes=false: in memory)"
    ]
    with LocalCluster(
        n_workers=2, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address=":0"
    ) as cluster:  # in-process workers that talk over TCP, on this machine's loopback
        cfg = [o for o in TINY if "processes" not in o]  # a setting of cluster=local only
        cfg += ["algorithm=ssgd", "cluster=address", "cluster.n_workers=2"]
        on_loopback = dcoded.run.run(
            compose_config([*cfg, f"cluster.address={cluster.scheduler_address}"])
        )
    assert network(on_loopback) == [
        "  network: loopback (cluster=address: every worker on this machine; no link emulated)"
    ]
    serial = dcoded.run.run(compose_config([*TINY, "algorithm=serial"]))
    assert network(serial) == []  # one process: no workers, no network


def test_a_sweeps_job_folders_do_not_nest_under_an_address_or_a_path(tmp_path):
    """A job's folder names its overrides; a scheduler's address or a data path in them would
    nest it under ``tcp:/HOST:PORT,...`` folders. They stay out of the name (the job's config
    keeps them); each job still fails with its own clear error, in its own flat folder."""
    from tests.test_data import make_idx_folder

    data = tmp_path / "data" / "mnist"
    make_idx_folder(data, n_train=200, n_test=20)
    sweep = tmp_path / "sweep"
    result = _cli(
        "-m",
        "cluster=address",
        "cluster.address=tcp://127.0.0.1:9",
        "cluster.connect_timeout_s=2",
        "dataset=mnist",
        f"dataset.path={data}",
        "coding.redundancy=1,2",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode != 0
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == [
        f"{i}-cluster.connect_timeout_s=2,cluster=address,coding.redundancy={r},dataset=mnist"
        for i, r in enumerate((1, 2))
    ], jobs
    for job in jobs:
        config = (sweep / job / ".hydra" / "config.yaml").read_text()
        assert "address: tcp://127.0.0.1:9" in config and f"path: {data}" in config
