"""The step-time model: its closed forms against enumeration and hand counts, its refusals, its
fit, and its error on recorded runs (``tests/data/scaling_runs.json``: the scaling study's
summaries, cut to what a prediction reads plus the measured median step; rebuilt by
``python -m dcoded.predict --record tests/data/scaling_runs.json SWEEP_DIR ...``)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from dcoded import predict as P
from dcoded.coding import bounds
from dcoded.coding.messages import algorithm_messages
from dcoded.predict import calibrate as C
from dcoded.predict import cli
from dcoded.topology import Shape, bucket_bytes, bucket_seconds

RECORDED = Path(__file__).parent / "data" / "scaling_runs.json"
ZERO = P.Calibration.zero(samples_per_s=math.inf)


def _scenario(algorithm="cdc", K=4, **kw):
    kw.setdefault("n_params", 100_000)
    kw.setdefault("batch_size", 960)
    kw.setdefault("rate_mbit", 100.0)
    return P.Scenario(algorithm, n_workers=K, **kw)


def test_ring_all_reduce_bound_is_the_closed_form_on_a_switch_and_a_bus():
    d, rate = 100_000, 100e6 / 8  # bytes/s
    for K in (4, 8, 16):
        switch = P.predict(_scenario("ddp", K), ZERO).bound_s
        bus = P.predict(_scenario("ddp", K, topology="bus"), ZERO).bound_s
        assert switch == pytest.approx(2 * (K - 1) / K * 4 * d / rate)
        assert bus == pytest.approx(2 * (K - 1) * 4 * d / rate)  # K ranks' chunks, one medium


def test_parameter_server_bound_is_the_servers_link():
    d, rate = 100_000, 100e6 / 8
    p = P.predict(_scenario("ssgd", 4), ZERO)
    assert p.bound_s == pytest.approx(2 * 4 * 4 * d / rate)  # K gradients in, K thetas out
    slow = P.predict(_scenario("ssgd", 4, driver_rate_mbit=50.0), ZERO)
    assert slow.bound_s == pytest.approx(2 * p.bound_s)


@pytest.mark.parametrize("K", [5, 6, 8])
@pytest.mark.parametrize("r", [1, 2, 3])
@pytest.mark.parametrize("shuffle", ["coded", "summed"])
@pytest.mark.parametrize("transport", ["direct", "multicast"])
def test_closed_form_loads_match_the_enumerated_messages(K, r, shuffle, transport):
    """Past MAX_ENUMERATED one cluster's loads come from the closed forms: on a switch and a
    bus they must be what enumerating every message gives."""
    multicast = transport == "multicast"
    closed = P._closed_form_loads(K, r, shuffle, None, multicast, Shape("switch"))
    enumerated = [
        bounds.link_bytes(m, K + 1, multicast)
        for m in algorithm_messages("cdc", K, r, None, shuffle).values()
    ]
    for c, e in zip(closed, enumerated, strict=True):
        for kind, rate in (("switch", 1.0), ("bus", 1.0)):
            topology = {"kind": kind, "rate": rate}
            assert bounds.seconds(topology, c) == pytest.approx(bounds.seconds(topology, e))


@pytest.mark.parametrize(
    "K,r,shuffle", [(5, 2, "coded"), (6, 3, "coded"), (6, 2, "summed"), (7, 1, "coded")]
)
def test_closed_form_message_counts_match_enumeration(K, r, shuffle, monkeypatch):
    enumerated = P._message_counts("cdc", K, r, None, shuffle, None)
    P._message_counts.cache_clear()
    monkeypatch.setattr(P, "MAX_ENUMERATED", 0)
    try:
        assert P._message_counts("cdc", K, r, None, shuffle, None) == enumerated
    finally:
        P._message_counts.cache_clear()


def test_a_fat_tree_bound_is_its_busiest_level():
    # 8 workers, racks of 2, pods of 2 racks; rings cross every level once per direction
    s = _scenario("ddp", 8, topology="fattree", rack_size=2, pod_racks=2, oversubscription=2.0)
    rate = 100e6 / 8
    chunk = 2 * 7 / 8 * 4 * 100_000  # what each rank sends to the next
    rack_uplink = 2 * rate / 2  # two hosts behind it at 2:1
    pod_uplink = 2 * rack_uplink / 2
    expected = max(chunk / rate, chunk / rack_uplink, chunk / pod_uplink)
    assert P.predict(s, ZERO).bound_s == pytest.approx(expected)
    assert s.uplink() == 100.0 and s.pod_uplink() == 100.0  # Mbit/s


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"redundancy": 5}, "redundancy=5"),
        ({"K": 6, "group_size": 4}, "group_size=4"),
        ({"K": 16, "redundancy": 3, "batch_size": 500}, "must be >= 560"),
        ({"K": 12, "shuffle": "hybrid", "redundancy": 2, "hybrid_m": 1}, "no hybrid family"),
        ({"K": 256, "redundancy": 3}, "at most 1,000,000"),
        ({"topology": "racks"}, "rack size"),
    ],
)
def test_an_impossible_layout_says_why(change, reason):
    K = change.pop("K", 4)
    with pytest.raises(P.ImpossibleLayout, match=reason):
        P.predict(_scenario("cdc", K, **change), ZERO)


def test_ddp_hides_its_exchange_behind_the_backward_only_past_one_bucket():
    cal = P.Calibration.zero(samples_per_s=100.0)
    small = P.predict(_scenario("ddp", 8, n_params=109_386), cal)
    assert small.hidden_s == 0.0  # 0.44 MB: one bucket, nothing to overlap with
    big = P.predict(_scenario("ddp", 8, n_params=25_000_000), cal)
    assert 0 < big.hidden_s <= 2 / 3 * big.compute_s
    assert big.step_s < big.compute_s + big.links_s


def test_compute_is_shared_on_one_machine_and_counts_sub_batches():
    cal = P.Calibration.zero(samples_per_s=1000.0, per_call_s=0.001)
    alone = P.predict(_scenario("cdc", 8, redundancy=2, batch_size=960), cal)
    # B r / K = 240 samples, C(7, 1) = 7 calls
    assert alone.compute_s == pytest.approx(240 / 1000 + 7 * 0.001)
    shared = P.predict(_scenario("cdc", 8, redundancy=2, batch_size=960, cores=2), cal)
    assert shared.compute_s == pytest.approx(4 * alone.compute_s)


def test_fit_recovers_the_costs_that_made_the_steps():
    truth = {
        "cdc-direct": P.Costs(1.2, 0.0004, 0.03, 0.002, 0.01),
        "ddp": P.Costs(1.1, 0.0002, 0.02, 0.0, 0.005),
    }
    cal = P.Calibration(truth, {"dnn": {"samples_per_s": 5e4, "per_call_s": 2e-4}})
    summaries = []
    for K in (4, 6, 8, 12):
        for algorithm, r, shuffle, topology in [
            ("cdc", 1, "summed", "switch"),
            ("cdc", 2, "coded", "switch"),
            ("cdc", 3, "summed", "bus"),
            ("cdc", 2, "summed", "bus"),
            ("ddp", 1, "coded", "switch"),
            ("ddp", 1, "coded", "bus"),
        ]:
            summary = _summary(algorithm, K, r, shuffle, topology)
            summary["time_s"] = {"step_median": P.predict(P.scenario_of(summary), cal).step_s}
            summaries.append(summary)
    fitted = C.fit(summaries, cal.compute)
    for family, costs in truth.items():
        got = fitted.costs[family]
        for name in ("link_overhead", "per_message_s", "per_step_s", "per_step_cpu_s"):
            assert getattr(got, name) == pytest.approx(getattr(costs, name), rel=1e-6, abs=1e-9)
    for row in C.compare(summaries, fitted):
        assert abs(row["error_pct"]) < 1e-6


def _summary(algorithm, K, r, shuffle, topology, transport="direct"):
    return {
        "algorithm": algorithm,
        "n_workers": K,
        "n_params": 109_386,
        "batch_size": 960,
        "redundancy": r,
        "group_size": K,
        "shuffle": shuffle,
        "hybrid_m": None,
        "transport": transport,
        "model": "dnn",
        "environment": {
            "cores": 2,
            "netem": {"topology": topology, "bandwidth_mbit": 25.0, "driver_bandwidth_mbit": 25.0},
            "per_worker": {f"w{k}": {"host": "vm"} for k in range(K)},
        },
    }


def test_a_prediction_reads_the_config_never_the_recorded_times():
    summary = _summary("cdc", 8, 2, "summed", "switch")
    summary["time_s"] = {"step_median": 0.5, "map": 0.1, "shuffle": 0.2, "params": 0.2}
    first = P.predict(P.scenario_of(summary))
    summary["time_s"] = {k: 10 * v for k, v in summary["time_s"].items()}
    assert P.predict(P.scenario_of(summary)).step_s == first.step_s


def test_predict_summary_prints_the_predicted_then_the_measured_step(tmp_path, capsys):
    summary = _summary("cdc", 4, 2, "coded", "bus", transport="multicast")
    summary["time_s"] = {"step_median": 0.25}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    assert cli.main(["--summary", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    expected = 1e3 * P.predict(P.scenario_of(summary)).step_s
    assert last.startswith(f"predicted {expected:.1f} ms ± ")
    err = P.Calibration.load().fitted_on["error_pct"]["cdc-multicast"]["held_out"]
    assert f"± {err:.0f}% (the worst error of cdc-multicast on runs held out" in last
    assert last.endswith(f"measured 250.0 ms ({100 * (expected / 250 - 1):+.1f}%)")


def test_predict_says_impossible_and_exits_1(capsys):
    assert cli.main(["-K", "6", "-g", "4", "-r", "2"]) == 1
    assert "impossible: group_size=4" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, named",
    [
        (["--rate-gbit", "-5"], "--rate-gbit: -5 is not allowed"),
        (["--rate-mbit", "0"], "--rate-mbit: 0 is not allowed"),
        (["-K", "-4"], "-K: -4 is not allowed"),
        (["--d", "nan"], "--d: nan is not allowed"),
        (["--oversubscription", "x"], "--oversubscription: 'x' is not a number"),
    ],
)
def test_a_negative_or_zero_size_is_refused_not_predicted(args, named, capsys):
    """``--rate-gbit -5`` printed a prediction and exited 0."""
    with pytest.raises(SystemExit) as done:
        cli.main(["-K", "16", "--topology", "switch", *args])
    assert done.value.code == 2
    err = capsys.readouterr()
    assert named in err.err and "predicted" not in err.out


def test_the_defaults_are_the_engines_and_the_help_shows_them(capsys):
    """Its cdc default was ``r=1 summed`` where ``python -m dcoded`` runs ``r=2 coded``."""
    from dcoded.config import config_defaults

    assert cli.main([]) == cli.OUTSIDE  # 10 Gbit/s, a machine per worker: not calibrated
    described = capsys.readouterr().out.splitlines()[0]
    coding = config_defaults()["coding"]
    assert f"r={coding['redundancy']}" in described and coding["shuffle"] in described
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "(default: 10.0)" in capsys.readouterr().out


def _recorded() -> list[dict]:
    return json.loads(RECORDED.read_text())


def test_the_model_stays_within_its_stated_error_on_the_recorded_runs():
    """Every recorded run within the error the model states for its family and topology, on
    the runs it was fitted on (K = 4, 6, 8) and on those held out of the fit (K = 12, 16);
    the calibration is the committed one."""
    runs = _recorded()
    cal = P.Calibration.load()
    assert sorted(cal.fitted_on["held_out_K"]) == [12, 16]
    rows = C.compare(runs, cal)
    assert len(rows) == len(runs) >= 100
    assert {r["held_out"] for r in rows} == {True, False}
    for row in rows:
        limit = P.stated_error(row["family"], row["topology"], row["held_out"])
        assert abs(row["error_pct"]) <= limit, row


def test_the_committed_calibration_is_the_fit_of_the_recorded_runs():
    cal = P.Calibration.load()
    again = C.fit(_recorded(), cal.compute, cal.fitted_on["held_out_K"])
    for family, costs in again.costs.items():
        for name, value in vars(costs).items():
            assert getattr(cal.costs[family], name) == pytest.approx(value, rel=1e-6, abs=1e-12)


def test_outside_its_calibration_it_says_so_instead_of_a_number(tmp_path, capsys):
    """The default local run (loopback) was predicted at +184%; K = 16 multicast on a
    10 Gbit/s bus at 5.35 s a step: neither is what the costs were fitted on."""
    summary = _summary("cdc", 4, 2, "coded", "switch")
    summary["environment"].pop("netem")  # cluster=local: no emulated link
    summary["time_s"] = {"step_median": 0.030}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert cli.main(["--summary", str(tmp_path)]) == cli.OUTSIDE == 3
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("not predicted: outside the calibration (no emulated link (loopback)")
    assert last.endswith("measured 30.0 ms")  # no error of a number it did not give
    args = ["-K", "16", "-r", "3", "--transport", "multicast", "--topology", "bus"]
    assert cli.main(args) == cli.OUTSIDE
    out = capsys.readouterr().out
    assert "10000 Mbit/s (fitted at 25 Mbit/s)" in out
    assert not [ln for ln in out.splitlines() if ln.startswith("predicted")]
    inside = P.predict(P.scenario_of(_summary("cdc", 6, 2, "coded", "switch")))
    assert inside.outside == () and inside.error_pct is not None
    other = P.predict(P.scenario_of(_summary("ssgd", 6, 1, "coded", "switch")))
    fitted = "cdc-direct, cdc-multicast, ddp"
    assert other.outside == (f"no runs of ssgd were fitted (fitted: {fitted})",)


def test_no_prediction_goes_below_its_bound():
    """It predicted link times below its own bound (49.0 against 53.4 ms): the fit holds the
    link time at or above the bound, and no step is predicted shorter than it."""
    cal = P.Calibration.load()
    assert all(c.link_overhead >= 1.0 for c in cal.costs.values())
    for summary in _recorded():
        p = P.predict(P.scenario_of(summary), cal)
        assert p.links_s >= p.bound_s and p.step_s >= p.bound_s - p.bucket_s
    ddp = P.Scenario("ddp", 4, 100_000, 240, 100, bucket_mb=0.01, samples_per_s=1e3)
    hides = P.predict(ddp, P.Calibration.zero())  # what ddp hides is at most its compute
    assert 0 < hides.hidden_s < hides.compute_s and hides.step_s >= hides.bound_s


def test_an_emulated_links_token_bucket_is_taken_off_each_phase_that_moves():
    """``tc tbf`` passes its bucket (about 4 ms of traffic) at full speed after idle: a run on
    the emulated network is predicted with it, once per exchange phase that moves anything
    and never more than the phase's bound; a real link (the default) has none."""
    real = _scenario("cdc", 4, redundancy=2, rate_mbit=100)
    emulated = replace(real, bucket_s=bucket_seconds(100))
    cal = P.Calibration.zero(samples_per_s=1e9)
    a, b = P.predict(real, cal), P.predict(emulated, cal)
    phases, _ = P.phase_seconds(real)
    assert a.bucket_s == 0 and len([t for t in phases if t > 0]) == 2
    assert b.bucket_s == pytest.approx(2 * 0.004) and b.bound_s == a.bound_s
    assert b.step_s == pytest.approx(a.step_s - 0.008)
    nothing = replace(emulated, redundancy=4)  # r = K: no phase moves anything
    assert P.predict(nothing, cal).bucket_s == 0
    tiny = replace(emulated, n_params=100)  # a phase shorter than the bucket
    t = P.predict(tiny, cal)
    assert t.bucket_s == pytest.approx(t.bound_s) and t.step_s >= 0
    netem_run = P.scenario_of(_summary("cdc", 4, 2, "coded", "switch"))
    rate = netem_run.rate_mbit
    assert netem_run.bucket_s == bucket_bytes(rate) / (rate * 1e6 / 8)


