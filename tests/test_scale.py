"""The scale model: its arithmetic, the timers it dilates, the fidelity check (on samples made
up, and on a machine overloaded on purpose), and a run under it on the emulated network."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

import dcoded.config
import dcoded.run
from dcoded import netem, scale
from dcoded.engine import straggle
from dcoded.engine.driver import frozen_after
from dcoded.results import sweep_table
from dcoded.summary import format_results
from tests.test_netem import _qdisc_rates, _transfer, needs_netem, netem_config

CAN_CGROUP = os.geteuid() == 0 and scale.usable() is None


# --------------------------------------------------------------------------- the arithmetic


@pytest.mark.parametrize("hosts", [3, 6, 10, 18, 34])
@pytest.mark.parametrize("host_cores", [0.5, 1, 2])
@pytest.mark.parametrize("cores", [2, 16])
def test_quotas_add_up_to_the_fraction_and_the_tdf_follows(hosts, host_cores, cores):
    m = scale.plan(host_cores, hosts, cores)
    if host_cores <= 1:  # one core each, round-robin: the busiest core's hosts fill its share
        busiest = max(sum(m.cpu(i) == c for i in range(hosts)) for c in range(cores))
        assert busiest == math.ceil(hosts / cores)
        assert m.tdf == pytest.approx(host_cores * busiest / scale.QUOTA_FRACTION)
        assert m.quota_cores * busiest == pytest.approx(scale.QUOTA_FRACTION)
    else:
        assert m.cpu(0) is None
        assert m.tdf == pytest.approx(host_cores * hosts / (cores * scale.QUOTA_FRACTION))
        assert m.quota_cores * m.hosts == pytest.approx(cores * scale.QUOTA_FRACTION)
    assert m.quota_cores * m.hosts <= cores * scale.QUOTA_FRACTION + 1e-9
    quota_us, period_us = m.quota()
    assert quota_us >= 1000 and period_us >= scale.PERIOD_US  # the kernel's least quota
    assert quota_us / period_us == pytest.approx(m.quota_cores, rel=2e-3)


def test_a_larger_dilation_shrinks_the_quotas_and_a_smaller_one_is_refused():
    least = scale.plan(1, 6, 2)
    double = scale.plan(1, 6, 2, dilation=2 * least.tdf)
    assert double.tdf == 2 * least.tdf and double.quota_cores == pytest.approx(
        least.quota_cores / 2
    )
    with pytest.raises(ValueError, match=r"cluster.dilation=4 .* need at least 5"):
        scale.plan(1, 6, 2, dilation=4)
    for bad in (True, "fast"):
        with pytest.raises(ValueError, match=r"cluster\.dilation"):
            scale.plan(1, 6, 2, dilation=bad)
    with pytest.raises(ValueError, match=r"cluster\.host_cores=0"):
        scale.plan(0, 6, 2)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["cluster.dilation=0.1"], "cluster.dilation=0.1 is not allowed"),
        (["cluster.host_cores=0"], "cluster.host_cores=0 is not allowed"),
        (["cluster.dilation=fast"], "cluster.dilation='fast' is not allowed"),
        (["cluster.scale_model=maybe"], "cluster.scale_model='maybe' is not allowed"),
    ],
)
def test_bad_scale_settings_are_one_line_before_anything_runs(overrides, needle):
    cfg = netem_config("cluster.scale_model=true", *overrides)
    with pytest.raises(dcoded.errors.ConfigError, match=needle):
        dcoded.config.build_spec(cfg)


# --------------------------------------------------------------------------- the timers


def _driver_spec(tdf: float | None, *overrides: str):
    """The spec the emulated network's driver builds, told the TDF as its parent tells it."""
    c = dcoded.config.plain(netem_config(*overrides))
    c["cluster"]["given"] = dict(c["cluster"])
    c["cluster"]["netem"] = netem.Links.from_config(c["cluster"]).as_dict()
    if tdf is not None:
        c["cluster"]["scale"] = scale.plan(1, 6, 2, dilation=tdf).as_dict()
    return dcoded.config.build_spec(c)[0]


