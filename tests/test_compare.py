"""The first comparison (``python -m dcoded -m experiment=compare``, ``make compare``): its
sweep's jobs, the best coded r it picks, the fallback to loopback, and the comparison it prints
of known runs (no timing is asserted: the ratios are read, not tested)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from dcoded import compare, netem
from dcoded.callbacks import Comparison, bad_jobs
from dcoded.cluster import available_cores
from dcoded.config import build_spec, compose_config, plain, sweep_jobs
from dcoded.errors import ConfigError, NetemUnavailable
from dcoded.predict import Scenario, best, predict
from dcoded.topology import bucket_seconds

ROOT = Path(__file__).resolve().parent.parent
D = 109_386  # the dnn's parameters on MNIST-sized data: [784 -> 128 -> 64 -> 10]


@pytest.fixture
def emulated(monkeypatch):
    """As where the emulated network can be made (root, iproute2), whatever this machine is."""
    monkeypatch.setattr(netem, "check_available", lambda: None)
    best._best.cache_clear()
    yield
    best._best.cache_clear()


@pytest.fixture
def unavailable(monkeypatch):
    """As where the emulated network cannot be made (no iproute2), whatever this machine is."""

    def refuse():
        raise NetemUnavailable("cluster=netem needs iproute2 (tc not found); use cluster=local")

    monkeypatch.setattr(netem, "check_available", refuse)
    monkeypatch.setattr(netem, "_FELL_BACK", set())
    best._best.cache_clear()
    yield
    best._best.cache_clear()


def test_the_sweep_runs_ddp_cdc_at_r1_and_at_the_best_r_and_the_xor_free_control(emulated):
    with initialize_config_module(config_module="dcoded.conf", version_base="1.3"):
        master = compose("config", ["experiment=compare"], return_hydra_config=True)
        configs = [cfg for _, cfg in sweep_jobs(master)]
        assert bad_jobs(master) == []  # every job passes the checks its run makes first
    jobs = [plain(cfg) for cfg in configs]
    for cfg in configs:  # and none is warned of a setting it ignores (DDP of cdc's)
        assert build_spec(cfg)[0].extra["warnings"] == []
    r = best.best_redundancy(_root_=compose_config(["experiment=compare"]))
    assert [
        (c["algorithm"]["name"], c["coding"]["redundancy"], c["coding"]["shuffle"])
        for c in jobs
        if c["algorithm"]["name"] == "cdc"
    ] == [("cdc", 1, "coded"), ("cdc", r, "coded"), ("cdc", r, "pieces")]
    assert jobs[0]["algorithm"]["name"] == "ddp" and len(jobs) == 4
    for c in jobs:
        assert (c["cluster"]["kind"], c["cluster"]["topology"], c["cluster"]["fallback"]) == (
            "netem",
            "bus",
            "local",
        )
        assert c["transport"]["name"] == (
            "direct" if c["algorithm"]["name"] == "ddp" else "multicast"
        )


def test_its_jobs_from_python_are_the_command_lines_with_its_overrides(emulated):
    """``compare.jobs(OVERRIDES)`` as ``python -m dcoded -m experiment=compare OVERRIDES``:
    every override applies, and one that sweeps (another r, both shuffles) sweeps."""
    steps = [plain(c)["train"]["steps"] for c in compare.jobs(["train.steps=3"])]
    assert steps == [3, 3, 3, 3]
    other_r = compare.jobs(["+compare=cdc_best,pieces_best", "coding.redundancy=2"])
    assert [(c.coding.redundancy, c.coding.shuffle) for c in other_r] == [
        (2, "coded"),
        (2, "pieces"),
    ]


def test_a_typo_in_its_overrides_from_python_is_one_config_error():
    with pytest.raises(ConfigError, match=r"did you mean coding\.redundancy"):
        compare.jobs(["coding.redundency=2"])


def _predicted_best(K, topology, transport, rate=100.0, batch=240):
    """The r of least predicted step among 1 < r < K, each scenario written out here."""
    steps = {}
    for r in range(2, K):
        s = Scenario(
            "cdc",
            n_workers=K,
            n_params=D,
            batch_size=batch,
            rate_mbit=rate,
            redundancy=r,
            shuffle="coded",
            transport=transport,
            topology=topology,
            model="dnn",
            cores=available_cores(),
            bucket_s=bucket_seconds(rate) if rate != float("inf") else 0.0,
        )
        steps[r] = predict(s).step_s
    return min(steps, key=steps.get)


@pytest.mark.parametrize(
    "overrides,K,topology,transport",
    [
        ([], 4, "bus", "multicast"),
        (["cluster.topology=switch", "transport=direct"], 4, "switch", "direct"),
        (["cluster.n_workers=6", "train.batch_size=600"], 6, "bus", "multicast"),
    ],
)
def test_the_best_coded_r_is_the_least_predicted_step(emulated, overrides, K, topology, transport):
    cfg = compose_config(["experiment=compare", "+compare=cdc_best", *overrides])
    assert plain(cfg)["coding"]["redundancy"] == _predicted_best(K, topology, transport)


def test_without_the_emulated_network_the_best_r_is_chosen_for_loopback(unavailable):
    cfg = compose_config(["experiment=compare", "+compare=cdc_best", "cluster.n_workers=5"])
    expected = _predicted_best(5, "switch", "direct", rate=float("inf"))
    assert plain(cfg)["coding"]["redundancy"] == expected


def test_a_cluster_too_small_to_code_is_one_line():
    cfg = compose_config(["experiment=compare", "+compare=cdc_best", "cluster.n_workers=2"])
    with pytest.raises(ConfigError) as err:
        plain(cfg)
    assert "no coded layout to compare with K=2" in str(err.value)
    assert "\n" not in str(err.value)


def test_netem_is_kept_where_it_can_be_made(emulated):
    cfg = compose_config(["experiment=compare", "+compare=cdc_best"])
    assert netem.or_loopback(cfg) is cfg


def test_netem_falls_back_to_loopback_only_where_asked_and_unable(unavailable, capsys):
    asked_none = compose_config(["cluster=netem"])  # kept as it is: refused when it runs
    assert netem.or_loopback(asked_none) is asked_none
    cfg = compose_config(
        [
            "experiment=compare",
            "+compare=cdc_best",
            "cluster.n_workers=3",
            "transport.overlap=false",
        ]
    )
    local = netem.or_loopback(cfg)
    assert OmegaConf.to_container(local.cluster) == {
        **yaml.safe_load((ROOT / "conf" / "cluster" / "local.yaml").read_text()),
        "n_workers": 3,
        "torch_threads": 1,
        "connect_timeout_s": 60,
    }
    assert (local.transport.name, local.transport.overlap) == ("direct", False)
    assert set(local.transport) == set(
        yaml.safe_load((ROOT / "conf/transport/direct.yaml").read_text())
    )
    assert local.coding.shuffle == "coded" and local.train.steps == cfg.train.steps
    netem.or_loopback(cfg)  # a second job of the sweep: said once
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "cluster=netem needs iproute2 (tc not found): running on loopback" in err[0]
    )


# --------------------------------------------------------------------------- the printer

N = 1000  # the fake runs' parameters
RATE = 100e6 / 8  # bytes/s of a 100 Mbit/s link


def _summary(algorithm, step_s, r=None, shuffle=None, sent=None, theory=None, netem_=True):
    """A summary.json with what the comparison reads: ``step_s`` with a spread of 5% each way,
    the gradient exchange's ``sent`` and ``theory`` bytes (multicast, as cdc's transport)."""
    cdc = algorithm == "cdc"
    env = {"cluster": "netem" if netem_ else "local", "cores": 2}
    if netem_:
        env["netem"] = {"topology": "bus", "bandwidth_mbit": 100.0}
    bytes_ = dict.fromkeys(("multicast", "theory_multicast", "unicast", "params", "wire"), None)
    bytes_ |= {"theory_unicast": theory, "dask_transfer": 0.0, "transport": None}
    if cdc:
        bytes_ |= {"multicast": sent, "theory_multicast": theory, "unicast": 2 * sent}
    return {
        "status": "finished",
        "algorithm": algorithm,
        "n_workers": 4,
        "n_params": N,
        "redundancy": r,
        "group_size": 4 if cdc else None,
        "shuffle": shuffle,
        "hybrid_m": None,
        "transport": "multicast" if cdc else None,
        "model": "dnn",
        "dataset": "synthetic",
        "batch_size": 240,
        "steps": 20,
        "final": {"test_accuracy": 0.5},
        "param_sha256": "0" * 64,
        "time_s": {
            "total": 1.0,
            "step_median": step_s,
            "step_p25": 0.95 * step_s,
            "step_p75": 1.05 * step_s,
        },
        "bytes_per_worker": bytes_,
        "environment": env,
    }


def _known(netem_=True):
    return [
        _summary("cdc", 0.100, 3, "pieces", sent=110.0, theory=100.0, netem_=netem_),
        _summary("ddp", 0.200, theory=1500.0, netem_=netem_),
        _summary("cdc", 0.050, 3, "coded", sent=36.0, theory=36.0, netem_=netem_),
        _summary("cdc", 0.150, 1, "coded", sent=750.0, theory=750.0, netem_=netem_),
    ]


def test_the_comparison_of_known_runs():
    rows = compare.rows(_known())
    assert [r["run"] for r in rows] == ["DDP", "cdc r=1", "cdc r=3 coded", "cdc r=3 XOR-free"]
    assert [r["vs_ddp"] for r in rows] == [1.0, 0.75, 0.25, 0.5]
    assert [r["bytes_x"] for r in rows] == [None, 1.0, 1.0, 1.1]
    ddp = rows[0]  # a ring all-reduce on a bus: K rings of 2(K-1)/K of d share one medium
    assert ddp["comm_bound_ms"] == round(1e3 * 2 * 3 * 4 * N / RATE, 2)  # 1.92 ms
    assert ddp["step_x"] == round(0.200 / (2 * 3 * 4 * N / RATE), 3)
    assert (ddp["sent_B"], ddp["theory_B"]) == (None, 1500.0)
    lines = compare.verdicts(rows)
    assert lines == [
        "cdc r=3 coded: 0.25x DDP's step (50 against 200 ms: faster beyond the steps' spread)",
        "cdc r=3 coded: 0.50x its XOR-free control's step (50 against 100 ms: faster beyond the "
        "steps' spread), sending 0.33x its bytes (36 against 110 B)",
        "cdc r=1: 0.75x DDP's step (150 against 200 ms: faster beyond the steps' spread)",
    ]


def test_steps_within_each_others_spread_are_not_told_apart():
    close = [_summary("ddp", 0.100, theory=1.0), _summary("cdc", 0.098, 1, "coded", 1.0, 1.0)]
    (line,) = compare.verdicts(compare.rows(close))
    assert "0.98x DDP's step" in line and "not told apart" in line


def _sweep(tmp_path, summaries, failed=()):
    for i, s in enumerate(summaries):
        job = tmp_path / f"{i}-job"
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"+compare=arm{i}"]))
        (job / "summary.json").write_text(json.dumps(s))
    for i, why in enumerate(failed, start=len(summaries)):
        job = tmp_path / f"{i}-job"
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"+compare=arm{i}"]))
        (job / "error.txt").write_text(why)
    return tmp_path


def test_the_report_says_where_the_runs_ran_and_what_each_ratio_means(tmp_path):
    text = compare.report([_sweep(tmp_path / "emulated", _known())])
    assert "on an emulated bus of 100 Mbit/s links (cluster=netem)" in text.splitlines()[0]
    assert "the 4 workers share this machine's 2 cores" in text.splitlines()[0]
    scaled = _known()
    config = plain(compose_config(["experiment=compare", "cluster.scale_model=true"]))
    for s in scaled:
        s |= {"config": config, "n_params": D}
    text = compare.report([_sweep(tmp_path / "scaled", scaled)])
    assert "each worker an emulated machine of its own" in text.splitlines()[0]
    for column in ("vs_ddp", "step_x", "bytes_x", "predicted_ms"):
        assert f"  {column}: {compare.MEANING[column]}" in text
    loopback = compare.report([_sweep(tmp_path / "loopback", _known(netem_=False))])
    assert "on LOOPBACK (cluster=local)" in loopback.splitlines()[0]
    assert "step_x" not in loopback  # no link, no bound to set a step against


def test_the_best_r_line_says_how_it_was_chosen():
    coded = _summary("cdc", 0.050, 3, "coded", sent=36.0, theory=36.0)
    coded |= {"n_params": D, "config": plain(compose_config(["experiment=compare"]))}
    best = compare.best_choice([_summary("ddp", 0.2, theory=1.0), coded])
    expected = _predicted_best(4, "bus", "multicast")
    assert (best["r"], sorted(best["steps"]), best["g"]) == (expected, [2, 3], 4)
    line = compare.verdicts(compare.rows([coded]), best)[0]
    assert line.startswith(f"best coded r = {expected}: of the coded layouts 1 < r < 4")
    ran_other = compare.verdicts(compare.rows([coded]), {**best, "r": 2})
    assert "(these runs are at r = 3, as their configs say)" in ran_other


def test_the_sweeps_end_prints_and_keeps_the_comparison_also_when_a_job_failed(tmp_path, capsys):
    sweep = _sweep(tmp_path, _known(), failed=["worker lost"])
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    with pytest.raises(SystemExit) as stop:
        Comparison().on_multirun_end(config)
    assert stop.value.code == 1  # as the sweep table says: a job failed
    out = capsys.readouterr().out
    assert (sweep / "results.md").is_file()
    written = (sweep / compare.REPORT_FILE).read_text()
    assert written in out and "cdc r=3 coded: 0.25x DDP's step" in written
    assert "did not finish: 4-job: failed" in written


def test_the_command_line_reads_a_sweep_and_writes_nothing(tmp_path, capsys):
    sweep = _sweep(tmp_path, _known())
    before = sorted(p.name for p in sweep.rglob("*"))
    assert compare.main([str(sweep)]) == 0
    assert "cdc r=3 XOR-free" in capsys.readouterr().out
    assert sorted(p.name for p in sweep.rglob("*")) == before
    assert compare.main([str(tmp_path / "nowhere")]) == 2


@pytest.mark.slow
@pytest.mark.parallel_safe  # reads what the sweep printed, not how fast it ran
def test_make_compare_runs_on_loopback_where_there_is_no_iproute2(tmp_path):
    """``python -m dcoded -m experiment=compare``, as ``make compare`` runs it, on a machine
    without iproute2 (PATH without ip and tc): the four runs on loopback, saying so, and the
    comparison at the end."""
    path = os.pathsep.join(
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if not any(Path(p, tool).exists() for tool in ("ip", "tc", "bridge"))
    )
    sweep = tmp_path / "sweep"
    sweep_dir = f"hydra.sweep.dir={sweep}"
    result = subprocess.run(
        [sys.executable, "-m", "dcoded", "-m", "experiment=compare", "train.steps=3", sweep_dir],
        cwd=tmp_path,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("running on loopback instead") == 1, result.stderr
    out = result.stdout
    assert "on LOOPBACK (cluster=local): the emulated network cannot be made here" in out
    table = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    runs = [line.split("|")[1].strip() for line in table[1:]]
    assert runs[:2] == ["DDP", "cdc r=1"] and len(runs) == 4
    assert runs[2].endswith(" coded") and runs[3].endswith(" XOR-free")
    assert runs[2].split()[1] == runs[3].split()[1]  # the control at the best r
    assert "best coded r = " in out and (sweep / compare.REPORT_FILE).is_file()
