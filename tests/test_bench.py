"""The benchmark: its flags become the multiruns of the bench experiments, and its reader makes
the table from any sweep folder of them, with the ratios to the baselines and the bounds of
each exchange computed from the jobs' summaries (no timing is asserted: speed is judged by
reading the table, not by tests)."""

from __future__ import annotations

import csv
import itertools
import json
import statistics
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module

from dcoded import bench

N_PARAMS = 1000
D4 = 4 * N_PARAMS  # bytes of one gradient or parameter vector
RATE = 100e6 / 8  # bytes/s of a 100 Mbit/s link


def summary(algorithm, step_s, topology="switch", model="dnn", r=None, transport=None, **net):
    """A summary.json as a finished run writes it, with the fields the bench reads."""
    cdc = algorithm == "cdc"
    environment = {"cluster": "netem" if topology else "local"}
    if topology:
        environment["netem"] = {"topology": topology, "bandwidth_mbit": 100.0, **net}
    return {
        "status": "finished",
        "algorithm": algorithm,
        "n_workers": 4,
        "n_params": N_PARAMS,
        "redundancy": r,
        "group_size": 4 if cdc else None,
        "shuffle": "coded" if cdc else None,
        "hybrid_m": None,
        "transport": transport,
        "model": model,
        "dataset": "synthetic",
        "batch_size": 240,
        "steps": 30,
        "final": {"test_accuracy": 0.5},
        "time_s": {
            "total": 1.0,
            "step_median": step_s,
            **dict.fromkeys(("map", "encode", "decode", "update"), 0.001),
            "shuffle": 0.004,
            "params": 0.002,
        },
        "bytes_per_worker": {
            k: 1.0 for k in ("multicast", "theory_multicast", "unicast", "theory_unicast", "params")
        }
        | {"dask_transfer": 2.0, "transport": 3.0, "wire": 4.0},
        "environment": environment,
    }


def write_job(sweep, name, overrides, result=None, error=None):
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if result is not None:
        (job / "summary.json").write_text(json.dumps(result))
    if error is not None:
        (job / "error.txt").write_text(error)


@pytest.fixture
def sweep(tmp_path):
    """A sweep folder as a user might have left it: jobs of several multiruns, out of the
    bench's order, on three topologies, one job failed."""
    racks = {"rack_size": 2, "uplink_mbit": 25.0}
    jobs = [
        ("0-bench_cdc-dnn-direct-r2-coded", summary("cdc", 0.020, r=2, transport="direct")),
        ("0-bench-dnn-ssgd", summary("ssgd", 0.010)),
        ("1-bench-dnn-ddp", summary("ddp", 0.005)),
        ("2-bench-dnn-ssgd", summary("ssgd", 0.016, topology="bus")),
        ("3-bench-dnn-ddp", summary("ddp", 0.008, topology="bus")),
        ("4-bench-dnn-ssgd", summary("ssgd", 0.030, topology="racks", **racks)),
        ("5-bench-cnn-ssgd", summary("ssgd", 0.040, model="cnn")),
    ]
    for name, result in jobs:
        write_job(tmp_path, name, [f"algorithm={result['algorithm']}"], result)
    write_job(tmp_path, "6-bench-cnn-ddp", ["algorithm=ddp"], error="worker lost\ndetails")
    return tmp_path