def test_every_timer_that_stands_for_network_or_compute_time_is_dilated():
    common = ("transport=multicast", "cluster.n_workers=4", "train.step_timeout_s=30")
    plain, dilated = _driver_spec(None, *common), _driver_spec(8.0, *common)
    assert (plain.dilation, dilated.dilation) == (1.0, 8.0)
    assert dilated.step_timeout_s == 8 * plain.step_timeout_s == 240
    assert dilated.replace_within_s == 8 * plain.replace_within_s
    assert dilated.repair_after_s == pytest.approx(8 * plain.repair_after_s)
    assert dilated.pace_mbit == {k: v / 8 for k, v in plain.pace_mbit.items()}
    direct = [_driver_spec(t, "transport=direct", *common[1:]) for t in (None, 8.0)]
    assert direct[1].pace_mbit == {k: v / 8 for k, v in direct[0].pace_mbit.items()}
    # what the math depends on does not change
    assert (dilated.placement.g, dilated.redundancy, dilated.steps) == (
        plain.placement.g,
        plain.redundancy,
        plain.steps,
    )
    # a frozen worker's silence: the floors dilate, a measured median is dilated already
    assert frozen_after(None, 8.0) == 8 * frozen_after(None)
    assert frozen_after(0.01, 8.0) == 8 * frozen_after(0.01)
    assert frozen_after(20.0, 8.0) == frozen_after(20.0)


def test_a_straggler_stall_lasts_tdf_times_longer_and_is_recorded_undilated():
    class Spec:
        def __init__(self):
            self.straggle = {"model": "stall", "p": 1.0, "stall_ms": 20.0}
            self.seed, self.dilation = 0, 4.0

    injected = straggle.Injector(Spec(), rank=0, step=0, throttled=False)
    t0 = time.monotonic()
    injected.before()
    slept = time.monotonic() - t0
    assert slept >= 0.080  # 20 ms dilated 4x
    assert injected.fields()["drawn_ms"] == 20.0
    assert injected.fields()["slept_ms"] == pytest.approx(1000 * slept / 4, rel=0.05)


def test_dasks_own_timers_are_dilated_for_the_hosts():
    import dask.config
    from dask.utils import parse_timedelta

    env = scale.dask_timers(3.0)
    assert len(env) == len(scale.DASK_TIMERS)
    for key in scale.DASK_TIMERS:
        name = "DASK_" + "__".join(p.upper().replace("-", "_") for p in key.split("."))
        given = parse_timedelta(dask.config.get(key), default="s")
        assert parse_timedelta(env[name]) == pytest.approx(3.0 * given)


def test_cpus_are_kept_awake_while_held_and_let_go_after():
    awake = scale.CpusAwake()
    if os.geteuid() != 0 or not scale.CPU_LATENCY.exists():
        assert not awake.held
        return
    assert awake.held
    awake.close()
    assert not awake.held
    awake.close()  # twice is harmless


# --------------------------------------------------------------------------- fidelity


def _samples(idle_fractions, hosts=None, queues=None):
    """Monitor samples one second apart with the machine idle these fractions of each."""
    out, idle, total = [], 0.0, 0.0
    for i in range(len(idle_fractions) + 1):
        s = {"t": float(i), "unix": 1000.0 + i, "idle": idle, "total": total}
        if hosts:
            s["hosts"] = hosts[i]
        if queues:
            s["queues"] = queues[i]
        out.append(s)
        if i < len(idle_fractions):
            idle += 200 * idle_fractions[i]
            total += 200
    return out


def test_fidelity_holds_where_the_machine_kept_idle_and_fails_where_it_did_not():
    m = scale.plan(1, 4, 2)
    ok = scale.judge(_samples([0.5] * 20), m, {})
    assert ok["ok"] and ok["problems"] == [] and ok["idle"]["median"] == pytest.approx(0.5)
    one_bad = scale.judge(_samples([0.5] * 19 + [0.0]), m, {})  # 1 of 20: within 95%
    assert one_bad["ok"]
    bad = scale.judge(_samples([0.5] * 10 + [0.05] * 10), m, {})
    assert (
        not bad["ok"]
        and "idle 5%" in bad["problems"][0]
        and "10 of 20 samples" in bad["problems"][0]
    )
    # outside the training loop's window the machine may be busy (start-up, the last copy)
    windowed = scale.judge(_samples([0.0] * 5 + [0.5] * 10 + [0.0] * 5), m, {}, [1005, 1015])
    assert windowed["ok"] and windowed["idle"]["samples"] == 10


