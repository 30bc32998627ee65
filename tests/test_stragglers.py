"""Stragglers: the injected models (the same draws for every algorithm) and straggler-tolerant
delivery for cdc, bit for bit against ``serial`` (which knows nothing of stragglers).

The rebuilding rule is checked first without Dask: every owner, for every set of late workers
(and late owners that computed only part of their map), rebuilds its segment from the messages
of the workers not late and plain values from finished holders, and gets ``serial``'s bits;
the plain bytes equal the closed form's bound when the late workers computed nothing."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import pytest

import dcoded.errors
from dcoded.coding import Placement, hybrid_plan
from dcoded.coding.codec import as_bits
from dcoded.coding.hybrid import charged_value, feasible_m
from dcoded.coding.messages import shuffle_receives
from dcoded.coding.shuffles import SHUFFLES
from dcoded.coding.stragglers import (
    backup_bound,
    backups,
    decode_requests,
    encode_requests,
    holder,
    length,
    next_round,
    value_piece,
)
from dcoded.engine import straggle
from dcoded.engine.cdc import payload, reduce_segment
from dcoded.engine.serial import reduce_in_order
from dcoded.run import run
from tests.conftest import ctrl_c_able, tiny_config

ROOT = Path(__file__).resolve().parent.parent

# (K, r, shuffle, hybrid m)
LAYOUTS = [
    (3, 2, "coded", None),
    (4, 2, "coded", None),
    (4, 3, "coded", None),
    (5, 3, "coded", None),
    (4, 2, "uncoded", None),
    (4, 3, "uncoded", None),
    (4, 2, "summed", None),
    (4, 3, "summed", None),
    (5, 3, "summed", None),
    *[(5, 3, "hybrid", m) for m in feasible_m(5, 3)],
    *[(4, 3, "hybrid", m) for m in feasible_m(4, 3)],
    (3, 2, "pieces", None),
    (4, 2, "pieces", None),
    (5, 3, "pieces", None),
]


def test_every_registered_shuffle_is_held_to_the_rules_below():
    """A new scheme joins LAYOUTS: not waiting for stragglers is part of what a shuffle gives."""
    assert {shuffle for _, _, shuffle, _ in LAYOUTS} == set(SHUFFLES)


def _gradients(p: Placement, d: int, seed: int) -> dict:
    """Sub-batch gradients with every awkward float32: NaN payloads, ±inf, -0.0, subnormals."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.sub_batches:
        g = rng.standard_normal(d).astype(np.float32)
        odd = rng.random(d) < 0.15
        g[odd] = (
            rng.integers(0, 2**32, odd.sum(), dtype=np.uint64).astype(np.uint32).view(np.float32)
        )
        out[t] = g
    return out


def _state(p, k, shuffle, plan, segments):
    spec = SimpleNamespace(shuffle=shuffle, hybrid=plan)
    return SimpleNamespace(local=k, placement=p, segments=segments, spec=spec)


def _serve(request, k, h, grads, plan, segments):
    """What holder ``h`` sends (an independent spelling of the engine's answer)."""
    if request[0] == "g":
        assert h in request[1], (request, h)
        return grads[request[1]][request[2] : request[3]]
    group, j = request[1], request[2]
    assert h in group and h != k
    mine = {t: grads[t] for t in grads if h in t}
    return value_piece(group, k, j, charged_value(plan, group, k, mine, segments))


