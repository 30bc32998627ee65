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
"""

from __future__ import annotations

import csv
import itertools
import logging
import math
import statistics
import time
from collections import defaultdict
from pathlib import Path

from dcoded import files
from dcoded.engine.registry import parse_key
from dcoded.errors import ReplicaMismatch
from dcoded.results import PHASES

BYTE_FIELDS = ("multicast", "unicast", "params", "dask", "direct")
#: Dask keys of the gradient exchange and of the parameter distribution, by kind.
SHUFFLE_KINDS = frozenset({"pkt", "unc", "sum", "hyb", "red", "grad"})
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


class TrainingLog:
    """Collects per-step facts; :meth:`history` and :meth:`time_medians` summarise them."""

    def __init__(self, run_id: str, n_workers: int, batch_size: int, peers: set[str] | None):
        self.run_id = run_id
        self.n_workers = n_workers
        self.batch_size = batch_size
        #: Dask transfers count only when sent to these addresses (None: to anyone).
        self.peers = peers
        self.rows: dict[int, dict] = {}
        self._phase = defaultdict(lambda: defaultdict(float))  # (step, phase) -> rank -> s
        self._bytes = defaultdict(float)  # (step, field) -> bytes, all workers
        self._loss = defaultdict(float)
        self._windows = defaultdict(lambda: [float("inf"), float("-inf")])  # (step, phase)
        # direct transport: (step, phase, part) -> [latest start, latest stop] over ranks
        self._exchanges = defaultdict(lambda: [float("-inf"), float("-inf")])
        self.events: list[str] = []
        #: train.on_worker_loss=continue: what each recovery did (summary.json "recoveries")
        self.recoveries: list[dict] = []
        #: the newest recovery and when it began (monotonic), until this attempt's first step
        self.recovering: tuple[dict, float] | None = None
        #: a resumed run: the rows of the steps before the checkpoint, from its folder's
        #: history.csv, carried into this run's (values as written there)
        self.earlier: list[dict] = []
        self._stops: dict[int, float] = {}  # step -> when its last task record ended
        self._starts: dict[int, float] = {}  # step -> when its first task record started
        self._loops_begin: set[int] = set()  # see loop_begins
        self._per_epoch = 1
        self.allreduced = 0  # bytes DDP put through all-reduce, all ranks and steps
        self.wire: list[int] | None = None  # bytes each worker interface sent (netem)
        self.kernel_losses: dict | None = None  # netem: the kernel's loss counters' rise
        self._nonfinite: tuple[int, float] | None = None
        self._digests: dict[tuple, tuple[int, str]] = {}  # (step, cluster, T) -> first seen
        self.dask_by_kind: dict[str, float] = defaultdict(float)  # all steps, all workers
        self.direct_by_kind: dict[str, float] = defaultdict(float)  # the same, direct links
        # multicast: datagrams sent again, asks, and datagrams received again by cause
        self.repairs: dict[str, int] = defaultdict(int)
        # the straggle group: (step, rank) -> (drawn ms, slept ms), and how "slow" was made
        self.injected: dict[tuple[int, int], tuple[float, float]] = {}
        self.throttles: dict[int, dict] = {}
        # coding.stragglers: step -> ranks some owner did not wait for; ranks that gave up
        self.not_waited: dict[int, set[int]] = defaultdict(set)
        self.abandoned: dict[int, set[int]] = defaultdict(set)

    # ------------------------------------------------------------------ inputs
    def driver_step(self, step: int, **fields) -> None:
        """Facts the driver knows: epoch, wall_s, step_s, and for the parameter-server
        algorithms the phases, bytes and loss it measured itself."""
        self.rows.setdefault(step, {"step": step}).update(fields)
        self._note_loss(step, fields.get("train_loss"))
        if self.recovering is not None:  # the first step done since a recovery began
            event, began = self.recovering
            event["to_next_step_s"] = round(time.monotonic() - began, 3)
            self.recovering = None

    def add_phase(self, step: int, phase: str, rank, seconds: float) -> None:
        self._phase[(step, phase)][rank] += seconds

    def add_bytes(self, step: int, field: str, nbytes: float) -> None:
        self._bytes[(step, field)] += nbytes

    def add_loss(self, step: int, loss_sum: float) -> None:
        self._loss[step] += loss_sum
        self._note_loss(step, loss_sum)

    def _note_loss(self, step: int, value) -> None:
        if value is not None and not math.isfinite(value) and self._nonfinite is None:
            self._nonfinite = (step, value)

    def median_step_s(self) -> float | None:
        """The median step so far (the driver's rows; else, for loops that run on the workers,
        the time between the last ranks' ends of successive steps); ``None`` before any."""
        took = [r["step_s"] for r in self.rows.values() if r.get("step_s") is not None]
        if not took and len(self._stops) > 1:
            ends = [self._stops[s] for s in sorted(self._stops)]
            took = [b - a for a, b in itertools.pairwise(ends)]
        return statistics.median(took) if took else None

    def first_nonfinite_loss(self) -> tuple[int, float] | None:
        """``(step, value)`` of the first NaN or infinite training loss seen, if any."""
        return self._nonfinite

    def steps_with_records(self, n_ranks: int) -> int:
        """How many steps, from the first, every rank has finished (``map`` recorded)."""
        steps = sorted({step for (step, phase) in self._phase if phase == "map"})
        count = 0
        for step in steps:
            if len(self._phase[(step, "map")]) < n_ranks:
                break
            count += 1
        return count

    def loop_begins(self, step: int, per_epoch: int) -> None:
        """The ranks run a loop of their own from ``step`` (ddp: a task each, from checkpoint
        to checkpoint): :meth:`history` makes the driver's rows from their records."""
        self._loops_begin.add(step)
        self._per_epoch = per_epoch

    def _loop_rows(self) -> None:
        """Driver rows of ranks that run their own loop, for every step a rank has recorded
        (its gradient was all-reduced, so every rank had computed its part): a step ends when
        its last rank's update ends, and starts when the step before it ended, or where a
        loop begins, when its first rank starts it (the time between two loops, the driver's
        checkpoint, is not training time). Rebuilt at each call, as more records come."""
        steps = sorted({s for (s, phase) in self._phase if phase == "map"})
        wall, previous = 0.0, None
        for step in steps:
            end = self._stops[step]
            if previous is None or step in self._loops_begin:
                previous = self._starts[step]
            if self.recovering is not None:  # the ranks' clock, not when the driver looked
                event, _ = self.recovering
                event["to_next_step_s"] = round(end - event["detected_unix"], 3)
                self.recovering = None
            wall += end - previous
            self.driver_step(
                step, epoch=step // self._per_epoch, wall_s=wall, step_s=end - previous
            )
            previous = end

    def chunk_rows(self, steps: range, t0: float, t1: float, per_epoch: int) -> None:
        """Driver rows for steps that ran in one task per worker, from ``t0`` to ``t1`` on the
        driver's clock: each step takes its slowest rank's time (its ``step`` records), and
        the first step also takes what is left (launching the task), so the steps add up to
        the driver's time."""
        took = [max(self._phase[(s, "step")].values(), default=0.0) for s in steps]
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

    def checkpointed(self, run_dir: Path) -> None:
        """Rewrite ``history.csv`` with every step so far, beside the new checkpoint."""
        write_history(run_dir / "history.csv", self.earlier + self.history())

    def evaluation(self, step: int, accuracy: float, loss: float) -> None:
        self.rows.setdefault(step, {"step": step}).update(test_accuracy=accuracy, test_loss=loss)

    def ingest(self, replies) -> None:
        """Take in the workers' records and transfer logs, one reply of
        :func:`dcoded.engine.registry.drain_records` per worker."""
        for reply in replies:
            for rec in reply["records"]:
                self._add_record(rec)
            for e in reply["out"]:
                if self.peers is None or e["who"] in self.peers:
                    self._add_transfer_bytes(e)
            for e in reply["in"]:
                self._add_transfer_window(e)

    def _add_record(self, rec: dict) -> None:
        step = rec["step"]
        if rec["phase"] in ("straggle", "tolerance", "throttle"):
            self._add_straggle(rec)
            return
        if "exchange" in rec:  # a direct exchange: timed across ranks, see history()
            w = self._exchanges[(step, rec["phase"], rec["exchange"])]
            w[0], w[1] = max(w[0], rec["start"]), max(w[1], rec["stop"])
        else:
            self.add_phase(step, rec["phase"], rec["rank"], rec["stop"] - rec["start"])
        self._stops[step] = max(self._stops.get(step, 0.0), rec["stop"])
        self._starts[step] = min(self._starts.get(step, rec["start"]), rec["start"])
        if "allreduced" in rec:
            self.allreduced += rec["allreduced"]
        for field in ("multicast", "unicast", "params"):
            if field in rec:
                self.add_bytes(step, field, rec[field])
        if "loss" in rec:
            self.add_loss(step, rec["loss"])
        for name, n in rec.get("repairs", {}).items():
            self.repairs[name] += n
        for kind, nbytes in rec.get("sent", {}).items():  # over the direct transport
            self.add_bytes(step, "direct", nbytes)
            self.direct_by_kind[kind] += nbytes
        for label, digest in rec.get("digests", {}).items():
            key = (step, rec["cluster"], label)
            first = self._digests.setdefault(key, (rec["rank"], digest))
            if first[1] != digest:
                raise ReplicaMismatch(
                    f"sub-batch {label} of step {step} was computed with different bits by "
                    f"workers of rank {first[0]} and {rec['rank']}: the coded shuffle needs "
                    "bit-identical replicas (same torch and numpy builds, CPU kernels and thread "
                    "count on every worker)"
                )

    def _add_straggle(self, rec: dict) -> None:
        step, rank = rec["step"], rec["rank"]
        if rec["phase"] == "throttle":
            self.throttles[rank] = {k: rec[k] for k in ("how", "detail", "speed")}
            if rec["how"] != "cgroup":
                message = (
                    f"straggle=slow: rank {rank} falls back to a delay of (1/speed - 1) times "
                    f"each computation ({rec['detail']})"
                )
                logging.getLogger("dcoded").warning(message)
                self.note(message)
        elif rec["phase"] == "tolerance":
            self.not_waited[step].update(rec["late"])
        else:
            if rec.get("drawn_ms") or rec.get("slept_ms"):
                self.injected[(step, rank)] = (rec["drawn_ms"], rec["slept_ms"])
            if rec.get("abandoned"):
                self.abandoned[step].add(rank)

    def straggle_summary(self) -> dict:
        """What was injected and whom the steps did not wait for, for ``summary.json``:
        ``injected`` lists ``[step, rank, drawn ms, slept ms]`` wherever a delay was drawn
        or slept (a delay ends early when its map is abandoned)."""
        per_rank = defaultdict(float)
        for (_, rank), (drawn, _) in self.injected.items():
            per_rank[rank] += drawn
        return {
            "throttles": {str(k): v for k, v in sorted(self.throttles.items())},
            "injected": [
                [s, r, round(d, 3), round(w, 3)] for (s, r), (d, w) in sorted(self.injected.items())
            ],
            "injected_ms_total": {str(k): round(v, 3) for k, v in sorted(per_rank.items())},
            "steps_with_injection": len({s for s, _ in self.injected}),
            "not_waited": _count_ranks(self.not_waited),
            "abandoned": _count_ranks(self.abandoned),
            "steps_not_waiting": sum(1 for v in self.not_waited.values() if v),
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
                self.add_bytes(found[1], "dask", nbytes)
                self.dask_by_kind[found[0]] += nbytes

    def _add_transfer_window(self, entry: dict) -> None:
        for key in entry["keys"]:
            found = self._attribute(key)
            if found:
                phase = "params" if found[0] in PARAM_KINDS else "shuffle"
                w = self._windows[(found[1], phase)]
                w[0], w[1] = min(w[0], entry["start"]), max(w[1], entry["stop"])

    # ------------------------------------------------------------------ outputs
    def history(self) -> list[dict]:
        """One row per step (``HISTORY_COLUMNS``), ``None`` where a value does not apply."""
        if self._loops_begin:
            self._loop_rows()
        out = []
        for step in sorted(self.rows):
            row = dict.fromkeys(HISTORY_COLUMNS)
            row.update(self.rows[step])
            for phase in PHASES:
                key = f"{phase}_s"
                if row.get(key) is not None:
                    continue
                per_rank = self._phase.get((step, phase))
                window = self._windows.get((step, phase))
                exchanges = [
                    w for (s, p, _), w in self._exchanges.items() if (s, p) == (step, phase)
                ]
                if exchanges:
                    row[key] = sum(stop - start for start, stop in exchanges)
                elif per_rank:
                    row[key] = max(per_rank.values())
                elif window:
                    row[key] = window[1] - window[0]
            for field in BYTE_FIELDS:
                key = f"bytes_{field}"
                if row.get(key) is None and (step, field) in self._bytes:
                    row[key] = self._bytes[(step, field)] / self.n_workers
            drawn = [  # the delay drawn, or the one "slow" slept where it had no cgroup
                max(self.injected.get((step, k), (0.0, 0.0))[0], 0.0)
                or self.injected.get((step, k), (0.0, 0.0))[1]
                for k in range(self.n_workers)
            ]
            if any(drawn):
                row["straggle_ms"] = " ".join(f"{x:g}" for x in drawn)
            if self.not_waited.get(step):
                row["not_waited"] = " ".join(map(str, sorted(self.not_waited[step])))
            if self.abandoned.get(step):
                row["abandoned"] = " ".join(map(str, sorted(self.abandoned[step])))
            if row.get("train_loss") is None and step in self._loss:
                row["train_loss"] = self._loss[step] / self.batch_size
            out.append(row)
        return out

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


def _count_ranks(by_step: dict[int, set[int]]) -> dict[str, int]:
    """How many steps each rank appears in."""
    counts = defaultdict(int)
    for ranks in by_step.values():
        for r in ranks:
            counts[r] += 1
    return {str(k): v for k, v in sorted(counts.items())}


def _values(rows, key):
    return [r[key] for r in rows if r.get(key) is not None and r.get("step", 0) >= 0]


def _median(rows, key):
    v = _values(rows, key)
    return statistics.median(v) if v else 0.0


def write_history(path: Path, rows: list[dict]) -> None:
    """``history.csv`` (``HISTORY_COLUMNS``), written to a temporary name then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(f) -> None:
        writer = csv.DictWriter(f, fieldnames=HISTORY_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})

    files.replace(path, write, newline="")