def test_a_step_that_sends_nothing_pays_no_exchange_costs():
    """At r = K every worker updates all of θ itself: no launch, barrier or exchange CPU a
    step, only the compute (a dnn step of 3.6 ms was predicted at 10 ms with them)."""
    costs = P.Costs(per_step_s=0.002, per_step_cpu_s=0.003)
    cal = replace(P.Calibration.zero(samples_per_s=1e6), costs={"cdc-direct": costs})
    alone = P.predict(_scenario("cdc", 4, redundancy=4), cal)
    shared = P.predict(_scenario("cdc", 4, redundancy=2), cal)
    assert alone.bound_s == 0 and alone.per_step_s == 0
    assert alone.step_s == pytest.approx(alone.compute_s)
    assert shared.per_step_s == pytest.approx(0.005)


def test_a_scenario_is_hashable_and_describes_itself():
    s = _scenario("cdc", 16, redundancy=2, group_size=4, shuffle="hybrid")
    assert hash(s) == hash(replace(s))
    assert "cdc r=2 g=4 hybrid direct, K=16" in s.describe()


# --------------------------------------------------------------------------- scale model, hold-outs

TRUTH = {
    "cdc-direct": P.Costs(1.2, 0.0004, 0.03, 0.002, 0.01),
    "ddp": P.Costs(1.1, 0.0002, 0.02, 0.0, 0.005),
}
COMPUTE = {
    "dnn": {"samples_per_s": 5e4, "per_call_s": 2e-4},
    "cnn": {"samples_per_s": 2e4, "per_call_s": 5e-4},
}
LAYOUTS = [
    ("cdc", 1, "summed", "switch"),
    ("cdc", 2, "coded", "switch"),
    ("cdc", 3, "summed", "bus"),
    ("cdc", 2, "summed", "bus"),
    ("ddp", 1, "coded", "switch"),
    ("ddp", 1, "coded", "bus"),
]


