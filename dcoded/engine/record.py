"""What happened, step by step: phase times, bytes and losses, merged from the driver, the
workers' task records and the workers' Dask transfer logs.

Per step, a phase time is the largest total any worker spent in it (the step waits for the
slowest); ``shuffle`` and ``params`` are the wall time of the exchange itself. On the ``dask``
transport that is from the first transfer of the step's packets (segments) to start to the last
one to end, as the receiving workers logged them. On the ``direct`` transport it is from the
moment the last worker began to send to the moment the last worker had received everything
(each exchange of a step: the shuffle, then the cross-cluster sum), so a slower map or update
elsewhere is not counted as network time; the workers' clocks are compared, which is exact on
one machine (``cluster=netem``) and as good as their clock sync elsewhere. Bytes per worker are
the step's totals divided by ``K``.

A long run keeps its pace: what the log holds of a step is dropped once the step's row is
written to ``history.csv`` (:class:`HistoryFile`, appended as the run goes, a collection or two
behind the training loop, and up to the step at every checkpoint), so no per-step cost grows
with the step number. The summary reads the rows back once, at the end.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import math
import os
import statistics
import tempfile
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dcoded import files
from dcoded.coding.shuffles import KINDS
from dcoded.engine.registry import parse_key
from dcoded.errors import ReplicaMismatch
from dcoded.interrupt import signals_deferred
from dcoded.results import PHASES

BYTE_FIELDS = ("multicast", "unicast", "params", "dask", "direct")
#: Dask keys of the gradient exchange (every shuffle's messages, the cross-cluster sum and the
#: parameter server's gradients) and of the parameter distribution, by kind.
SHUFFLE_KINDS = frozenset({*KINDS, "red", "grad"})
PARAM_KINDS = frozenset({"seg"})

HISTORY_COLUMNS = [
    "step",
    "epoch",
    "wall_s",
    "step_s",
    "train_loss",
    "test_accuracy",
    "test_loss",
    *(f"{p}_s" for p in PHASES),
    *(f"bytes_{b}" for b in BYTE_FIELDS),
    "staleness_mean",
    "staleness_max",
    "straggle_ms",
    "not_waited",
    "abandoned",
    "replayed",  # 1: a step a later attempt did again (train.on_worker_loss=continue)
]


#: A step's row is written once it is this many steps behind the newest step done (its
#: workers' records come with the collection after it); at a checkpoint or the end, every row.
WRITE_LAG = 10
#: The median step that decides when a silent worker counts as frozen: over this many recent steps.
RECENT_STEPS = 1000
#: ``summary.json`` lists at most this many injected delays one by one (``history.csv``'s
#: ``straggle_ms`` has every step's); the totals count them all.
INJECTED_LISTED = 10_000
#: Columns of ``history.csv`` read back as integers, and as text; the others are floats.
INT_COLUMNS = frozenset({"step", "epoch", "replayed", "staleness_max"})
TEXT_COLUMNS = frozenset({"straggle_ms", "not_waited", "abandoned"})


def _phase_times() -> defaultdict:
    return defaultdict(lambda: defaultdict(float))


@dataclass(slots=True)
class _Step:
    """What the log knows of one step until its row is written."""

    row: dict = field(default_factory=dict)  # the driver's facts (and the evaluation)
    phase: defaultdict = field(default_factory=_phase_times)  # phase -> rank -> s
    nbytes: defaultdict = field(default_factory=lambda: defaultdict(float))  # field -> all workers
    loss: float | None = None
    windows: dict = field(default_factory=dict)  # phase -> [first start, last stop] (Dask)
    # direct transport: (phase, part) -> [latest start, latest stop] over ranks
    exchanges: dict = field(default_factory=dict)
    digests: dict = field(default_factory=dict)  # (cluster, T) -> (rank, digest) first seen
    start: float | None = None  # when its first task record started
    stop: float = 0.0  # when its last task record ended
    injected: dict = field(default_factory=dict)  # rank -> (drawn ms, slept ms)
    not_waited: set = field(default_factory=set)
    abandoned: set = field(default_factory=set)
    #: phase -> rank -> when its map or shuffle ended (ddp's loops, see _loop_rows)
    stops: defaultdict = field(default_factory=lambda: defaultdict(dict))


class TrainingLog:
    """Collects per-step facts and writes each step's row (``HISTORY_COLUMNS``) to its
    :class:`HistoryFile` once the step is done with; :meth:`rows` reads this attempt's rows
    back for the summary, :meth:`time_medians` summarises them.

    ``history``: the file the rows go to (a recovery's next attempt goes on writing the same
    one); by default a new one, at ``run_dir/history.csv`` or, without a folder, a temporary
    file that :meth:`HistoryFile.close` removes.
    """

    def __init__(
        self,
        run_id: str,
        n_workers: int,
        batch_size: int,
        peers: set[str] | None,
        history: HistoryFile | None = None,
    ):
        self.run_id = run_id
        self.n_workers = n_workers
        self.batch_size = batch_size
        #: Dask transfers count only when sent to these addresses (None: to anyone).
        self.peers = peers
        self.history_file = history if history is not None else HistoryFile(None)
        self._steps: dict[int, _Step] = {}  # the steps whose rows are not written yet
        self._written_upto: int | None = None  # the newest step whose row is written
        self.last_written: int | None = None  # ... by this log (this attempt)
        self.late_records = 0  # records of a step whose row was written already (left out)
        self._recent = deque(maxlen=RECENT_STEPS)  # the newest steps' step_s
        self.events: list[str] = []
        #: train.on_worker_loss=continue: what each recovery did (summary.json "recoveries")
        self.recoveries: list[dict] = []
        #: the newest recovery and when it began (monotonic), until this attempt's first step
        self.recovering: tuple[dict, float] | None = None
        self._loops_begin: set[int] = set()  # see loop_begins
        self._per_epoch = 1
        self._loop_last: int | None = None  # the newest step :meth:`_loop_rows` made a row of
        self._loop_wall, self._loop_end = 0.0, None  # its wall time, and when it ended
        #: added to every ``wall_s``: a recovery's next attempt goes on from the time the one
        #: before it reached, and the recovery's own (its rows' times do not start again at 0)
        self.wall_offset = 0.0
        self.last_wall = 0.0  # the newest wall_s given, offset included
        #: the training loop's first and newest step on the machine's clock (unix seconds), for
        #: what watches the run from outside (the scale model's fidelity)
        self.loop_unix_s: list[float] | None = None
        self._first_map: int | None = None  # see steps_with_records
        self._complete = 0
        self.allreduced = 0  # bytes DDP put through all-reduce, all ranks and steps
        self.wire: list[int] | None = None  # bytes each worker interface sent (netem)
        self.kernel_losses: dict | None = None  # netem: the kernel's loss counters' rise
        self.link_bytes: dict | None = None  # netem: the bytes each link passed, the last attempt
        self.compute_speed: dict | None = None  # the scale model's probe (scale.measure_speed)
        self._nonfinite: tuple[int, float] | None = None
        self.dask_by_kind: dict[str, float] = defaultdict(float)  # all steps, all workers
        self.direct_by_kind: dict[str, float] = defaultdict(float)  # the same, direct links
        self.repairs = defaultdict(int)  # multicast: sent again, asks, received again by cause
        self.peak_rss: dict[str | None, int] = {}  # each worker's peak resident bytes
        # the straggle group, as its rows are written: how "slow" was made, the first
        # INJECTED_LISTED delays ([step, rank, drawn ms, slept ms]), totals per rank
        self.throttles: dict[int, dict] = {}
        self._injected: list[list] = []
        self._injected_count = 0
        self._injected_ms: dict[int, float] = defaultdict(float)
        self._steps_injected = 0
        # coding.stragglers: steps each rank was not waited for, or gave up; how often each
        # set of late ranks was not waited for (the backup bytes' closed form)
        self._not_waited_counts: dict[int, int] = defaultdict(int)
        self._abandoned_counts: dict[int, int] = defaultdict(int)
        self._steps_not_waiting = 0
        self.late_sets: Counter = Counter()

    def _step(self, step: int) -> _Step | None:
        """The step's facts, made at the first; ``None`` once its row is written (a late
        record, counted and left out)."""
        st = self._steps.get(step)
        if st is None:
            if self._written_upto is not None and step <= self._written_upto:
                self.late_records += 1
                return None
            st = self._steps[step] = _Step()
        return st

    # ------------------------------------------------------------------ inputs
    def driver_step(self, step: int, **fields) -> None:
        """Facts the driver knows: epoch, wall_s, step_s, and for the parameter-server
        algorithms the phases, bytes and loss it measured itself."""
        st = self._step(step)
        if st is None:
            return
        if fields.get("wall_s") is not None:
            # when the loop began, on the machine's clock: each step's fact given now bounds
            # it from above (a fact may come late, with its task's records)
            now = time.time()
            began = now - fields["wall_s"]
            if self.loop_unix_s is None:
                self.loop_unix_s = [began, now]
            self.loop_unix_s = [min(self.loop_unix_s[0], began), max(self.loop_unix_s[1], now)]
            fields["wall_s"] += self.wall_offset
            self.last_wall = max(self.last_wall, fields["wall_s"])
        st.row.update(fields)
        if fields.get("step_s") is not None:
            self._recent.append(fields["step_s"])
        self._note_loss(step, fields.get("train_loss"))
        if self.recovering is not None:  # the first step done since a recovery began
            event, began = self.recovering
            event["to_next_step_s"] = round(time.monotonic() - began, 3)
            self.recovering = None

    def add_phase(self, step: int, phase: str, rank, seconds: float) -> None:
        st = self._step(step)
        if st is not None:
            st.phase[phase][rank] += seconds

    def add_bytes(self, step: int, field: str, nbytes: float) -> None:
        st = self._step(step)
        if st is not None:
            st.nbytes[field] += nbytes

    def add_loss(self, step: int, loss_sum: float) -> None:
        st = self._step(step)
        if st is not None:
            st.loss = loss_sum if st.loss is None else st.loss + loss_sum
        self._note_loss(step, loss_sum)

    def _note_loss(self, step: int, value) -> None:
        if value is not None and not math.isfinite(value) and self._nonfinite is None:
            self._nonfinite = (step, value)

    def median_step_s(self) -> float | None:
        """The median step over the newest :data:`RECENT_STEPS` steps (for loops that run on
        the workers, from their records as they come); ``None`` before any."""
        if self._loops_begin:
            self._loop_rows()
        return statistics.median(self._recent) if self._recent else None

    def first_nonfinite_loss(self) -> tuple[int, float] | None:
        """``(step, value)`` of the first NaN or infinite training loss seen, if any."""
        return self._nonfinite

    def steps_with_records(self, n_ranks: int) -> int:
        """How many steps, from the first, every rank has finished (``map`` recorded)."""
        if self._first_map is None:
            return 0
        while True:
            step = self._first_map + self._complete
            st = self._steps.get(step)
            written = self._written_upto is not None and step <= self._written_upto
            if not (written or (st is not None and len(st.phase.get("map", ())) >= n_ranks)):
                return self._complete
            self._complete += 1

    def loop_begins(self, step: int, per_epoch: int) -> None:
        """The ranks run a loop of their own from ``step`` (ddp: a task each, from checkpoint
        to checkpoint): the log makes the driver's rows from their records."""
        self._loops_begin.add(step)
        self._per_epoch = per_epoch

    def _loop_rows(self, final: bool = False) -> None:
        """Driver rows of ranks that run their own loop, for each step whose records are all
        in (every rank has begun the next one; ``final``: every step recorded): a step ends
        when its last rank's update ends, and starts when the step before it ended, or where a
        loop begins, when its first rank starts it (the time between two loops, the driver's
        checkpoint, is not training time). Each step's row is made once."""
        after = -1 if self._loop_last is None else self._loop_last
        steps = sorted(s for s, st in self._steps.items() if s > after and "map" in st.phase)
        for step, following in zip(steps, [*steps[1:], None][: len(steps)], strict=True):
            st = self._steps[step]
            ready = following is not None and len(self._steps[following].phase["map"]) >= (
                self.n_workers
            )
            if not (final or ready):
                return
            end = st.stop
            if self._loop_end is None or step in self._loops_begin:
                self._loop_end = st.start
            if self.recovering is not None:  # the ranks' clock, not when the driver looked
                event, _ = self.recovering
                event["to_next_step_s"] = round(end - event["detected_unix"], 3)
                self.recovering = None
            # a rank that began the step before the slowest one ended the step before waits
            # in its all-reduce for it: its map (and the all-reduce inside it) counts from the
            # step's start, as the step does, so that no phase is longer than its step
            for phase, stops in st.stops.items():
                took = st.phase.get(phase, {})
                st.row[f"{phase}_s"] = max(
                    min(took[rank], stop - self._loop_end) for rank, stop in stops.items()
                )
            self._loop_wall += end - self._loop_end
            self.driver_step(
                step,
                epoch=step // self._per_epoch,
                wall_s=self._loop_wall,
                step_s=end - self._loop_end,
            )
            self._loop_end, self._loop_last = end, step

    def chunk_rows(self, steps: range, t0: float, t1: float, per_epoch: int) -> None:
        """Driver rows for steps that ran in one task per worker, from ``t0`` to ``t1`` on the
        driver's clock: each step takes its slowest rank's time (its ``step`` records), and
        the first step also takes what is left (launching the task), so the steps add up to
        the driver's time."""
        took = []
        for s in steps:
            st = self._steps.get(s)
            took.append(max(st.phase["step"].values(), default=0.0) if st else 0.0)
        span, inner = t1 - t0, sum(took[1:])
        if inner + took[0] > span:  # the slowest ranks of different steps add up to more
            took = [x * span / (inner + took[0]) for x in took]
        else:
            took[0] = span - inner
        wall = t0
        for step, seconds in zip(steps, took, strict=True):
            wall += seconds
            self.driver_step(step, epoch=step // per_epoch, wall_s=wall, step_s=seconds)

    def note(self, message: str) -> None:
        """Something the summary should mention (a lost worker, a resume)."""
        self.events.append(message)

    def checkpointed(self, step: int) -> None:
        """Write every row up to ``step`` (the checkpoint's last), flushed to disk, so the
        history beside a checkpoint holds every step before it."""
        self.write_rows(step, sync=True)

    def evaluation(self, step: int, accuracy: float, loss: float) -> None:
        st = self._step(step)
        if st is not None:
            st.row.update(test_accuracy=accuracy, test_loss=loss)

    def ingest(self, replies) -> None:
        """Take in the workers' records and transfer logs, one reply of
        :func:`dcoded.engine.registry.drain_records` per worker."""
        for reply in replies:
            peak, worker = reply.get("peak_rss"), reply.get("worker")
            if peak is not None:
                self.peak_rss[worker] = max(peak, self.peak_rss.get(worker, 0))
            for rec in reply["records"]:
                self._add_record(rec)
            for e in reply["out"]:
                if self.peers is None or e["who"] in self.peers:
                    self._add_transfer_bytes(e)
            for e in reply["in"]:
                self._add_transfer_window(e)

    def _add_record(self, rec: dict) -> None:
        step = rec["step"]
        for name, n in rec.get("repairs", {}).items():  # counted whenever they come
            self.repairs[name] += n
        if "allreduced" in rec:
            self.allreduced += rec["allreduced"]
        for kind, nbytes in rec.get("sent", {}).items():  # over the direct transport
            self.direct_by_kind[kind] += nbytes
        st = self._step(step)
        if st is None:
            return
        if rec["phase"] in ("straggle", "tolerance", "throttle"):
            self._add_straggle(st, rec)
            return
        if "exchange" in rec:  # a direct exchange: timed across ranks, see _row()
            w = st.exchanges.setdefault(
                (rec["phase"], rec["exchange"]), [float("-inf"), float("-inf")]
            )
            w[0], w[1] = max(w[0], rec["start"]), max(w[1], rec["stop"])
        else:
            st.phase[rec["phase"]][rec["rank"]] += rec["stop"] - rec["start"]
            if rec["phase"] in ("map", "shuffle"):
                st.stops[rec["phase"]][rec["rank"]] = rec["stop"]
            if rec["phase"] == "map" and (self._first_map is None or step < self._first_map):
                self._first_map = step
        st.stop = max(st.stop, rec["stop"])
        st.start = rec["start"] if st.start is None else min(st.start, rec["start"])
        for name in ("multicast", "unicast", "params"):
            if name in rec:
                st.nbytes[name] += rec[name]
        if "loss" in rec:
            self.add_loss(step, rec["loss"])
        for nbytes in rec.get("sent", {}).values():
            st.nbytes["direct"] += nbytes
        for label, digest in rec.get("digests", {}).items():
            first = st.digests.setdefault((rec["cluster"], label), (rec["rank"], digest))
            if first[1] != digest:
                raise ReplicaMismatch(
                    f"sub-batch {label} of step {step} was computed with different bits by "
                    f"workers of rank {first[0]} and {rec['rank']}: the coded shuffle needs "
                    "bit-identical replicas (same torch and numpy builds, CPU kernels and thread "
                    "count on every worker)"
                )

    def _add_straggle(self, st: _Step, rec: dict) -> None:
        rank = rec["rank"]
        if rec["phase"] == "throttle":
            keep = ("how", "detail", "speed", "quota_us", "period_us")
            self.throttles[rank] = {k: rec[k] for k in keep if k in rec} | {"steps": 0}
            if rec["how"] != "cgroup":
                message = (
                    f"straggle=slow: rank {rank} falls back to a delay of (1/speed - 1) times "
                    f"each computation ({rec['detail']})"
                )
                logging.getLogger("dcoded").warning(message)
                self.note(message)
        elif rec["phase"] == "tolerance":
            st.not_waited.update(rec["late"])
        else:
            if rec.get("drawn_ms") or rec.get("slept_ms"):
                st.injected[rank] = (rec["drawn_ms"], rec["slept_ms"])
            if rec.get("abandoned"):
                st.abandoned.add(rank)
                # a rank that gave up its own map was not waited for, even where every other
                # owner had all it needed before it heard so (and so named no one late)
                st.not_waited.add(rank)

    def straggle_summary(self) -> dict:
        """What was injected and whom the steps did not wait for, for ``summary.json``:
        ``injected`` lists ``[step, rank, drawn ms, slept ms]`` wherever a delay was drawn
        or slept (a delay ends early when its map is abandoned), the first
        :data:`INJECTED_LISTED` of them; ``throttles`` how each ``slow`` rank was slowed and
        on how many ``steps`` (a CPU quota: every step it held). ``injected_count`` counts
        every step and rank slowed, by a delay or a quota, and ``steps_with_injection`` every
        step with one."""
        return {
            "throttles": {str(k): v for k, v in sorted(self.throttles.items())},
            "injected": sorted(self._injected),
            "injected_count": self._injected_count,
            "injected_ms_total": {
                str(k): round(v, 3) for k, v in sorted(self._injected_ms.items())
            },
            "steps_with_injection": self._steps_injected,
            "not_waited": {str(k): v for k, v in sorted(self._not_waited_counts.items())},
            "abandoned": {str(k): v for k, v in sorted(self._abandoned_counts.items())},
            "steps_not_waiting": self._steps_not_waiting,
        }

    def _attribute(self, key) -> tuple[str, int] | None:
        """``(kind, step)`` a transferred key belongs to, or ``None`` if not this run's
        training traffic. Segments updated in step ``s`` are all-gathered for step ``s+1``."""
        parsed = parse_key(key)
        if not parsed or parsed[0] != self.run_id:
            return None
        _, kind, step = parsed
        if kind in PARAM_KINDS:
            return kind, step + 1
        return (kind, step) if kind in SHUFFLE_KINDS else None

    def _add_transfer_bytes(self, entry: dict) -> None:
        for key, nbytes in entry["keys"].items():
            found = self._attribute(key)
            if found:
                self.dask_by_kind[found[0]] += nbytes
                self.add_bytes(found[1], "dask", nbytes)

    def _add_transfer_window(self, entry: dict) -> None:
        for key in entry["keys"]:
            found = self._attribute(key)
            st = self._step(found[1]) if found else None
            if st is not None:
                phase = "params" if found[0] in PARAM_KINDS else "shuffle"
                w = st.windows.setdefault(phase, [float("inf"), float("-inf")])
                w[0], w[1] = min(w[0], entry["start"]), max(w[1], entry["stop"])

    # ------------------------------------------------------------------ outputs
    def write_rows(self, upto: int | None = None, sync: bool = False) -> None:
        """Write the rows of the steps up to ``upto`` (every step: ``None``) to the history
        file, in step order, and forget what the log held of them; ``sync``: flush the file
        to disk (beside a checkpoint).

        Ctrl-C and SIGTERM wait until it is done (:func:`~dcoded.interrupt.signals_deferred`):
        raised in between, they lost the steps already taken out of the log and not yet in the
        file, and the interrupted run's last rows left a hole in its history."""
        with signals_deferred():
            if self._loops_begin:
                self._loop_rows(final=True)
            steps = sorted(s for s in self._steps if upto is None or s <= upto)
            rows = []
            for step in steps:
                st = self._steps.pop(step)
                if st.row:  # a step the driver knows (setup's records have none)
                    rows.append(self._row(step, st))
                    self._straggled(step, st)
            if steps:
                self._written_upto = max(steps[-1], self._written_upto or steps[-1])
            if rows:
                self.history_file.append(rows, sync=sync)
                self.last_written = rows[-1]["step"]
            elif sync:
                self.history_file.sync()

    def _row(self, step: int, st: _Step) -> dict:
        """The step's row (``HISTORY_COLUMNS``), ``None`` where a value does not apply."""
        row = dict.fromkeys(HISTORY_COLUMNS)
        row["step"] = step
        row.update(st.row)
        for phase in PHASES:
            key = f"{phase}_s"
            if row.get(key) is not None:
                continue
            exchanges = [w for (p, _), w in st.exchanges.items() if p == phase]
            if exchanges:
                row[key] = sum(stop - start for start, stop in exchanges)
            elif st.phase.get(phase):
                row[key] = max(st.phase[phase].values())
            elif phase in st.windows:
                window = st.windows[phase]
                row[key] = window[1] - window[0]
        for name in BYTE_FIELDS:
            key = f"bytes_{name}"
            if row.get(key) is None and name in st.nbytes:
                row[key] = st.nbytes[name] / self.n_workers
        drawn = [  # the delay drawn, or the one "slow" slept where it had no cgroup
            max(st.injected.get(k, (0.0, 0.0))[0], 0.0) or st.injected.get(k, (0.0, 0.0))[1]
            for k in range(self.n_workers)
        ]
        if any(drawn):
            row["straggle_ms"] = " ".join(f"{x:g}" for x in drawn)
        if st.not_waited:
            row["not_waited"] = " ".join(map(str, sorted(st.not_waited)))
        if st.abandoned:
            row["abandoned"] = " ".join(map(str, sorted(st.abandoned)))
        if row.get("train_loss") is None and st.loss is not None:
            row["train_loss"] = st.loss / self.batch_size
        return row

    def _straggled(self, step: int, st: _Step) -> None:
        """Add a written step's injected delays, slow ranks and late ranks to the run's
        totals. A rank in a cgroup ran at its quota the whole step: slowed, with no delay."""
        for rank, (drawn, slept) in sorted(st.injected.items()):
            self._injected_ms[rank] += drawn
            if len(self._injected) < INJECTED_LISTED:
                self._injected.append([step, rank, round(drawn, 3), round(slept, 3)])
        slowed = set(st.injected)
        for rank, throttle in self.throttles.items():
            if throttle["how"] == "cgroup" or rank in st.injected:
                throttle["steps"] += 1
                slowed.add(rank)
        self._injected_count += len(slowed)
        self._steps_injected += bool(slowed)
        for rank in st.not_waited:
            self._not_waited_counts[rank] += 1
        for rank in st.abandoned:
            self._abandoned_counts[rank] += 1
        if st.not_waited:
            self._steps_not_waiting += 1
            self.late_sets[frozenset(st.not_waited)] += 1

    def rows(self, since: int = 0) -> list[dict]:
        """This attempt's rows, every step written (steps from ``since`` that no later
        attempt did again), read back from the history file with their types."""
        self.write_rows()
        if self.last_written is None:
            return []
        return [r for r in self.history_file.read() if r["step"] >= since and not r["replayed"]]

    def time_medians(self, rows: list[dict]) -> dict[str, float]:
        return {p: _median(rows, f"{p}_s") for p in ("step", *PHASES)}

    def bytes_means(self, rows: list[dict], exchanged: bool = True) -> dict[str, float | None]:
        """Mean over steps of each byte count per worker; a step with no record of a count
        moved none (``exchanged=False``: nothing is ever exchanged, every count is ``None``)."""
        if not exchanged or not rows:
            return dict.fromkeys(BYTE_FIELDS)
        return {b: statistics.fmean(r.get(f"bytes_{b}") or 0.0 for r in rows) for b in BYTE_FIELDS}

    def by_kind_means(self, n_steps: int, transport: str = "dask") -> dict[str, float]:
        """Bytes per worker per step that ``transport`` (``dask`` or ``direct``) moved, split
        by what moved (``seg``, ``pkt``, ...)."""
        moved = self.dask_by_kind if transport == "dask" else self.direct_by_kind
        return {k: v / (self.n_workers * n_steps) for k, v in sorted(moved.items())}


class HistoryFile:
    """``history.csv``, appended to as the run goes (``HISTORY_COLUMNS``), made at its first
    rows: a run that fails before its first step writes none. ``earlier``: the rows it starts
    with (a resumed run's steps before its checkpoint, values as read). ``path=None``: a
    temporary file, made at the first rows too and removed by :meth:`close`.

    >>> import pathlib, tempfile
    >>> h = HistoryFile(pathlib.Path(tempfile.mkdtemp()) / "history.csv")
    >>> h.append([{"step": 0, "wall_s": 0.5}, {"step": 1, "wall_s": 1.25}])
    >>> h.mark_replayed(1)
    >>> [(r["step"], r["wall_s"], r["replayed"]) for r in h.read()]
    [(0, 0.5, None), (1, 1.25, 1)]
    """

    def __init__(self, path: Path | None, earlier: Iterable[dict] = ()):
        self.temporary = path is None
        self.path = None if path is None else Path(path)
        self._earlier: list[dict] | None = list(earlier)  # until the file is made

    def append(self, rows: list[dict], sync: bool = False) -> None:
        if self._earlier is not None:  # the first rows: a new file, whatever was at the name
            if self.path is None:
                fd, name = tempfile.mkstemp(prefix="dcoded-history-", suffix=".csv")
                os.close(fd)
                self.path = Path(name)
            before, self._earlier = self._earlier, None
            write_history(self.path, [*before, *rows])
            return
        with files.append(self.path) as f:
            csv.DictWriter(f, fieldnames=HISTORY_COLUMNS, extrasaction="ignore").writerows(
                _cells(r) for r in rows
            )
            if sync:
                f.flush()
                os.fsync(f.fileno())

    def sync(self) -> None:
        """Make the file now if it is not made yet (a resumed run's checkpoint before its
        first row is written: the history beside it holds the earlier steps)."""
        if self._earlier:
            self.append([])

    def read(self) -> list[dict]:
        """Every row, with its types (:data:`INT_COLUMNS`, :data:`TEXT_COLUMNS`, floats; an
        empty cell is ``None``)."""
        if self._earlier is not None:
            return [_typed(_cells(r)) for r in self._earlier]
        with open(self.path, newline="") as f:
            return [_typed(r) for r in csv.DictReader(f)]

    def mark_replayed(self, from_step: int) -> None:
        """Mark the rows of ``from_step`` on as done again by a later attempt (a recovery goes
        on from an earlier checkpoint): rewrites the file, once per recovery."""

        def mark(r: dict) -> dict:
            return {**r, "replayed": 1} if int(r["step"]) >= from_step else r

        if self._earlier is not None:
            self._earlier = [mark(r) for r in self._earlier]
            return
        with open(self.path, newline="") as f:
            rows = [mark(r) for r in csv.DictReader(f)]
        write_history(self.path, rows)

    def close(self) -> None:
        """Remove a temporary file (if it was made)."""
        if self.temporary and self.path is not None:
            self.path.unlink(missing_ok=True)


def _median(rows, key):
    v = [r[key] for r in rows if r.get(key) is not None and r.get("step", 0) >= 0]
    return statistics.median(v) if v else 0.0


def _cells(row: dict) -> dict:
    return {k: ("" if v is None else v) for k, v in row.items()}


def _typed(row: dict) -> dict:
    """A row as :func:`csv.DictReader` reads it, with its values' types back (a float written
    by :mod:`csv` is its ``repr``, so it reads back to the same bits); what does not parse
    stays text."""
    out = {}
    for key, value in row.items():
        out[key] = None if value in ("", None) else value
        if out[key] is None or key in TEXT_COLUMNS:
            continue
        with contextlib.suppress(ValueError):
            out[key] = int(value) if key in INT_COLUMNS else float(value)
    return out


def write_history(path: Path, rows: list[dict]) -> None:
    """``history.csv`` (``HISTORY_COLUMNS``), written to a temporary name then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(f) -> None:
        writer = csv.DictWriter(f, fieldnames=HISTORY_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(_cells(r) for r in rows)

    files.replace(path, write, newline="")
