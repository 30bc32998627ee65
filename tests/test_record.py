"""The training log's bookkeeping alone, no cluster: a long run keeps its pace and its memory
(each step's facts are dropped once its row is written), and what it writes is what the rows
were."""

from __future__ import annotations

import csv
import os
import signal
import time

import pytest

from dcoded.engine.driver import COLLECT_EVERY
from dcoded.engine.record import HISTORY_COLUMNS, WRITE_LAG, HistoryFile, TrainingLog

K = 4
PHASE_RECORDS = ("map", "encode", "decode", "update")


def _records(step: int) -> list[dict]:
    """What a step of cdc over the direct transport leaves on each of K workers' records:
    phases, a timed exchange (the shuffle and the all-gather), bytes, a loss and digests."""
    out = []
    t = 1000.0 + step
    for rank in range(K):
        for i, phase in enumerate(PHASE_RECORDS):
            out.append(
                {"step": step, "rank": rank, "phase": phase, "start": t + i, "stop": t + i + 0.5}
            )
        for part, phase in enumerate(("shuffle", "params")):
            out.append(
                {
                    "step": step,
                    "rank": rank,
                    "phase": phase,
                    "exchange": part,
                    "start": t + 4 + part,
                    "stop": t + 4.25 + part + rank / 100,
                    "sent": {"pkt": 100.0, "seg": 200.0},
                    "multicast": 50.0,
                    "unicast": 150.0,
                    "loss": 0.25 * (rank + 1),
                    "cluster": 0,
                    "digests": {f"{rank}-{(rank + 1) % K}": "abc"},
                }
            )
    return out