def test_the_reader_sets_each_run_beside_its_baselines_and_bounds(sweep):
    rows, header, unfinished = bench.read([sweep])
    assert [(r["topology"], r["model"], r["algorithm"]) for r in rows] == [
        ("switch", "dnn", "ssgd"),
        ("switch", "dnn", "ddp"),
        ("switch", "dnn", "cdc"),
        ("switch", "cnn", "ssgd"),
        ("bus", "dnn", "ssgd"),
        ("bus", "dnn", "ddp"),
        ("racks", "dnn", "ssgd"),
    ]
    by = {(r["topology"], r["model"], r["algorithm"]): r for r in rows}
    cdc = by["switch", "dnn", "cdc"]
    assert (cdc["vs_ssgd"], cdc["vs_ddp"]) == (2.0, 4.0)  # 20 ms over 10 and 5, same topology
    assert (by["bus", "dnn", "ddp"]["vs_ssgd"], by["bus", "dnn", "ddp"]["vs_ddp"]) == (0.5, 1.0)
    assert by["switch", "cnn", "ssgd"]["vs_ddp"] is None  # cnn's ddp failed
    assert by["racks", "dnn", "ssgd"]["vs_ddp"] is None

    def ms(seconds):
        return round(1e3 * seconds, 2)

    # parameter server on a switch: the driver's link takes K gradients in, sends K θ out
    ps = by["switch", "dnn", "ssgd"]
    assert ps["shuffle_bound_ms"] == ps["params_bound_ms"] == ms(4 * D4 / RATE)  # 1.28 ms
    assert ps["comm_bound_ms"] == ms(8 * D4 / RATE)
    assert ps["step_x"] == round(0.010 / (8 * D4 / RATE), 3)  # the step over both phases' bound
    assert ps["shuffle_x"] == round(4.0 / 1.28, 3) and ps["params_x"] == round(2.0 / 1.28, 3)
    # ring all-reduce: each link carries 2(K-1)/K of d; on a bus all K rings share the medium
    ring = 2 * 3 / 4 * D4
    assert by["switch", "dnn", "ddp"]["shuffle_bound_ms"] == ms(ring / RATE)  # 0.48 ms
    assert by["bus", "dnn", "ddp"]["shuffle_bound_ms"] == ms(4 * ring / RATE)  # 1.92 ms
    assert by["switch", "dnn", "ddp"]["params_bound_ms"] == 0.0
    # racks of two behind 25 Mbit/s uplinks: two gradients up each uplink beat K on the driver
    assert by["racks", "dnn", "ssgd"]["shuffle_bound_ms"] == ms(2 * D4 / (25e6 / 8))  # 2.56
    assert by["racks", "dnn", "ssgd"]["params_bound_ms"] == ms(2 * D4 / (25e6 / 8))
    assert cdc["shuffle_bound_ms"] > 0 and cdc["step_ms"] == 20.0
    assert len(unfinished) == 1 and "6-bench-cnn-ddp: failed (worker lost)" in unfinished[0]
    assert "K=4, cluster=netem at 100 Mbit/s per link (switch,bus,racks)" in header