@pytest.mark.parametrize(("K", "r", "shuffle", "m"), LAYOUTS)
def test_every_owner_rebuilds_serials_bits_without_its_late_workers(K, r, shuffle, m):
    p = Placement(K, r)
    plan = hybrid_plan(K, r, m) if shuffle == "hybrid" else None
    d = 7 * K + 3  # segments and pieces of unequal lengths
    segments = p.segments(d)
    truth = _gradients(p, d, seed=K * 10 + r)
    rng = np.random.default_rng(0)
    checked = 0
    for n_late in range(1, r):
        for late in itertools.combinations(range(K), n_late):
            late = set(late)
            done = set(range(K)) - late
            # how far each late worker got with its map: nothing, or some of it
            progress = {j: rng.integers(0, len(p.held_by(j))) for j in late}
            for k in range(K):
                own = [t for t in p.sub_batches if k in t]
                have = set(own if k not in late else own[: progress[k]])
                grads = {t: truth[t] for t in have}
                received = {}
                for tag, j in shuffle_receives(p, shuffle, k, plan):
                    sender = {t: truth[t] for t in p.sub_batches if j in t}
                    # a late sender may have sent some of its messages before it fell behind
                    if j not in late or rng.random() < 0.5:
                        received[tag] = payload(_state(p, j, shuffle, plan, segments), tag, sender)
                requests, awaited = backups(
                    p, shuffle, plan, k, segments, have, late, set(received)
                )
                assert awaited == []  # everything from the workers not late is here
                assert decode_requests(encode_requests(requests, p, plan), p, plan) == requests
                plain = {}
                for request in requests:
                    h = holder(request, k, done)
                    assert h is not None and h in done
                    plain[request] = _serve(request, k, h, truth, plan, segments)
                    assert len(plain[request]) == length(request, k, segments)
                st = _state(p, k, shuffle, plan, segments)
                got = reduce_segment(st, grads, received, plain)
                want = reduce_in_order(p, shuffle, truth, segments[k], k, plan)
                assert np.array_equal(as_bits(got), as_bits(want)), (late, k)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize(("K", "r", "shuffle", "m"), LAYOUTS)
def test_plain_bytes_equal_the_closed_form_when_late_workers_did_nothing(K, r, shuffle, m):
    p = Placement(K, r)
    plan = hybrid_plan(K, r, m) if shuffle == "hybrid" else None
    d = 60 * K  # every segment and piece of one length, as the closed form counts
    segments = p.segments(d)
    for late in itertools.combinations(range(K), r - 1):
        late = set(late)
        total = 0
        for k in range(K):
            have = set() if k in late else {t for t in p.sub_batches if k in t}
            arrived = {t for t, j in shuffle_receives(p, shuffle, k, plan) if j not in late}
            requests, _ = backups(p, shuffle, plan, k, segments, have, late, arrived)
            total += sum(length(q, k, segments) for q in requests)
        assert total == backup_bound(p, shuffle, plan, late) * d, late


def test_a_slow_owner_is_sent_its_own_terms_and_no_more():
    """The price of not waiting for a slow owner: ``C(K-1, r-1)/K · d`` more into its link."""
    from math import comb

    for K, r in [(4, 2), (4, 3), (5, 3), (6, 2)]:
        p = Placement(K, r)
        d = 12 * K * r
        segments = p.segments(d)
        usual = len(shuffle_receives(p, "coded", 0)) * d // (K * r)  # C(K-1, r) packets of r
        requests, _ = backups(p, "coded", None, 0, segments, set(), {0}, set())
        got = sum(length(q, 0, segments) for q in requests)
        assert got - usual == comb(K - 1, r - 1) * d // K