def test_fidelity_fails_on_a_host_above_its_quota_and_on_a_link_off_its_rate():
    m = scale.plan(1, 2, 2)  # 0.6 of a core each
    use = [
        {"w0": {"usage_ns": int(i * 0.9e9)}, "w1": {"usage_ns": int(i * 0.5e9)}} for i in range(4)
    ]
    j = scale.judge(_samples([0.5] * 3, hosts=use), m, {})
    assert j["problems"] == ["host w0 used 1.50 of its quota"]
    assert j["hosts"]["w1"]["cpu_s"] == pytest.approx(1.5)
    mb = 1e6 / 8  # bytes a second at 1 Mbit/s
    queues = [
        {
            "fast": {"bytes": int(i * 15 * mb), "backlog": 0},
            "slow": {"bytes": int(i * 5 * mb), "backlog": 9000},
        }
        for i in range(4)
    ]
    j = scale.judge(_samples([0.5] * 3, queues=queues), m, {"fast": 10.0, "slow": 10.0})
    # the shaper did not hold: 1.5 of its rate, less the 16 kB its bucket may pass at once
    assert j["problems"] == ["link fast ran at 1.49 of its rate"]
    assert j["links"]["fast"]["burst_bytes"] == 16_000
    # a queue backlogged at both ends of an interval: reported, not judged (it may have emptied
    # in between; a link starved of CPU shows as a machine without idle)
    assert j["links"]["slow"]["backlogged_s"] == 3 and j["links"]["slow"]["least"] == 0.5
    assert j["links"]["fast"]["least"] is None


def test_a_slow_link_passing_its_bucket_on_top_of_its_rate_holds_and_one_beyond_it_fails():
    # 1 Mbit/s a second at 5x dilation (5 Mbit/s emulated): a 16 kB bucket is 0.13 s of its
    # traffic, which a tbf may pass at once after idling; more than that is the shaper's fault
    m = scale.plan(1, 5, 2)
    mb = 1e6 / 8
    held = [{"q": {"bytes": int(i * (mb + 16_000)), "backlog": 0}} for i in range(4)]
    j = scale.judge(_samples([0.5] * 3, queues=held), m, {"q": 1.0})
    assert j["links"]["q"]["busiest"] == pytest.approx(1.0) and not j["problems"]
    beyond = [{"q": {"bytes": int(i * (1.25 * mb + 16_000)), "backlog": 0}} for i in range(4)]
    j = scale.judge(_samples([0.5] * 3, queues=beyond), m, {"q": 1.0})
    assert j["problems"] == ["link q ran at 1.25 of its rate"]


def test_a_host_slower_under_its_quota_is_judged_against_its_corrected_quota():
    m = scale.plan(1, 2, 2)  # 0.6 of a core each: 6000 us of 10000
    use = [{"w0": {"usage_ns": int(i * 0.66e9)}} for i in range(4)]  # 1.1 of the plan's quota
    assert scale.judge(_samples([0.5] * 3, hosts=use), m, {})["problems"] == [
        "host w0 used 1.10 of its quota"
    ]
    slower = {"speed": 0.9, "quota_us_in_force": scale.corrected_quota(6000, 10000, 0.9)}
    j = scale.judge(_samples([0.5] * 3, hosts=use), m, {}, compute=slower)
    assert j["ok"] and j["hosts"]["w0"]["share_of_quota"] == pytest.approx(0.99, abs=0.01)
    # 0.35: corrected to 0.7 only, its 10 calls of 2 ms a step read 2x long: 20 ms more
    too_slow = {
        "speed": 0.35,
        "cpu_ms_free": 2.0,
        "calls_per_step": 10,
        "quota_us_in_force": scale.corrected_quota(6000, 10000, 0.35),
    }
    j = scale.judge(_samples([0.5] * 3, hosts=use), m, {}, compute=too_slow, step_s=0.1)
    assert not j["ok"] and j["problems"] == [
        "the hosts computed at 0.35 of their unthrottled speed under the quota, corrected to "
        "0.7 only: the step's compute reads 2.00x long, 20% of the step"
    ]
    j = scale.judge(_samples([0.5] * 3, hosts=use), m, {}, compute=too_slow, step_s=1.0)
    assert j["ok"] and j["compute_bend"] == pytest.approx(0.02)  # 20 ms of a 1 s step