def _scaled(summary, tdf=5.0, ok=True):
    """``summary`` as a scale-model run: K emulated machines of one core, its wall times
    ``tdf`` times the emulated cluster's."""
    out = json.loads(json.dumps(summary))
    out["scale_model"] = {"tdf": tdf, "least_tdf": tdf, "host_cores": 1.0, "hosts": 6}
    out["fidelity"] = {"ok": ok, "problems": [] if ok else ["idle 4% of the time under 15%"]}
    if "time_s" in out:
        out["time_s_undilated"] = out["time_s"]
        out["time_s"] = {k: tdf * v for k, v in out["time_s"].items()}
    return out


def _timed(summary, scale=1.0):
    """``summary`` with the median step :data:`TRUTH` gives it (times ``scale``): for a
    scale-model run, its undilated step."""
    cal = P.Calibration(TRUTH, COMPUTE)
    step = scale * P.predict(P.scenario_of(summary), cal).step_s
    summary["time_s"] = {"step_median": step}
    if "scale_model" in summary:
        summary["time_s_undilated"] = summary["time_s"]
        summary["time_s"] = {"step_median": summary["scale_model"]["tdf"] * step}
    return summary


def _grid(Ks=(4, 6, 8, 12), rate=25.0, model="dnn", rack_size=None):
    """Synthetic runs of :data:`LAYOUTS` (on racks of ``rack_size``, where given), their steps
    made by :data:`TRUTH`."""
    out = []
    for K in Ks:
        for algorithm, r, shuffle, topology in LAYOUTS:
            summary = _summary(algorithm, K, r, shuffle, "racks" if rack_size else topology)
            summary["model"] = model
            net = summary["environment"]["netem"]
            net["bandwidth_mbit"] = net["driver_bandwidth_mbit"] = rate
            if rack_size:
                net["rack_size"], net["uplink_mbit"] = rack_size, rack_size * rate
            out.append(_timed(summary))
    return out


