"""The benchmark writes its table and CSV with ratios measured in the same run (no timing is
asserted: speed is judged by reading the table, not by tests)."""

from __future__ import annotations

import csv

import pytest

from dcoded import bench


def test_plan_covers_baselines_and_every_useful_redundancy():
    runs = bench.plan(4, None)
    assert runs[:3] == [["algorithm=ssgd"], ["algorithm=asgd"], ["algorithm=ddp"]]
    coded = [r for r in runs if "coding.shuffle=coded" in r]
    uncoded = [r for r in runs if "coding.shuffle=uncoded" in r]
    summed = [r for r in runs if "coding.shuffle=summed" in r]
    # uncoded and summed differ from coded only for 1 < r < K
    assert len(coded) == 4 and len(uncoded) == 2 and len(summed) == 2
    assert all("transport=direct" in r for r in runs[3:])
    both = bench.plan(4, [2], ("dask", "direct"), ("summed",))
    assert both[3:] == [
        ["algorithm=cdc", "coding.redundancy=2", "coding.shuffle=summed", f"transport={t}"]
        for t in ("dask", "direct")
    ]


def test_ratios_are_to_the_baselines_of_the_same_model():
    rows = [
        {"model": "dnn", "algorithm": "ssgd", "step_ms": 10.0},
        {"model": "dnn", "algorithm": "ddp", "step_ms": 5.0},
        {"model": "dnn", "algorithm": "cdc", "step_ms": 20.0},
        {"model": "cnn", "algorithm": "ssgd", "step_ms": 40.0},
        {"model": "cnn", "algorithm": "cdc", "step_ms": 20.0},
    ]
    bench.add_ratios(rows)
    assert rows[2]["vs_ssgd"] == 2.0 and rows[2]["vs_ddp"] == 4.0
    assert rows[4]["vs_ssgd"] == 0.5 and rows[4]["vs_ddp"] is None


@pytest.mark.slow
def test_bench_on_a_local_cluster_writes_table_and_csv(tmp_path):
    code = bench.main(
        [
            "--cluster",
            "local",
            "--workers",
            "2",
            "--models",
            "dnn",
            "--redundancies",
            "1,2",
            "--steps",
            "2",
            "--batch-size",
            "32",
            "--samples",
            "256",
            "--transports",
            "dask,direct",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["algorithm"] for r in rows] == ["ssgd", "asgd", "ddp"] + ["cdc"] * 4
    assert [r["transport"] for r in rows[3:]] == ["dask", "dask", "direct", "direct"]
    assert all(r["step_ms"] for r in rows)
    assert float(rows[0]["vs_ssgd"]) == 1.0 and float(rows[2]["vs_ddp"]) == 1.0
    assert "| dnn | cdc | 2 | coded | direct |" in (tmp_path / "results.md").read_text()