def test_the_speed_probe_throttles_only_its_own_rounds_and_lifts_the_quota(tmp_path):
    quota = tmp_path / "cpu.cfs_quota_us"  # a file: the writes are what is checked here
    quota.write_text("-1")
    seen = []

    def work():
        seen.append(quota.read_text())
        sum(i * i for i in range(2000))

    got = scale.measure_speed(work, str(quota), 1234, probe_s=0.01)
    assert quota.read_text() == "-1"
    calls = got["calls"] // scale.PROBE_ROUNDS
    assert got["calls"] == calls * scale.PROBE_ROUNDS
    # the warm-up and the first timing call, then each round: unthrottled, throttled
    assert seen[:2] == ["-1", "-1"]
    assert seen[2:] == (["-1"] * calls + ["1234"] * calls) * scale.PROBE_ROUNDS
    assert got["cpu_ms_free"] > 0 and got["cpu_ms_quota"] > 0

    def fails_throttled():
        if quota.read_text() != "-1":
            raise RuntimeError("the gradient failed")

    with pytest.raises(RuntimeError):
        scale.measure_speed(fails_throttled, str(quota), 1234, probe_s=0.01)
    assert quota.read_text() == "-1"  # lifted whatever happened


def test_the_probe_times_one_workers_gradient_call_and_only_under_the_scale_model():
    from dcoded.coding.placement import Placement

    for overrides in (
        ["cluster.n_workers=4", "coding.redundancy=2"],
        ["cluster.n_workers=8", "coding.redundancy=2", "coding.group_size=4"],  # 2 clusters
        ["cluster.n_workers=6", "coding.redundancy=3", "coding.group_size=3"],
        ["algorithm=ddp", "cluster.n_workers=4"],
    ):
        spec, _, _ = dcoded.config.build_spec(
            dcoded.config.compose_config([*overrides, "train.batch_size=240"])
        )
        if spec.algorithm == "cdc":  # the engine's own sub-batches, the first of cluster 0
            p = Placement(spec.n_workers, spec.redundancy, spec.group_size)
            first = p.sub_batch_slices(240)[0][0]
            want = (first.stop - first.start, sum(0 in t for t in p.sub_batches))
        else:
            want = (240 // spec.n_workers, 1)
        assert dcoded.scale.probe_samples(spec) == want, overrides
    ctx = object()  # nothing of it is read without a scale model
    assert dcoded.scale.speed_probe(ctx, None) == (ctx, None)
    assert dcoded.scale.speed_probe(ctx, {"tdf": 5.0}) == (ctx, None)  # no file to throttle


def test_the_quota_is_corrected_for_the_speed_within_its_bounds():
    assert scale.corrected_quota(3000, 10000, 0.9) == 3333
    assert scale.corrected_quota(3000, 10000, 1.2) == 3000  # faster than free: noise
    assert scale.corrected_quota(3000, 10000, 0.1) == round(3000 / scale.SPEED_MIN)
    assert scale.corrected_quota(9000, 10000, 0.8) == 10000  # never above the host's core
    assert scale.corrected_quota(15000, 10000, 0.75, host_cores=2) == 20000  # two, unpinned
    assert scale.corrected_quota(25000, 10000, 0.9, host_cores=2) == 25000  # never lowered


def test_a_slow_worker_is_a_fraction_of_its_hosts_corrected_quota(monkeypatch):
    import dataclasses

    from dcoded.engine import registry

    spec, _, _ = dcoded.config.build_spec(
        dcoded.config.compose_config(
            ["straggle=slow", "straggle.workers=[1]", "straggle.speed=0.5"]
        )
    )
    made = []

    class Made:  # what the worker's cgroup would get, without moving this process into it
        def __init__(self, name, speed, cores, n_workers):
            self.quota_us, self.period_us = straggle.quota(speed, cores, n_workers)
            made.append(self.quota_us / self.period_us)

        def describe(self):
            return "made"

    monkeypatch.setattr(straggle, "Throttle", Made)
    monkeypatch.setattr(straggle, "cgroup_usable", lambda: True)
    monkeypatch.setenv("DCODED_HOST_CORES", "0.2")  # the host's plan: 0.2 of a core
    run_id = f"sm{os.getpid()}"
    for scaled in (1.0, 1.25):  # the driver's probe found the hosts 0.8 as fast throttled
        registry.throttle(run_id, 1, dataclasses.replace(spec, host_quota_scale=scaled))
    registry.drain_records(run_id)  # the throttle records it kept for a driver
    assert made == [pytest.approx(0.5 * 0.2, rel=0.01), pytest.approx(0.5 * 0.2 * 1.25, rel=0.01)]


BURN = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass\n"  # noqa: E501


def _burners(n: int, seconds: float, preexec=None) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", BURN, str(seconds)], preexec_fn=preexec)
        for _ in range(n)
    ]