def test_a_scale_model_run_is_on_K_machines_and_its_step_undilated():
    shared = _summary("cdc", 8, 2, "coded", "switch")
    shared["time_s"] = {"step_median": 0.5, "map": 0.1}
    scaled = _scaled(shared, tdf=5.0)
    assert scaled["time_s"]["step_median"] == 2.5
    assert P.scenario_of(shared).cores == 2 and P.scenario_of(shared).hosts == "shared"
    assert P.scenario_of(scaled).cores is None and P.scenario_of(scaled).hosts == "machines"
    assert C.measured_step(shared) == C.measured_step(scaled) == 0.5
    kept = C.compact(scaled)  # --record keeps what a check reads
    assert P.scenario_of(kept) == P.scenario_of(scaled) and C.measured_step(kept) == 0.5
    assert kept["fidelity"] == {"ok": True, "problems": []}
    assert set(C.compact(shared)) == set(C.compact(scaled)) - {
        "scale_model",
        "time_s_undilated",
        "fidelity",
    }
    # K machines: no K / cores sharing of the compute
    cal = P.Calibration.zero(samples_per_s=1000.0)
    on_one = P.predict(P.scenario_of(shared), cal).compute_s  # 8 workers on 2 cores
    assert on_one == pytest.approx(4 * P.predict(P.scenario_of(scaled), cal).compute_s)