def test_a_worker_that_gave_up_unheard_is_counted_late_and_its_backups_stay_bounded(tmp_path):
    """summed, K = 4, r = 3: each owner hears from one sender only, so rank 1 can send its
    one part and give up on the rest of its map after every other owner already had all it
    needed (each names no one late). Its own record alone says it gave up; the step's late
    set must still hold it, or the plain values it asks for its own two missing terms
    exceed the closed form (seen in CI under load: 1,739 bytes against 1,664)."""
    from dcoded.engine.record import HistoryFile, TrainingLog

    p, d = Placement(4, 3), 1210  # the tiny dnn on the digits
    log = TrainingLog("r0", 4, 48, None, HistoryFile(tmp_path / "history.csv"))
    log.driver_step(0, epoch=0, wall_s=0.1, step_s=0.1)
    records = [{"step": 0, "rank": k, "phase": "straggle", "abandoned": k == 1} for k in range(4)]
    records += [{"step": 0, "rank": k, "phase": "tolerance", "late": []} for k in range(4)]
    log.ingest([{"records": records, "out": [], "in": []}])
    log.write_rows()
    assert log.rows()[0]["not_waited"] == "1"
    assert log.late_sets == {frozenset({1}): 1}
    assert log.straggle_summary()["steps_not_waiting"] == 1
    segments = p.segments(d)
    have = {p.held_by(1)[-1]}  # the one sub-batch it computed: its part for owner 0
    sent = {t for t, _ in shuffle_receives(p, "summed", 1)}
    requests, _ = backups(p, "summed", None, 1, segments, have, set(), sent)
    asked = sum(length(q, 1, segments) for q in requests)
    bound = (
        sum(
            float(backup_bound(p, "summed", None, set(late))) * n
            for late, n in log.late_sets.items()
        )
        * d
    )
    assert 0 < asked <= bound


def test_draws_are_seeded_by_seed_step_and_rank():
    stall = {"model": "stall", "p": 0.3, "stall_ms": 100.0}
    draws = [[straggle.drawn_ms(stall, 7, s, k) for k in range(4)] for s in range(400)]
    assert draws == [[straggle.drawn_ms(stall, 7, s, k) for k in range(4)] for s in range(400)]
    share = np.mean([x > 0 for row in draws for x in row])
    assert 0.25 < share < 0.35 and {x for row in draws for x in row} == {0.0, 100.0}
    assert draws != [[straggle.drawn_ms(stall, 8, s, k) for k in range(4)] for s in range(400)]
    exp = {"model": "exp", "mean_ms": 20.0}
    values = [straggle.drawn_ms(exp, 0, s, k) for s in range(500) for k in range(4)]
    assert 18 < np.mean(values) < 22 and min(values) >= 0
    assert straggle.drawn_ms({"model": "slow", "workers": [1], "speed": 0.5}, 0, 3, 1) == 0.0


def test_an_interrupted_delay_ends_when_its_computation_is_abandoned():
    t0 = time.monotonic()
    slept = straggle.wait(5.0, stop=lambda: time.monotonic() - t0 > 0.05)
    assert slept < 1.0


def _slowed_run(tmp_path, model: str, setup: list[dict], per_step, steps: int = 20) -> dict:
    """The ``straggle`` part of a summary, and its console lines, from what workers record:
    ``setup`` at step -1 (a ``slow`` rank's throttle), ``per_step(step)`` each step."""
    from dcoded.engine.record import HistoryFile, TrainingLog
    from dcoded.summary import _happened

    log = TrainingLog("r0", 4, 48, None, HistoryFile(tmp_path / f"{model}.csv"))
    log.ingest([{"records": setup, "out": [], "in": []}])
    for step in range(steps):
        log.driver_step(step, epoch=0, wall_s=0.1 * step, step_s=0.1)
        log.ingest([{"records": per_step(step), "out": [], "in": []}])
    log.write_rows()
    s = {"model": model, **log.straggle_summary()}
    lines = _happened({"steps": steps, "steps_done": steps, "start_step": 0, "straggle": s})
    return {**s, "line": "\n".join(lines)}


