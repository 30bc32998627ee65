"""A lost or frozen worker for real: ``train.on_worker_loss=continue`` goes on by itself, bit
for bit as the same run resumed by hand, and ``stop`` ends in one line within seconds, a
frozen (SIGSTOPped) worker included."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dcoded.results import read_history
from tests.test_faults import (
    ROOT,
    _hand_started_cluster,
    _start,
    _wait_for,
    _worker_processes,
)

STEPS = 60


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


#: The references run so far, by their overrides: the kill and the freeze of one layout
#: share theirs (a run of its own, each, otherwise).
_REFERENCES: dict[tuple[str, ...], dict] = {}


def _reference(tmp_path: Path, name: str, *overrides: str, once: bool = False) -> dict:
    """The same run without a failure (a resume on as many workers is bit-exact to it).
    ``once``: the summary is all the caller reads, so the same overrides run once (a run
    whose folder is read or resumed from runs every time)."""
    if once and overrides in _REFERENCES:
        return _REFERENCES[overrides]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dcoded",
            "progress=false",
            f"hydra.run.dir={tmp_path / name}",
            *list(overrides),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = _summary(tmp_path / name)
    if once:
        _REFERENCES[overrides] = summary
    return summary


@pytest.mark.timeout(1200)
@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "overrides"),
    [
        (signal.SIGKILL, ["coding.shuffle=coded"]),
        # summed recovers through the same path as coded and hybrid (the suite's time: one
        # case less); its steps are checked bit for bit in test_engine
        (signal.SIGKILL, ["coding.shuffle=hybrid", "coding.redundancy=3"]),
        (signal.SIGKILL, ["algorithm=ssgd"]),
        (signal.SIGSTOP, ["coding.shuffle=coded"]),
        (signal.SIGKILL, ["algorithm=ddp"]),
        (signal.SIGSTOP, ["algorithm=ddp"]),
    ],
    ids=[
        "kill-coded",
        "kill-hybrid",
        "kill-ssgd",
        "stop-coded",
        "kill-ddp",
        "stop-ddp",
    ],
)
def test_a_lost_worker_is_replaced_and_the_run_goes_on_bit_for_bit(tmp_path, sig, overrides):
    """The local cluster's nanny starts a worker in the killed one's place (a frozen one is
    found by its silence and restarted through its nanny); the run goes on from its last
    checkpoint in the same process and folder, and ends with the bits of the run that never
    lost a worker. history.csv keeps the steps done twice, marked."""
    common = [f"train.steps={STEPS}", "train.checkpoint_every=5", "train.eval_every=0"]
    common += overrides
    run_dir = tmp_path / "run"
    proc = _start([*common, "train.on_worker_loss=continue"], run_dir)
    _wait_for(run_dir / "checkpoint.npz", proc)
    victim = _worker_processes(proc.pid)[2]
    t = time.monotonic()
    victim.send_signal(sig)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    summary = _summary(run_dir)
    (event,) = summary["recoveries"]
    assert event["lost"][0]["rank"] in range(4) and event["replaced"] == 1, event
    assert event["layout"]["n_workers"] == 4
    assert 0 <= event["steps_replayed"] <= 5 or event["resumed_from"] == 0, event
    assert 0 < event["recovery_s"] <= event["to_next_step_s"], event
    assert "recovered: worker" in err and "went on from" in err
    print(f"{sig!r}: recovered and finished {time.monotonic() - t:.1f}s after the signal")
    rows = read_history(run_dir)
    done_again = [r for r in rows if r.get("replayed") == "1"]
    assert len(done_again) == event["steps_replayed"]
    kept = [int(r["step"]) for r in rows if r.get("replayed") != "1"]
    assert kept == list(range(STEPS))  # every step once, besides the ones done again
    # the next attempt's times go on from the failed one's, recovery included (they started
    # at 0 again: accuracy against time came out sawtoothed)
    walls = [float(r["wall_s"]) for r in rows if r.get("replayed") != "1"]
    assert walls == sorted(walls) and summary["time_s"]["total"] == walls[-1]
    reference = _reference(tmp_path, "reference", *common, once=True)
    assert summary["param_sha256"] == reference["param_sha256"]


def _resumed_by_hand(tmp_path: Path, common: list[str], start: int, n_workers: int) -> dict:
    """The run to the checkpoint at ``start`` on four workers, resumed by hand on
    ``n_workers`` (``common``: its overrides, ``train.steps`` first)."""
    _reference(tmp_path, "first", *common[1:], f"train.steps={start}")
    return _reference(
        tmp_path,
        "by-hand",
        *common,
        f"train.resume={tmp_path / 'first'}",
        f"cluster.n_workers={n_workers}",
    )


def _kill_one_on_own_cluster(
    tmp_path: Path, *overrides: str, second_after_s: float | None = None, wait_s: float = 2
) -> tuple[int, str, Path]:
    """A run with ``train.on_worker_loss=continue`` on a cluster started by hand (no nanny:
    a killed worker has no successor; ``train.replace_within_s=wait_s``), one worker
    SIGKILLed after the first checkpoint, and another ``second_after_s`` later if given:
    ``(exit status, stderr, run folder)``."""
    address, scheduler, workers = _hand_started_cluster(4, tmp_path)
    run_dir = tmp_path / "run"
    try:
        proc = _start(
            [
                *overrides,
                "train.checkpoint_every=5",
                "cluster=address",
                f"cluster.address={address}",
                "train.on_worker_loss=continue",
                f"train.replace_within_s={wait_s}",
            ],
            run_dir,
        )
        _wait_for(run_dir / "checkpoint.npz", proc)
        workers[1].send_signal(signal.SIGKILL)
        if second_after_s is not None:
            time.sleep(second_after_s)
            workers[2].send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        for p in (*workers, scheduler):
            p.kill()
    return proc.returncode, err, run_dir


@pytest.mark.timeout(1200)
@pytest.mark.slow
def test_without_a_replacement_the_run_goes_on_with_the_workers_left(tmp_path):
    """On the user's own cluster a killed worker has no successor: the run goes on with the
    three left, as the same run resumed by hand on three workers from the same checkpoint."""
    common = ["train.steps=40", "train.checkpoint_every=5", "train.eval_every=0"]
    code, err, run_dir = _kill_one_on_own_cluster(tmp_path, "train.steps=40", "train.eval_every=0")
    assert code == 0, err[-3000:]
    summary = _summary(run_dir)
    (event,) = summary["recoveries"]
    assert event["replaced"] == 0 and event["layout"]["n_workers"] == 3, event
    assert summary["n_workers"] == 3
    by_hand = _resumed_by_hand(tmp_path, common, event["resumed_from"], 3)
    assert summary["param_sha256"] == by_hand["param_sha256"]


@pytest.mark.timeout(1200)
@pytest.mark.slow
def test_a_second_loss_during_the_recovery_is_counted_with_the_first(tmp_path):
    """A second worker dies while the run waits for one in the first one's place: the
    recovery counts both and goes on with the two left, as the same run resumed by hand on
    two workers from the same checkpoint (it never starts an attempt on the dead one)."""
    common = ["train.steps=40", "train.checkpoint_every=5", "train.eval_every=0"]
    code, err, run_dir = _kill_one_on_own_cluster(
        tmp_path, "train.steps=40", "train.eval_every=0", second_after_s=3, wait_s=8
    )  # the second while the recovery waits for a replacement
    assert code == 0, err[-3000:]
    summary = _summary(run_dir)
    (event,) = summary["recoveries"]
    assert len(event["lost"]) == 2 and event["replaced"] == 0, event
    assert event["layout"]["n_workers"] == 2 and summary["n_workers"] == 2, event
    by_hand = _resumed_by_hand(tmp_path, common, event["resumed_from"], 2)
    assert summary["param_sha256"] == by_hand["param_sha256"]


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_loss_that_leaves_no_possible_layout_ends_in_one_line(tmp_path):
    """r = K = 4 and one worker lost for good: three workers cannot hold every sub-batch four
    times, so the run stops with the line that says so, its checkpoint kept."""
    code, err, run_dir = _kill_one_on_own_cluster(
        tmp_path, "train.steps=100000", "coding.redundancy=4"
    )
    assert code == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "could not go on with the 3 worker(s) left" in last
    assert "coding.redundancy" in last and f"train.resume={run_dir}" in last


@pytest.mark.timeout(600)
@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "sig"),
    [("cdc", signal.SIGSTOP), ("ddp", signal.SIGSTOP), ("ddp", signal.SIGKILL)],
    ids=["cdc-frozen", "ddp-frozen", "ddp-killed"],
)
def test_a_frozen_or_killed_worker_stops_the_run_in_seconds(tmp_path, algorithm, sig):
    """A SIGSTOPped worker breaks no connection: the run waited out train.step_timeout_s
    times the steps of a task (100 minutes by default); its silence ends the wait now. A
    killed ddp rank made the others' gloo raise, and the run ended in a traceback (status 1)."""
    run_dir = tmp_path / "run"
    proc = _start(
        [
            f"algorithm={algorithm}",
            "train.steps=100000",
            "train.eval_every=0",
            "train.checkpoint_every=5",
        ],
        run_dir,
    )
    _wait_for(run_dir / "checkpoint.npz", proc)
    victim = _worker_processes(proc.pid)[1]
    t = time.monotonic()
    victim.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):  # the cluster's end may have killed it
            victim.send_signal(signal.SIGKILL)
    took = time.monotonic() - t
    assert proc.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    said = "frozen, treated as lost" if sig == signal.SIGSTOP else "was lost"
    assert last.startswith("error: ") and said in last and "rank" in last, last
    print(f"{algorithm}: a {sig.name} worker ended the run {took:.1f}s after the signal")
    assert took < 120