def test_a_fit_on_scale_model_runs_reads_their_undilated_steps():
    runs = [_timed(_scaled(s)) for s in _grid()]  # steps of K machines, from the truth
    assert runs[0]["time_s"]["step_median"] == 5 * C.measured_step(runs[0])
    fitted = C.fit(runs, COMPUTE)
    for row in C.compare(runs, fitted):
        assert abs(row["error_pct"]) < 1e-6 and not row["outside"]
    assert fitted.fitted_on["domain"]["ddp"]["hosts"] == ["machines"]


def test_another_host_kind_is_outside_the_calibration():
    machines = [_timed(_scaled(s)) for s in _grid()]
    on_machines = C.fit(machines, COMPUTE)
    shared = P.scenario_of(_summary("cdc", 6, 2, "coded", "switch"))
    assert P.outside_calibration(shared, on_machines) == [
        "workers sharing one machine (fitted on a machine per worker)"
    ]
    on_shared = C.fit(_grid(), COMPUTE)
    scaled = P.scenario_of(machines[0])
    assert P.outside_calibration(scaled, on_shared) == [
        "a machine per worker (fitted on workers sharing one machine)"
    ]
    assert P.outside_calibration(scaled, on_machines) == []
    # the committed calibration's older domain (shared: true) says the same
    assert P.predict(scaled).outside == (
        "a machine per worker (fitted on workers sharing one machine)",
    )