def test_a_worker_slowed_by_its_cgroup_is_said_slowed_on_every_step(tmp_path):
    """``straggle=slow`` as root: rank 1 runs in a cgroup at its quota the whole run, and
    draws no delay. The line and ``injected_count`` said "on 0 of 20 steps" and 0."""
    throttle = {"step": -1, "rank": 1, "phase": "throttle", "how": "cgroup", "speed": 0.33}
    throttle |= {"detail": "cgroup dcoded-r0-1: 1650 us per 10000 us"}
    throttle |= {"quota_us": 1650, "period_us": 10000}
    s = _slowed_run(tmp_path, "slow", [throttle], lambda step: [])
    assert s["injected_count"] == 20 and s["steps_with_injection"] == 20, s
    assert s["throttles"]["1"]["steps"] == 20 and s["injected"] == [], s
    assert "rank 1 at 0.33 of its share" in s["line"], s["line"]
    assert "a CPU quota of 1650 us per 10000 us (0.165 of a core), on every step" in s["line"]
    assert "0 of 20" not in s["line"]

    # without a cgroup, a delay after each computation: the steps it slept one
    fallback = {**throttle, "how": "delay", "detail": "no cgroup"}
    del fallback["quota_us"], fallback["period_us"]
    slept = {"step": 0, "rank": 1, "phase": "straggle", "drawn_ms": 0.0, "slept_ms": 4.0}
    d = _slowed_run(tmp_path, "slow", [fallback], lambda k: [{**slept, "step": k}] * (k % 4 > 0))
    assert d["injected_count"] == d["steps_with_injection"] == d["throttles"]["1"]["steps"] == 15
    slept_line = "rank 1 at 0.33 of its share of the cores, a delay after each computation"
    assert f"{slept_line}, on 15 of 20 steps" in d["line"], d["line"]


@pytest.mark.parametrize("model", ["stall", "exp"])
def test_drawn_delays_are_counted_by_step_and_rank(tmp_path, model):
    """``stall`` and ``exp``: a rank-step for each delay drawn, a step for each with one."""
    spec = {"model": "stall", "p": 0.3, "stall_ms": 50.0} if model == "stall" else None
    spec = spec or {"model": "exp", "mean_ms": 5.0}

    def drawn(step):
        out = []
        for rank in range(4):
            ms = straggle.drawn_ms(spec, 0, step, rank)
            if ms:
                out.append({"step": step, "rank": rank, "phase": "straggle", "drawn_ms": ms,
                            "slept_ms": ms})  # fmt: skip
        return out

    want = [[k, r] for k in range(20) for r in range(4) if straggle.drawn_ms(spec, 0, k, r)]
    s = _slowed_run(tmp_path, model, [], drawn)
    assert s["injected_count"] == len(want) and [x[:2] for x in s["injected"]] == want
    assert s["steps_with_injection"] == len({k for k, _ in want}), s
    assert f"straggle={model} on {len({k for k, _ in want})} of 20 steps" in s["line"]


# --------------------------------------------------------------------------- on a cluster

STALLS = ["straggle=stall", "straggle.p=0.35", "straggle.stall_ms=300"]
SLOW = ["straggle=slow", "straggle.workers=[1]", "straggle.speed=0.2"]


@pytest.mark.parametrize(
    ("layout", "stragglers", "model"),
    [
        (["coding.redundancy=2"], 1, STALLS),
        (["coding.redundancy=3"], 2, STALLS),
        (["coding.redundancy=3"], 2, SLOW),
        (["coding.redundancy=2", "coding.shuffle=summed"], 1, SLOW),
        (["coding.redundancy=3", "coding.shuffle=summed"], 2, STALLS),
        (["coding.redundancy=2", "coding.shuffle=uncoded"], 1, STALLS),
        (["coding.redundancy=3", "coding.shuffle=hybrid", "coding.hybrid_m=2"], 2, SLOW),
        (["coding.redundancy=2", "coding.shuffle=hybrid"], 1, STALLS),
        (["coding.redundancy=3", "coding.shuffle=pieces"], 2, STALLS),
        (["coding.redundancy=3"], 1, ["straggle=exp", "straggle.mean_ms=40"]),
        (
            ["cluster.n_workers=6", "coding.redundancy=2", "coding.group_size=3"],
            1,
            STALLS,
        ),
    ],
    ids=[
        "coded-r2-stall",
        "coded-r3-stall",
        "coded-r3-slow",
        "summed-r2-slow",
        "summed-r3-stall",
        "uncoded-r2-stall",
        "hybrid-r3-slow",
        "hybrid-r2-stall",
        "pieces-r3-stall",
        "coded-r3-exp-s1",
        "hierarchical-stall",
    ],
)
def test_not_waiting_for_stragglers_equals_serial_bit_for_bit(train, layout, stragglers, model):
    # a slow worker is given up on once its recent paces show it slow: more steps, so that
    # a loaded machine's first steps, still learning them, cannot be all there is
    steps = 16 if "straggle=slow" in model else 8
    common = ["cluster.n_workers=4", f"train.steps={steps}", "train.batch_size=48", *layout]
    serial = train("algorithm=serial", *common)
    got = train(*common, f"coding.stragglers={stragglers}", *model)
    assert got["param_sha256"] == serial["param_sha256"]
    s = got["straggle"]
    assert s["steps_not_waiting"] > 0, s  # the tolerant path ran
    if "straggle=slow" in model:
        assert s["abandoned"].get("1", 0) > 0, s  # the slow owner gave up its map and was sent
        assert s["throttles"]["1"]["how"] == "delay"  # in-process workers: the fallback
    b = got["bytes_per_worker"]
    # at most the closed form's bound (late workers that computed nothing); segments and
    # pieces that do not divide evenly differ by a value from the closed form's d/g
    assert 0 < b["backup"] <= b["theory_backup"] * 1.02