def _drive(log: TrainingLog, steps: int, checkpoint_every: int = 20, held=None) -> None:
    """The driver loop's calls into the log, as :func:`dcoded.engine.driver.after_step`
    makes them: a step's row, a collection every COLLECT_EVERY steps, the rows a collection
    behind written then, an evaluation every 50 steps, every row at a checkpoint."""
    pending = []
    for step in range(steps):
        log.driver_step(step, epoch=step // 100, wall_s=0.01 * step, step_s=0.01)
        pending.extend(_records(step))
        done = step + 1
        checkpoint = done % checkpoint_every == 0
        if done % COLLECT_EVERY == 0 or checkpoint:
            log.ingest([{"records": pending, "out": [], "in": []}])
            pending = []
        if done % 50 == 0:
            log.evaluation(step, 0.5, 1.0)
        if checkpoint:
            log.checkpointed(step)
        elif done % COLLECT_EVERY == 0:
            log.write_rows(step - WRITE_LAG)
        if done % COLLECT_EVERY == 0:
            log.median_step_s()  # what a wait asks while it waits
        if held is not None:
            held.append(len(log._steps))


def _per_step_s(tmp_path, steps: int, i: int) -> float:
    """This process's CPU time a step for a run of ``steps``."""
    log = TrainingLog("r0", K, 96, None, HistoryFile(tmp_path / f"h-{steps}-{i}.csv"))
    t0 = time.process_time()
    _drive(log, steps)
    log.write_rows()
    return (time.process_time() - t0) / steps


def test_the_bookkeeping_of_a_step_costs_the_same_at_step_20000_as_at_2000(tmp_path, monkeypatch):
    """The same work at 2,000 and at 20,000 steps: the larger run's time per step within 1.5x
    of the smaller's (it was quadratic: history.csv rewritten whole at every checkpoint, from
    rows rebuilt by scanning every exchange recorded since the start, 2.4 s a checkpoint by
    step 1,500). CPU time, the best of three runs each, taken in turn so that the machine's
    drift meets both alike, and the disk's flush (a checkpoint's fsync) left out."""
    monkeypatch.setattr("dcoded.engine.record.os.fsync", lambda fd: None)
    small, large = [], []
    for i in range(3):
        small.append(_per_step_s(tmp_path, 2_000, i))
        large.append(_per_step_s(tmp_path, 20_000, i))
    small, large = min(small), min(large)
    assert large < 1.5 * small, f"{1e6 * small:.0f} us a step at 2,000, {1e6 * large:.0f} at 20,000"


def test_the_log_holds_no_step_once_its_row_is_written(tmp_path):
    """What the log keeps stays within a couple of collections' steps, however long the run,
    with checkpoints or without: every per-step fact goes to history.csv and is dropped."""
    for every in (20, 10**9):
        log = TrainingLog("r0", K, 96, None, HistoryFile(tmp_path / f"history-{every}.csv"))
        held: list[int] = []
        _drive(log, 1_000, checkpoint_every=every, held=held)
        assert max(held) <= WRITE_LAG + COLLECT_EVERY, max(held)
        log.write_rows()
        assert log._steps == {} and log.last_written == 999


def test_the_written_rows_are_the_rows(tmp_path):
    """history.csv written as the run goes reads back to every step once, in order, with each
    row's values as the log made them: phases from the timed exchanges, bytes per worker,
    the loss per sample, evaluations where they were; a record that comes after its step's row
    was written is counted, not lost in silence."""
    path = tmp_path / "history.csv"
    log = TrainingLog("r0", K, 96, None, HistoryFile(path))
    _drive(log, 120)
    log.write_rows()
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == HISTORY_COLUMNS
        raw = list(reader)
    assert [int(r["step"]) for r in raw] == list(range(120))
    rows = log.rows()
    assert [r["step"] for r in rows] == list(range(120))
    r = rows[7]
    # the shuffle: latest start 1011, latest stop 1011.28 over the ranks
    assert r["shuffle_s"] == pytest.approx(0.28)
    assert r["map_s"] == 0.5 and r["bytes_direct"] == 2 * 300.0 and r["bytes_multicast"] == 100
    assert r["train_loss"] == pytest.approx(2 * (0.25 + 0.5 + 0.75 + 1.0) / 96)
    assert rows[49]["test_accuracy"] == 0.5 and rows[48]["test_accuracy"] is None
    assert float(raw[7]["wall_s"]) == rows[7]["wall_s"] == 0.07  # the same bits back

    log.ingest([{"records": _records(3), "out": [], "in": []}])
    assert log.late_records == len(_records(3))
    assert len(log.rows()) == 120


def test_a_ctrl_c_while_rows_are_written_loses_no_row(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM) raises in the driver wherever it is: one that came while a
    checkpoint's write had taken steps out of the log but not yet into history.csv lost them
    for good, and the rows the interrupted run wrote after them left a hole (CI: steps_done 45,
    41 rows). The write holds the signal until the file and the log agree; it arrives then."""
    path = tmp_path / "history.csv"
    log = TrainingLog("r0", K, 96, None, HistoryFile(path))
    _drive(log, 20)  # rows 0..19 written at the checkpoint after step 19
    for step in range(20, 25):  # the next chunk: its records collected, the driver's rows made
        log.ingest([{"records": _records(step), "out": [], "in": []}])
        log.driver_step(step, epoch=0, wall_s=0.01 * step, step_s=0.01)
    real_row = TrainingLog._row

    def row(self, step, st):
        if step == 22:  # Ctrl-C lands in the middle of the checkpoint's rows
            os.kill(os.getpid(), signal.SIGINT)
        return real_row(self, step, st)

    monkeypatch.setattr(TrainingLog, "_row", row)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with pytest.raises(KeyboardInterrupt):
            log.checkpointed(24)
    finally:
        signal.signal(signal.SIGINT, previous)
    rows = log.rows()  # what run() reads back for the interrupted run's summary
    assert [r["step"] for r in rows] == list(range(25))
    with open(path, newline="") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == list(range(25))


def test_a_recovery_marks_the_steps_it_does_again_and_the_next_attempt_appends(tmp_path):
    """A recovery from the checkpoint at step 40 after step 55: rows 40..55 are marked
    replayed in the one history file, the next attempt's rows follow them, and each attempt's
    summary reads its own rows only."""
    path = tmp_path / "history.csv"
    first = TrainingLog("r0", K, 96, None, HistoryFile(path))
    _drive(first, 56)
    first.write_rows()
    assert first.last_written == 55
    first.history_file.mark_replayed(40)
    second = TrainingLog("r1", K, 96, None, first.history_file)
    for step in range(40, 60):
        second.driver_step(step, epoch=0, wall_s=0.0, step_s=0.02)
    second.write_rows()
    every = second.history_file.read()
    assert [r["step"] for r in every] == [*range(56), *range(40, 60)]
    assert [r["step"] for r in every if r["replayed"]] == list(range(40, 56))
    assert [r["step"] for r in second.rows(40)] == list(range(40, 60))
    assert all(r["step_s"] == 0.02 for r in second.rows(40))


def test_a_history_without_a_folder_is_a_temporary_file_that_close_removes():
    """Made at the first rows only: a log that never writes leaves no file behind."""
    assert TrainingLog("r0", K, 96, None).history_file.path is None
    history = HistoryFile(None)
    log = TrainingLog("r0", K, 96, None, history)
    _drive(log, 30)
    assert [r["step"] for r in log.rows()] == list(range(30))
    assert history.path.exists()
    history.close()
    assert not history.path.exists()


def test_no_file_before_the_first_row_and_a_resume_starts_with_the_earlier_rows(tmp_path):
    """A run that fails before its first step writes no history; a resumed run's history
    starts with the rows before its checkpoint, as read from the folder it resumed from."""
    path = tmp_path / "history.csv"
    history = HistoryFile(path, earlier=[{"step": "0", "wall_s": "0.5"}])
    assert not path.exists()
    history.append([{"step": 1, "wall_s": 0.75}])
    assert [(r["step"], r["wall_s"]) for r in history.read()] == [(0, 0.5), (1, 0.75)]


def test_ddps_map_never_outlasts_its_step_when_the_ranks_are_skewed(tmp_path):
    """DDP's ranks run their own loop: a rank that began step s while a slower one still
    finished step s - 1 waits for it in the all-reduce, inside its backward. Its map counted
    from its own start (20.3 ms of map against a step of 16.3 ms); it counts from the step's
    start, as the step does."""
    log = TrainingLog("r0", 2, 96, None, HistoryFile(tmp_path / "history.csv"))
    log.loop_begins(0, per_epoch=100)
    records = []
    for step in range(3):
        t = 10.0 + 0.016 * step
        for rank, (began, mapped) in enumerate([(t - 0.006, 0.020), (t, 0.012)]):
            records += [
                {"step": step, "rank": rank, "phase": "map", "start": began,
                 "stop": began + mapped, "loss": 1.0, "allreduced": 4.0},
                {"step": step, "rank": rank, "phase": "shuffle", "start": began + 0.001,
                 "stop": began + mapped - 0.001},  # the all-reduce, inside map's backward
                {"step": step, "rank": rank, "phase": "update", "start": began + mapped,
                 "stop": began + mapped + 0.001},
            ]  # fmt: skip
    log.ingest([{"records": records, "out": [], "in": []}])
    log.write_rows()
    rows = log.rows()
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:  # the first step has no step before it: it starts with its first rank
        assert r["step_s"] == pytest.approx(0.016)
        assert r["map_s"] == pytest.approx(0.016 - 0.001)  # the step but the slow rank's update
        assert r["shuffle_s"] <= r["map_s"] <= r["step_s"]
    assert rows[0]["map_s"] == pytest.approx(0.020)  # from the loop's start: all its own


def test_a_processes_peak_memory_starts_afresh_for_each_run():
    """A worker process serves every job of a sweep: its peak resident memory is started
    afresh at a run's first replica, so a run's peak is not an earlier job's."""
    import numpy as np

    from dcoded.engine import registry

    if registry.peak_memory() is None:
        pytest.skip("no /proc/self/status here")
    before = registry.peak_memory()
    big = np.ones(25_000_000)  # 200 MB, every page touched
    high = registry.peak_memory()
    del big
    registry.reset_peak_memory()
    after = registry.peak_memory()
    assert high - before >= 150e6, (before, high)
    assert after <= high - 150e6, (high, after)


@pytest.mark.parametrize("algorithm", ["cdc", "ssgd", "serial"])
def test_the_summary_has_each_workers_peak_memory(train, algorithm):
    """``summary.json`` ``peak_memory``: each rank's peak resident memory and the largest
    (the workers here are threads of this process: each says the process's peak)."""
    from dcoded.engine import registry

    summary = train(f"algorithm={algorithm}")
    peak = summary["peak_memory"]
    if algorithm == "serial":  # one process, no worker: nothing to say
        assert peak is None
        return
    assert sorted(peak["per_worker"]) == ["0", "1", "2", "3"]
    assert peak["max_bytes"] == max(peak["per_worker"].values())
    # threads: this process's peak, as each thread's view of the counters has it (the
    # kernel's per-thread counts are folded in every 64 page events: a few hundred kB apart)
    assert 100e6 < peak["max_bytes"] <= registry.peak_memory() + 4e6