def test_a_scale_model_run_outside_its_fidelity_is_left_out_of_the_fit(capsys):
    runs = _grid()
    bad = _timed(_scaled(_summary("cdc", 6, 2, "coded", "switch"), ok=False), scale=3.0)
    bad["_path"] = "sweep/7/summary.json"
    fitted = C.fit([*runs, bad], COMPUTE)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "note: left out of the fit, outside the scale model's fidelity (idle 4% of the time "
        "under 15%): sweep/7/summary.json"
    ]
    assert fitted.fitted_on["runs"] == C.fit(runs, COMPUTE).fitted_on["runs"]
    assert fitted.fitted_on["domain"]["cdc-direct"]["hosts"] == ["shared"]
    assert fitted.fitted_on["error_pct"]["cdc-direct"]["fitted"] == 0.0
    assert [r["faithful"] for r in C.compare([runs[0], bad], fitted)] == [True, False]


@pytest.mark.parametrize(
    "hold_out, name, held",
    [
        ({"hold_out_rate": [50]}, "rate_mbit", _grid(rate=50.0)),
        ({"hold_out_rack": [3]}, "rack_size", _grid((6, 8, 12), rack_size=3)),
        ({"hold_out_model": ["cnn"]}, "model", _grid(model="cnn")),
    ],
)
def test_a_hold_out_leaves_its_runs_out_of_the_fit_and_says_their_error(hold_out, name, held):
    fitted_runs = _grid() + _grid((6, 8, 12), rack_size=2)
    runs = fitted_runs + held
    cal = C.fit(runs, COMPUTE, **hold_out)
    (values,) = hold_out.values()
    assert cal.fitted_on[f"held_out_{name}"] == values
    count = lambda rs, f: sum(P.scenario_of(s).family == f for s in rs)  # noqa: E731
    assert cal.fitted_on["runs"] == {f: count(fitted_runs, f) for f in TRUTH}
    rows = C.compare(runs, cal)
    assert [r["held_out_by"] for r in rows] == [[]] * len(fitted_runs) + [[name]] * len(held)
    assert max(abs(r["error_pct"]) for r in rows) < 1e-6  # the truth, fitted without them
    for family, e in cal.fitted_on["error_pct"].items():
        assert e["held_out_by"] == {name: {"runs": count(held, family), "mean": 0.0, "worst": 0.0}}
    # one held-out run 50% slower: its error shows, held out, and the fit is as it was
    off = [*fitted_runs, *held]
    off[-1] = _timed(json.loads(json.dumps(held[-1])), scale=1.5)  # a ddp run
    again = C.fit(off, COMPUTE, **hold_out)
    e = again.fitted_on["error_pct"]["ddp"]
    assert e["fitted"] == 0.0 and e["held_out"] == e["held_out_by"][name]["worst"] == 33.3
    assert e["held_out_by"][name]["mean"] == round(33.3 / count(held, "ddp"), 1)
    assert again.costs == cal.costs