def test_no_straggler_no_plain_values(train):
    """With nothing injected, a tolerant run waits for everyone as before (or almost:
    ``steps_not_waiting`` counts steps where a slightly late worker was replaced)."""
    common = ["coding.redundancy=3", "train.steps=6"]
    serial = train("algorithm=serial", *common)
    got = train(*common, "coding.stragglers=2", "coding.straggler_grace=100")
    assert got["param_sha256"] == serial["param_sha256"]
    assert got["straggle"]["steps_not_waiting"] == 0 and got["bytes_per_worker"]["backup"] == 0


def test_every_algorithm_meets_the_same_stragglers(train, tmp_path):
    common = ["train.steps=5", *STALLS]
    runs = {
        "ssgd": train("algorithm=ssgd", *common),
        "cdc": train("algorithm=cdc", *common),
        "cdc-tolerant": train("algorithm=cdc", "coding.stragglers=1", *common),
    }
    drawn = {
        name: sorted((s, r, d) for s, r, d, _ in out["straggle"]["injected"] if d)
        for name, out in runs.items()
    }
    want = sorted(
        (s, r, 300.0)
        for s in range(5)
        for r in range(4)
        if straggle.drawn_ms({"model": "stall", "p": 0.35, "stall_ms": 300}, 0, s, r)
    )
    assert want and all(d == want for d in drawn.values()), drawn
    history = tmp_path / "h"
    out = run(tiny_config("algorithm=ssgd", *common), out_dir=history)
    rows = (history / "history.csv").read_text().splitlines()
    col = rows[0].split(",").index("straggle_ms")
    first = [r.split(",")[col] for r in rows[1:]]
    assert any(first) and out["straggle"]["model"] == "stall"


@pytest.mark.slow
def test_ddp_meets_the_same_stragglers(train):
    """DDP's ranks (worker processes) draw from the same stream as every other algorithm."""
    got = train("algorithm=ddp", "cluster.processes=true", "train.steps=5", *STALLS)
    stall = {"model": "stall", "p": 0.35, "stall_ms": 300}
    drawn = sorted((s, r, d) for s, r, d, _ in got["straggle"]["injected"] if d)
    want = sorted(
        (s, r, 300.0) for s in range(5) for r in range(4) if straggle.drawn_ms(stall, 0, s, r)
    )
    assert want and drawn == want