def _tree(folder: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_reading_a_sweep_prints_the_table_and_writes_it_only_where_told(
    sweep, tmp_path_factory, capsys
):
    """``--read`` wrote bench.md, .csv and .json into the folder it read: reading writes
    nothing; ``--out DIR`` writes the table there."""
    before = _tree(sweep)
    assert bench.main(["--read", str(sweep)]) == 1  # a job failed
    printed = capsys.readouterr().out
    assert _tree(sweep) == before
    table = tmp_path_factory.mktemp("elsewhere") / "table"
    assert bench.main(["--read", str(sweep), "--out", str(table)]) == 1
    out, err = capsys.readouterr()
    assert out == printed == (table / "bench.md").read_text()
    assert _tree(sweep) == before and f"table: {table / 'bench.md'}" in err
    rows = json.loads((table / "bench.json").read_text())
    assert set(rows[0]) == set(bench.COLUMNS)  # csv and json: every column
    shown = out.splitlines()[2].strip("| ").split(" | ")  # md: those with a value somewhere
    assert shown == [c for c in bench.SHOWN if any(r[c] is not None for r in rows)]
    assert "s" not in shown and "transport.overlap=true" in out
    assert "| switch | dnn | cdc | 2 | coded | direct | none | 1 | 20 | 1 | 2 | 4 |" in out
    assert "did not finish" in err and "worker lost" in err
    with open(table / "bench.csv") as f:
        assert [r["step_ms"] for r in csv.DictReader(f)][:3] == ["10.0", "5.0", "20.0"]
    assert bench.main(["--read", str(sweep / "nothing")]) == 2


def test_repeats_are_read_as_one_row_with_an_interval_for_each_ratio(tmp_path, capsys):
    """--repeats N writes repeat-1..N; each ratio is over the baseline of its own repeat, and
    the row gets the mean ratio with Student's t interval over the repeats."""
    times = [(0.020, 0.010), (0.024, 0.010), (0.018, 0.010)]  # cdc, ddp per repeat
    for i, (cdc, ddp) in enumerate(times, 1):
        where = tmp_path / f"repeat-{i}"
        write_job(where, "0-cdc", ["algorithm=cdc"], summary("cdc", cdc, r=2, transport="direct"))
        write_job(where, "1-ddp", ["algorithm=ddp"], summary("ddp", ddp))
    assert bench.main(["--read", str(tmp_path), "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())
    cdc = next(r for r in rows if r["algorithm"] == "cdc")
    ratios = [c / d for c, d in times]
    mean = sum(ratios) / 3
    half = 4.302653 * statistics.stdev(ratios) / 3**0.5  # t(0.975, 2)
    assert cdc["repeats"] == 3 and cdc["step_ms"] == 20.0  # the median step over repeats
    assert cdc["vs_ddp"] == round(mean, 3)
    assert cdc["vs_ddp_lo"] == pytest.approx(mean - half, abs=1e-3)
    assert cdc["vs_ddp_hi"] == pytest.approx(mean + half, abs=1e-3)
    out = capsys.readouterr().out
    assert f"{round(mean, 3):g} [{round(mean - half, 3):g}, {round(mean + half, 3):g}]" in out
    assert "3 repeats" in out


def test_the_repeats_flag_interleaves_the_sweeps(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "run_sweep", lambda sweep, out: ran.append((sweep[0], out.name)))
    bench.main(["--repeats", "2", "--out", str(tmp_path / "b"), "--cluster", "local"])
    names = [n for _, n in ran]
    assert names == sorted(names) and set(names) == {"repeat-1", "repeat-2"}
    assert [s for s, n in ran if n == "repeat-1"] == [s for s, n in ran if n == "repeat-2"]
    assert bench.main(["--repeats", "0", "--out", str(tmp_path / "c")]) == 2


def args(*flags):
    return bench.parser().parse_args(list(flags))


def test_without_flags_the_bench_runs_its_three_experiment_files_as_they_are():
    assert bench.sweeps(args(), 4) == [
        ["experiment=bench"],
        ["experiment=bench_cdc", "coding.redundancy=2,3"],
        ["experiment=bench_cdc_ends", "coding.redundancy=1,4"],
    ]


def test_flags_become_overrides_of_every_sweep():
    flags = ["--cluster", "local", "--workers", "3", "--topology", "bus", "--models", "dnn"]
    flags += ["--steps", "2", "--bandwidth-mbit", "50", "--redundancies", "1,2,3"]
    flags += ["--transports", "direct", "--baselines", "ssgd,ddp", "x.y=1"]
    common = ["cluster=local", "cluster.n_workers=3", "cluster.bandwidth_mbit=50", "model=dnn"]
    common += ["train.steps=2", "x.y=1"]  # no cluster.topology: a local cluster has no links
    assert bench.sweeps(args(*flags), 3) == [
        ["experiment=bench", "algorithm=ssgd,ddp", *common],
        ["experiment=bench_cdc", "transport=direct", "coding.redundancy=2", *common],
        ["experiment=bench_cdc_ends", "transport=direct", "coding.redundancy=1,3", *common],
    ]
    netem = bench.sweeps(
        args("--topology", "switch,racks", "--uplink-mbit", "50", "--baselines", ""), 4
    )
    # no baselines; the topology sweeps outermost (bench.yaml lists it first)
    assert netem[0] == [
        "experiment=bench_cdc",
        "coding.redundancy=2,3",
        "cluster.uplink_mbit=50",
        "cluster.topology=switch,racks",
    ]
    # chosen shuffles run at every r, in one sweep
    assert bench.sweeps(args("--shuffles", "summed", "--redundancies", "1,2"), 4)[1:] == [
        ["experiment=bench_cdc", "coding.redundancy=1,2", "coding.shuffle=summed"]
    ]


def test_the_experiment_files_sweep_the_benchs_runs_in_its_conditions():
    """The three files' products together: each model's baselines, and cdc at every r over each
    transport, every shuffle where they differ (1 < r < K) and the coded one at r = 1 and K."""
    runs = []
    with initialize_config_module(config_module="dcoded.conf", version_base="1.3"):
        for name in bench.EXPERIMENTS:
            cfg = compose("config", [f"experiment={name}"], return_hydra_config=True)
            params = cfg.hydra.sweeper.params
            assert next(iter(params)) == "cluster.topology"  # the outer loop: one network each
            keys = [k for k in params if k != "cluster.topology"]
            for values in itertools.product(*(str(params[k]).split(",") for k in keys)):
                job = dict(zip(keys, values, strict=True))
                if job["algorithm"] != "cdc":
                    runs.append((job["model"], job["algorithm"]))
                    continue
                r, shuffle = int(job["coding.redundancy"]), job["coding.shuffle"]
                runs.append((job["model"], "cdc", job["transport"], r, shuffle))
    expected = []
    for model in ("dnn", "cnn"):
        expected += [(model, a) for a in ("ssgd", "asgd", "ddp")]
        for transport, r in itertools.product(("dask", "direct"), range(1, 5)):
            shuffles = ("coded", "uncoded", "summed", "hybrid") if 1 < r < 4 else ("coded",)
            expected += [(model, "cdc", transport, r, s) for s in shuffles]
    assert sorted(runs) == sorted(expected) and len(runs) == len(expected)
    c = cfg  # bench_cdc_ends, whose conditions are bench's
    assert (c.cluster.kind, c.cluster.n_workers, c.cluster.bandwidth_mbit) == ("netem", 4, 100)
    assert (c.dataset.name, list(c.dataset.shape), c.dataset.n_samples) == (
        "synthetic",
        [1, 28, 28],
        4096,
    )
    assert (c.train.steps, c.train.batch_size, c.train.eval_every) == (30, 240, 0)


@pytest.mark.slow
@pytest.mark.parallel_safe
def test_a_small_bench_on_a_local_cluster_runs_its_sweeps_and_reads_them(tmp_path, capsys):
    out = tmp_path / "bench"
    flags = ["--cluster", "local", "--workers", "2", "--models", "dnn", "--baselines", "ssgd"]
    flags += ["--redundancies", "1,2", "--transports", "direct", "--steps", "2"]
    flags += ["--batch-size", "32", "--samples", "256", "--out", str(out)]
    flags += ["model.hidden=[16]", "cluster.processes=false"]  # workers as threads: seconds
    assert bench.main(flags) == 0
    table = capsys.readouterr().out
    with open(out / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["algorithm"], r["r"]) for r in rows] == [("ssgd", ""), ("cdc", "1"), ("cdc", "2")]
    assert all(float(r["step_ms"]) > 0 for r in rows)
    ssgd = float(rows[0]["step_ms"])
    assert [float(r["vs_ssgd"]) for r in rows] == [
        round(float(r["step_ms"]) / ssgd, 3) for r in rows
    ]
    assert "| dnn | cdc | 2 | coded | direct |" in table
    assert bench.main(["--read", str(out)]) == 0  # only reads: the same table
    assert capsys.readouterr().out == table
    assert bench.main(flags) == 2  # the folder holds runs: no second bench into it