@pytest.mark.slow  # one at a time: it measures the machine's idle CPU
@pytest.mark.skipif(not CAN_CGROUP, reason="needs root and the cgroup v1 cpu and cpuacct")
def test_quotas_hold_and_fidelity_fires_on_a_machine_overloaded_on_purpose():
    """Two hosts, each a burner in its quota: the quotas hold (each uses about its share, no
    more) and the machine keeps its idle, so fidelity holds. Then as many burners as cores
    outside any quota: the idle is gone, and the check says so."""
    m = scale.plan(1, 2)
    groups = scale.HostGroups(f"test{os.getpid()}", ["a", "b"], m)
    try:
        monitor = scale.Monitor(groups).start()
        groups.limit()
        procs = [p for name in ("a", "b") for p in _burners(1, 4.0, groups.enter(name))]
        for p in procs:
            p.wait()
        held = scale.judge(monitor.stop(), m, {})
        assert held["ok"], held
        for name in ("a", "b"):
            share = held["hosts"][name]["share_of_quota"]
            assert 0.6 < share <= 1 + scale.QUOTA_TOLERANCE, held["hosts"]
            assert held["hosts"][name]["nr_throttled"] > 0
        monitor = scale.Monitor(groups).start()
        procs = _burners(int(scale.machine_cores()), 4.0)
        for p in procs:
            p.wait()
        over = scale.judge(monitor.stop(), m, {})
        assert not over["ok"] and "the quotas and the kernel competed" in over["problems"][0]
    finally:
        groups.remove()
    assert not groups.cpu("a").exists() and not groups.acct("b").exists()


# --------------------------------------------------------------------------- on the network


@needs_netem
@pytest.mark.skipif(not CAN_CGROUP, reason="needs the cgroup v1 cpu and cpuacct")
def test_links_are_dilated_and_keep_their_queues_in_bytes():
    """At TDF 2 a 40 Mbit/s link is shaped at 20 Mbit/s, its queue twice as long in time."""
    model = scale.plan(1, 3, dilation=max(2.0, scale.plan(1, 3).tdf))
    net = netem.build(1, netem.Links(rate_mbit=40, queue_ms=10), model)
    try:
        rate = 40 / model.tdf
        assert _qdisc_rates(net) == {f"{rate:g}Mbit"}
        nbytes = 1_500_000
        seconds = _transfer(net, "w0", "drv", nbytes)
        assert 0.85 * nbytes * 8 / (rate * 1e6) < seconds, seconds
        assert set(netem.queue_rates(net).values()) == {rate}
        assert set(netem.queue_counters(net)) == {"sched in", "w0 in", "drv in"}
        assert all(p.exists() for p in net.groups.made)
    finally:
        netem.destroy(net)
    assert not any(p.exists() for p in [net.groups.cpu("w0"), net.groups.acct("drv")])