def test_hold_outs_combine_and_the_fit_prints_each_ones_error(tmp_path, capsys):
    runs = _grid() + _grid(rate=50.0) + _grid(model="cnn")
    for i, summary in enumerate(runs):
        (tmp_path / "runs" / str(i)).mkdir(parents=True)
        (tmp_path / "runs" / str(i) / "summary.json").write_text(json.dumps(summary))
    path = tmp_path / "calibration.json"
    P.Calibration({}, COMPUTE).save(path)
    args = ["--fit", str(tmp_path / "runs"), "--calibration", str(path), "--hold-out-K", "12"]
    assert cli.main([*args, "--hold-out-rate", "50", "--hold-out-model", "cnn"]) == 0
    out = capsys.readouterr().out
    cal = P.Calibration.load(path)
    assert [cal.fitted_on[f"held_out_{n}"] for n in C.HOLD_OUTS] == [[12], [50.0], [], ["cnn"]]
    assert cal.fitted_on["runs"] == {"cdc-direct": 12, "ddp": 6}  # K = 4, 6, 8 at 25, dnn
    for family, n in {"cdc-direct": 4, "ddp": 2}.items():  # a grid's runs of it at one K
        by = cal.fitted_on["error_pct"][family]["held_out_by"]
        assert {name: x["runs"] for name, x in by.items()} == {
            "K": 3 * n,  # K = 12 of each grid
            "rate_mbit": 4 * n,
            "model": 4 * n,
        }
    assert "  error on the 12 fitted runs: mean 0.0%, worst 0.0%" in out
    assert "  error on the 16 runs held out by rate_mbit=50: mean 0.0%, worst 0.0%" in out
    assert "  error on the 8 runs held out by model=cnn: mean 0.0%, worst 0.0%" in out
    with pytest.raises(SystemExit):
        cli.main([*args, "--hold-out-rate", "fifty"])
    assert "--hold-out-rate: 'fifty' is not a list such as 12,16" in capsys.readouterr().err