def test_asgd_draws_from_the_same_stream(train):
    got = train("algorithm=asgd", "train.steps=4", *STALLS)
    for step, rank, d, _ in got["straggle"]["injected"]:
        stall = {"model": "stall", "p": 0.35, "stall_ms": 300}
        assert d == straggle.drawn_ms(stall, 0, step, rank)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["coding.redundancy=2", "coding.stragglers=2"], "coding.stragglers=2 is not allowed"),
        (["coding.redundancy=2", "coding.stragglers=-1"], "coding.stragglers=-1"),
        (["coding.redundancy=4", "coding.stragglers=1"], "does nothing at coding.redundancy=4"),
        (
            ["coding.redundancy=2", "coding.stragglers=1", "transport=dask"],
            "needs transport=direct or transport=multicast",
        ),
        (["coding.stragglers=1", "coding.straggler_grace=-1"], "coding.straggler_grace=-1"),
        (["straggle=stall", "straggle.p=2"], "straggle.p=2"),
        (["straggle=stall", "straggle.stall_ms=-5"], "straggle.stall_ms=-5"),
        (["straggle=exp", "straggle.mean_ms=0"], "straggle.mean_ms=0"),
        (["straggle=slow", "straggle.workers=[7]"], "straggle.workers=[7]"),
        (["straggle=slow", "straggle.speed=0"], "straggle.speed=0"),
        (["straggle=slow", "straggle.speed=1.5"], "straggle.speed=1.5"),
        (["straggle.model=sometimes"], "straggle='sometimes' is not known"),
    ],
)
def test_bad_straggler_settings_are_one_line(overrides, needle):
    with pytest.raises(dcoded.errors.ConfigError, match=needle.replace("[", r"\[")):
        run(tiny_config(*overrides))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_straggler_that_is_dead_ends_the_step_as_a_dead_worker_does(tmp_path):
    """Worker processes, rank 1 stalled for long on every step; killed mid-stall, the run
    ends in one line naming the lost worker, and leaves no process behind."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dcoded",
            "progress=false",
            "train.steps=100000",
            "train.checkpoint_every=5",
            "coding.redundancy=3",
            "coding.stragglers=2",
            "straggle=stall",
            "straggle.p=0.5",
            "straggle.stall_ms=2000",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_able,
    )
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoint.npz").exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.5)
    workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.ppid() != proc.pid]
    assert len(workers) == 4
    t = time.monotonic()
    workers[1].send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 2, err[-3000:]
    assert time.monotonic() - t < 90
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "was lost" in last, last


@pytest.mark.slow
@pytest.mark.netem
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    not (
        hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
    ),
    reason="needs root and iproute2 (ip, tc)",
)
@pytest.mark.parametrize(
    "overrides",
    [
        ["transport=multicast", "cluster.topology=bus", "coding.redundancy=3"],
        ["transport=direct", "coding.redundancy=2", "coding.shuffle=summed"],
    ],
    ids=["multicast-coded-r3", "direct-summed-r2"],
)
def test_a_slow_worker_throttled_for_real_is_not_waited_for_on_netem(tmp_path, overrides):
    """On the emulated network as root, ``slow`` is a CPU quota in a cgroup of the worker's
    own (reached from inside its namespace); not waiting for it still equals serial."""
    from tests.test_netem import netem_config

    common = ["cluster.n_workers=4", "train.steps=12", "train.batch_size=48", *overrides]
    layout = [o for o in common if not o.startswith(("cluster.topology", "transport"))]
    serial = run(tiny_config("algorithm=serial", *layout))
    before = set(straggle.CGROUP_ROOT.glob("dcoded-*"))
    got = run(
        netem_config(*common, "coding.stragglers=max", *SLOW[:-1], "straggle.speed=0.25"),
        out_dir=tmp_path,
    )
    assert got["param_sha256"] == serial["param_sha256"]
    s = got["straggle"]
    assert s["throttles"]["1"]["how"] == "cgroup", s["throttles"]
    assert s["steps_not_waiting"] > 0 and s["abandoned"].get("1", 0) > 0, s
    assert set(straggle.CGROUP_ROOT.glob("dcoded-*")) <= before, "a cgroup was left behind"


# ---------------------------------------------------------------- an owner's rounds, no Dask


def test_an_owner_that_heard_every_worker_finish_waits_for_every_message():
    p = Placement(4, 3)
    segments = p.segments(40)
    heard = dict.fromkeys(range(1, 4), "done")
    move = next_round(p, "coded", None, 0, segments, set(p.held_by(0)), heard, set(), {})
    assert move.on_time and not move.ask


def test_an_owner_asks_the_lowest_finished_holder_once_and_never_waits_for_a_worker_that_gave_up():
    p = Placement(4, 3)
    segments = p.segments(40)
    have = set(p.held_by(0))
    heard = {1: "gave-up", 3: "done"}  # 2 has not finished yet
    first = next_round(p, "coded", None, 0, segments, have, heard, set(), {})
    assert not first.on_time and first.late == {1}
    assert set(first.ask) == {3} and first.settled  # every value 1 did not send: 3 holds it
    assert all(tag[2] != 1 for tag in first.awaited)  # P(S, 1) is not waited for
    asked = {q: h for h, qs in first.ask.items() for q in qs}
    heard[2] = "done"
    again = next_round(p, "coded", None, 0, segments, have, heard, set(), asked)
    assert again.ask == {} and again.settled  # asked once, even now that 2 (lower) is done


def test_a_value_whose_holders_have_not_finished_is_asked_once_one_has():
    """Owner 0 of K = 4, r = 2 summed: sender 1's part comes from holders of the sub-batches
    charged to it; none finished, nothing is asked yet and the owner cannot reduce."""
    p = Placement(4, 2)
    segments = p.segments(40)
    have = set(p.held_by(0))
    waiting = next_round(p, "summed", None, 0, segments, have, {1: "gave-up"}, set(), {})
    assert waiting.ask == {} and not waiting.settled
    heard = {1: "gave-up", 2: "done", 3: "done"}
    move = next_round(p, "summed", None, 0, segments, have, heard, set(), {})
    assert move.settled and move.ask
    assert all(h in (2, 3) and all(h in q[1] for q in qs) for h, qs in move.ask.items())


def test_an_owner_whose_own_map_fell_behind_asks_for_the_terms_it_did_not_compute():
    p = Placement(4, 2)
    segments = p.segments(40)
    own = p.held_by(0)
    heard = dict.fromkeys(range(1, 4), "done")
    move = next_round(p, "uncoded", None, 0, segments, set(own[:1]), heard, set(), {})
    wanted = [q for qs in move.ask.values() for q in qs]
    for t in own[1:]:
        assert ("g", t, segments[0].start, segments[0].stop) in wanted


@pytest.mark.parametrize(("K", "r", "shuffle", "m"), LAYOUTS)
def test_over_rounds_every_plain_value_is_asked_once_of_a_finished_holder(K, r, shuffle, m):
    """Workers finish or give up one at a time in a random order; the owner takes a round
    after each: every request it ends with was asked exactly once, of a holder that had
    finished by then, and it is settled once every worker was heard."""
    p = Placement(K, r)
    plan = hybrid_plan(K, r, m) if shuffle == "hybrid" else None
    segments = p.segments(7 * K + 3)
    rng = np.random.default_rng(K * 100 + r)
    for late in [{j} for j in range(1, K)] + ([{1, 2}] if r > 2 else []):
        k = 0
        order = [int(j) for j in rng.permutation([j for j in range(K) if j != k])]
        heard, asked, move = {}, {}, None
        for j in order:
            heard[j] = "gave-up" if j in late else "done"
            done = {w for w, what in heard.items() if what == "done"}
            move = next_round(p, shuffle, plan, k, segments, set(p.held_by(k)), heard, set(), asked)
            for h, qs in move.ask.items():
                assert h in done and h not in late
                for q in qs:
                    assert q not in asked, q
                    asked[q] = h
        assert move is not None and move.settled and move.late == late
        requests, _ = backups(p, shuffle, plan, k, segments, set(p.held_by(k)), late, set())
        assert set(asked) == set(requests)