@pytest.mark.slow
@needs_netem
@pytest.mark.skipif(not CAN_CGROUP, reason="needs the cgroup v1 cpu and cpuacct")
@pytest.mark.timeout(900)
def test_a_run_under_the_scale_model_reports_every_field_and_the_same_bits(tmp_path):
    common = ["cluster.n_workers=3", "train.steps=30", "cluster.bandwidth_mbit=100"]
    s = dcoded.run.run(netem_config(*common, "cluster.scale_model=true"), out_dir=tmp_path / "sm")
    plain = dcoded.run.run(netem_config(*common), out_dir=tmp_path / "plain")
    assert s["param_sha256"] == plain["param_sha256"]  # the scale model changes no bit
    on_disk = json.loads((tmp_path / "sm" / "summary.json").read_text())
    assert on_disk == s
    m = s["scale_model"]
    assert m["hosts"] == 5 and m["tdf"] == pytest.approx(m["least_tdf"])
    assert m["pinned"] and m["cpus_kept_awake"]  # root holds /dev/cpu_dma_latency
    assert m["quota_cores"] * m["hosts"] <= m["machine_cores"] * scale.QUOTA_FRACTION + 1e-9
    assert set(m["hosts_used"]) == {"sched", "w0", "w1", "w2", "drv"}
    for name, used in m["hosts_used"].items():  # over the loop: the workers computed in it
        assert used["cpu_s"] > 0 or not name.startswith("w"), (name, used)
        assert used["nr_periods"] >= used["nr_throttled"] >= 0
        if s["fidelity"]["quotas_judged"]:  # else its samples hold unthrottled start-up
            assert used["share_of_quota"] <= 1 + scale.QUOTA_TOLERANCE, (name, used)
    compute = m["compute"]  # the driver's probe of the compute speed under the quota
    assert compute["calls"] % scale.PROBE_ROUNDS == 0 and compute["cpu_ms_quota"] > 0
    assert compute["samples"] == s["batch_size"] // s["n_sub_batches"]  # one cluster
    assert compute["calls_per_step"] == math.comb(2, s["redundancy"] - 1)  # K = 3
    assert s["fidelity"]["compute_bend"] is not None
    assert compute["quota_us_in_force"] == scale.corrected_quota(
        m["quota_us"], m["period_us"], compute["speed"], m["host_cores"]
    )
    assert s["time_s_undilated"]["step_median"] == pytest.approx(
        s["time_s"]["step_median"] / m["tdf"]
    )
    fid = s["fidelity"]
    assert set(fid) >= {"ok", "problems", "idle", "links", "tolerance"}
    assert fid["idle"]["samples"] >= 1 and set(fid["links"]) >= {"w0 in", "drv in"}
    assert s["loop_unix_s"][0] <= s["loop_unix_s"][1]
    assert "plain" not in s and "scale_model" not in plain and "fidelity" not in plain
    table = format_results(s)
    assert "scale model: 5 hosts of 1 core" in table
    assert f"a gradient of {compute['samples']} samples ran at {compute['speed']:.2f}" in table
    rows, columns = sweep_table(
        [{"job": 0, "overrides": {}, "status": "finished", "summary": s, "error": None}]
    )
    assert "fidelity" in columns and rows[0]["fidelity"] in ("held", "outside")
    assert rows[0]["step_ms"] == pytest.approx(1e3 * s["time_s_undilated"]["step_median"])
    left = [p for p in scale.CPU_ROOT.glob(f"{scale.GROUP_PREFIX}{netem.prefix()}-*")]
    assert left == []


@needs_netem
@pytest.mark.skipif(not CAN_CGROUP, reason="needs the cgroup v1 cpu and cpuacct")
def test_cleanup_removes_the_host_groups_of_a_run_that_is_gone():
    run = f"{netem.prefix()}-dead00p{2**22 + 7}"  # a pid no process has
    groups = scale.HostGroups(run, ["w0"], scale.plan(1, 3))
    live = scale.HostGroups(f"{netem.prefix()}-live00p1", ["w0"], scale.plan(1, 3))  # init's
    try:
        gone, _ = netem.cleanup()
        assert str(groups.cpu("w0")) in gone and not groups.acct("w0").exists()
        assert live.cpu("w0").exists() and live.acct("w0").exists()  # a live run's: spared
    finally:
        groups.remove()
        live.remove()