def test_a_model_without_a_compute_rate_is_one_line_not_a_traceback(tmp_path, capsys):
    """``--fit`` on cnn runs with a calibration that has only dnn's rate, and a cnn scenario,
    each raised a KeyError traceback; a corrupt calibration, a JSONDecodeError. Each is now one
    line naming what to do, exit 2."""
    for i, summary in enumerate(_grid(Ks=(4,), model="cnn")):
        (tmp_path / "runs" / str(i)).mkdir(parents=True)
        (tmp_path / "runs" / str(i) / "summary.json").write_text(json.dumps(summary))
    path = tmp_path / "calibration.json"
    P.Calibration({f: P.Costs() for f in P.FAMILIES}, {"dnn": COMPUTE["dnn"]}).save(path)
    for args in (
        ["--fit", str(tmp_path / "runs")],
        ["--model", "cnn", "-K", "4", "--rate-mbit", "25"],
    ):
        assert cli.main([*args, "--calibration", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: no compute rate for model 'cnn' in the calibration (it has")
        assert "--measure-rate model=cnn" in err and err.count("\n") == 1
    path.write_text('{"costs": {')
    assert cli.main(["--calibration", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot read the calibration {path}")


def test_measure_rate_stores_what_it_measured_in_the_calibration(tmp_path, capsys):
    """``--measure-rate`` printed a rate and left the user to copy it into the file by hand;
    now it stores it under its model, keeping the costs, and a fit then finds it."""
    path = tmp_path / "calibration.json"
    P.Calibration({"ddp": P.Costs(link_overhead=1.5)}, {"cnn": COMPUTE["cnn"]}).save(path)
    assert cli.main(["--measure-rate", "model.hidden=[16]", "--calibration", str(path)]) == 0
    printed = json.loads(capsys.readouterr().out.split("\nstored as")[0])
    cal = P.Calibration.load(path)
    assert cal.compute["dnn"] == {k: printed[k] for k in ("samples_per_s", "per_call_s")}
    assert cal.compute["cnn"] == COMPUTE["cnn"] and cal.costs["ddp"].link_overhead == 1.5
    assert printed["samples_per_s"] > 0 and printed["n_params"] == 64 * 16 + 16 + 16 * 10 + 10
    fresh = tmp_path / "new.json"  # none yet: one with the rate alone
    assert cli.main(["--measure-rate", "model.hidden=[16]", "--calibration", str(fresh)]) == 0
    assert set(P.Calibration.load(fresh).compute) == {"dnn"}


def test_a_fit_takes_each_models_compute_from_its_runs_maps_not_the_measured_rate():
    """The maps of runs whose map is one gradient call (ssgd) show the compute as the workers
    ran it: the fit takes each model's rate from them (a model without such runs keeps the
    rate it was given), and the costs it then fits are the ones that made the steps."""
    in_runs = {"samples_per_s": 2e4, "per_call_s": 1e-3}  # what the workers really did
    runs = []
    for K in (4, 6, 8, 12):
        for algorithm, r, shuffle, topology in [*LAYOUTS, ("ssgd", 1, "coded", "switch")]:
            summary = _scaled(_summary(algorithm, K, r, shuffle, topology))  # K machines
            s = P.scenario_of(summary)
            truth = {**TRUTH, "ssgd": P.Costs(1.05, 0.001, 0.01, 0.0, 0.0)}
            cal = P.Calibration(truth, {"dnn": in_runs})
            step = P.predict(s, cal).step_s
            summary["time_s_undilated"] = {
                "step_median": step,
                "map": P.compute_seconds(s, cal, truth[s.family].per_sub_batch_s),
            }
            runs.append(summary)
    given = {"dnn": {"samples_per_s": 5e4, "per_call_s": 2e-4}, "cnn": COMPUTE["cnn"]}
    got = C.fit(runs, given)
    assert got.compute["dnn"]["samples_per_s"] == pytest.approx(2e4, rel=1e-6)
    assert got.compute["dnn"]["per_call_s"] == pytest.approx(1e-3, rel=1e-6)
    assert got.compute["dnn"]["runs"] == 4 and got.compute["cnn"] == COMPUTE["cnn"]
    for family in ("cdc-direct", "ddp", "ssgd"):
        assert got.fitted_on["error_pct"][family]["fitted"] < 0.1
    # measured alone, the rate 2.5 times too fast: every fitted error is larger
    alone = C.fit(
        [
            {**r, "time_s_undilated": {"step_median": r["time_s_undilated"]["step_median"]}}
            for r in runs
        ],
        given,
    )
    assert alone.compute["dnn"] == given["dnn"]
    assert alone.fitted_on["error_pct"]["cdc-direct"]["fitted"] > 1.0


def test_measure_rate_with_an_override_it_cannot_apply_is_one_line(tmp_path, capsys):
    """An override the composed config lacks (a netem link rate) ended in Hydra's traceback."""
    path = tmp_path / "calibration.json"
    assert (
        cli.main(["--measure-rate", "cluster.bandwidth_mbit=100", "--calibration", str(path)]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(
        "error: --measure-rate cluster.bandwidth_mbit=100: cluster.bandwidth_mbit is not a "
        "setting of cluster=local but of cluster=netem"
    )
    assert err.count("\n") == 1 and not path.exists()
