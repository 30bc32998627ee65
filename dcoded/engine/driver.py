"""What every driver loop shares: the run's context, pinning tasks to workers, bounded waits
that notice a lost worker or scheduler, the clock that leaves evaluation and bookkeeping out
of the training time, periodic evaluation and checkpoints."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from distributed import wait

from dcoded import checkpoint, health
from dcoded.data import steps_per_epoch
from dcoded.engine import registry
from dcoded.engine.record import WRITE_LAG, TrainingLog
from dcoded.engine.replica import Replica
from dcoded.engine.spec import RunSpec
from dcoded.errors import Divergence, StepTimeout, WorkerLost

#: How often a wait looks at the cluster's health while it waits.
POLL_S = 2.0
#: How long a question to the scheduler may take before it counts as gone.
SCHEDULER_TIMEOUT_S = 10.0
#: A worker the scheduler has not heard from (no heartbeat, nothing; Dask's come every 0.5 to
#: 2 s) for ``max(FROZEN_STEPS x the median step, FROZEN_MIN_S)`` is frozen (a stopped
#: process, a partition: no connection breaks) and counts as lost; before the run has a
#: median step, after ``FROZEN_FIRST_S`` (a first step may be slow, a heartbeat is not).
FROZEN_STEPS, FROZEN_MIN_S, FROZEN_FIRST_S = 10, 10.0, 60.0


def frozen_after(median_step_s: float | None, dilation: float = 1.0) -> float:
    """Seconds of silence after which a worker counts as frozen (the floors stand for compute
    and network times: ``dilation``, the scale model's or a crowded host's
    (:attr:`Context.patience`), multiplies them; the median step is measured, so dilated
    already).

    >>> frozen_after(None), frozen_after(0.05), frozen_after(3.0), frozen_after(0.05, 4.0)
    (60.0, 10.0, 30.0, 40.0)
    """
    if median_step_s is None:
        return FROZEN_FIRST_S * dilation
    return max(FROZEN_STEPS * median_step_s, FROZEN_MIN_S * dilation)


@dataclass
class Context:
    """Everything a driver needs; ``client`` and ``workers`` are empty for ``serial``."""

    spec: RunSpec
    client: object | None
    workers: list[str]
    log: TrainingLog
    reference: Replica  # the driver's own replica: evaluation, and the server's model
    progress: Progress | None = None
    resume: checkpoint.Checkpoint | None = None
    run_dir: Path | None = None
    last_checkpoint: Path | None = None
    #: worker processes per CPU on the most crowded host (:func:`dcoded.preflight.crowding`):
    #: there a worker's and the scheduler's answers come that many times later
    crowding: float = 1.0

    @property
    def patience(self) -> float:
        """How many times longer than on machines of their own the cluster may take to answer
        before it counts as gone: the scale model's dilation, times the crowding of a host
        whose workers share its CPUs."""
        return self.spec.dilation * self.crowding

    @property
    def start_step(self) -> int:
        return self.resume.step if self.resume else 0

    @property
    def steps_per_epoch(self) -> int:
        """Steps of one epoch (the sample order's, :func:`dcoded.data.steps_per_epoch`)."""
        return steps_per_epoch(len(self.reference.data.y_train), self.spec.batch_size)

    def wait_all(
        self, futures, what: str, timeout: float | None = None, setup: bool = False
    ) -> None:
        """Wait for ``futures`` within ``timeout`` (default ``train.step_timeout_s``; with
        ``setup``, the workers' setup: ``train.setup_timeout_s``); re-raise the first task
        error as soon as it happens; every ``POLL_S`` of waiting, check that the run's workers
        and the scheduler are still there (a task pinned to a dead worker would wait forever)."""
        pending = set(futures)
        limit = self.spec.setup_timeout_s if setup else self.spec.step_timeout_s
        limit = limit if timeout is None else timeout
        bound = (
            f"train.setup_timeout_s={self.spec.setup_timeout_s:g}s"
            if setup
            else f"train.step_timeout_s={self.spec.step_timeout_s:g}s a step"
        )
        deadline = time.monotonic() + limit
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                keys = [f.key for f in pending]
                raise StepTimeout(
                    f"{what} did not finish within {limit:g}s ({bound}; {len(keys)} task(s) "
                    f"pending, e.g. {keys[:2]})"
                )
            pending = self.wait_some(pending, min(remaining, POLL_S), what)

    def wait_some(self, futures, timeout: float, what: str = "waiting") -> set:
        """Wait up to ``timeout`` for any of ``futures`` and return those still pending;
        re-raise a task's error; when nothing finished, check the cluster is still whole."""
        try:
            done, pending = wait(futures, timeout=timeout, return_when="FIRST_COMPLETED")
        except TimeoutError:
            self.check_cluster(what)
            return set(futures)
        except CancelledError as e:  # Dask cancels what a lost worker or scheduler held
            self.check_cluster(what)
            raise WorkerLost(f"{what}: {str(e).splitlines()[-1].strip() or e!r}") from None
        for f in done:
            if f.status == "error":
                f.result()  # raises the worker's exception
            if f.status == "cancelled":
                self.check_cluster(what)
                raise WorkerLost(f"{what}: task {f.key} was cancelled")
        return pending

    def bounded(
        self,
        what: str,
        call: Callable,
        *args,
        check: Callable | None = None,
        setup: bool = False,
        **kwargs,
    ):
        """``call(*args, **kwargs)`` (a blocking client call: gather, scatter, run) within
        ``train.step_timeout_s`` (with ``setup``, before training: ``train.setup_timeout_s``),
        checking every ``POLL_S`` that the cluster is whole: a gather of data a dead worker
        held, or a scatter to it, would otherwise wait forever. Dask's own communication
        errors become :class:`WorkerLost`. ``check(what)`` replaces that health check
        (``asgd`` goes on when another worker is lost)."""
        check = check or self.check_cluster
        name = "setup_timeout_s" if setup else "step_timeout_s"
        limit = getattr(self.spec, name)
        deadline = time.monotonic() + limit

        def watch() -> bool:
            check(what)
            if time.monotonic() > deadline:
                raise StepTimeout(f"{what} did not finish within train.{name}={limit:g}s")
            return False

        failed: list[BaseException] = []  # the call's own error (not the watch's)

        def guarded():
            try:
                return call(*args, **kwargs)
            except BaseException as e:
                failed.append(e)
                raise

        try:
            return health.in_thread(f"dcoded {what}", guarded, watch=watch, poll_s=POLL_S)
        except (OSError, TimeoutError, CancelledError) as error:
            if not failed or error is not failed[0]:
                raise
            check(what)
            raise WorkerLost(f"{what}: {str(error).splitlines()[0]}") from None

    def gather(self, futures, what: str, setup: bool = False):
        """Wait for ``futures`` (bounded, see :meth:`wait_all`), then fetch their results
        straight from the workers (bounded, see :meth:`bounded`)."""
        many = isinstance(futures, list | tuple)
        self.wait_all(futures if many else [futures], what, setup=setup)
        return self.bounded(what, self.client.gather, futures, direct=True, setup=setup)

    def lost_workers(self) -> list[str]:
        return [w for w, _ in self.missing_workers()]

    def missing_workers(self) -> list[tuple[str, str]]:
        """``(address, why)`` of each of the run's workers that is gone from the scheduler,
        or frozen: silent for longer than :func:`frozen_after` of the median step so far."""
        if self.client is None:
            return []
        # bounded: a dead scheduler would otherwise hold this call for the connect timeout
        # (under the scale model the scheduler is a throttled host: its answer is dilated too;
        # on a crowded host it waits for the CPU)
        known = health.known_workers(self.client, SCHEDULER_TIMEOUT_S * self.patience)
        out = [(w, "was lost") for w in self.workers if w not in known]
        limit = frozen_after(self.log.median_step_s(), self.patience)
        seen = [known[w].get("last_seen") for w in self.workers if w in known]
        waits = f"; the seconds times {self.patience:.3g}" if self.patience != 1.0 else ""
        if seen and None not in seen:
            newest = max(seen)  # the scheduler's own clock: another machine's may differ
            for w in self.workers:
                silent = newest - known[w]["last_seen"] if w in known else 0.0
                if silent > limit:
                    out.append(
                        (
                            w,
                            f"has sent nothing for {silent:.0f}s (more than {limit:.0f}s: "
                            f"max({FROZEN_STEPS} x the median step, {FROZEN_MIN_S:g}s), or "
                            f"{FROZEN_FIRST_S:g}s before a step is done{waits}): frozen, "
                            "treated as lost",
                        )
                    )
        return out

    def check_connection(self, what: str) -> None:
        # a reconnecting client is no better: a scheduler that went away forgot the run
        if self.client is not None and self.client.status != "running":
            raise WorkerLost(
                f"{what}: lost the connection to the scheduler (client {self.client.status})"
            )

    def collect(self, what: str, workers: list[str] | None = None) -> None:
        """Bring the workers' records to the log: each worker hands over what it recorded since
        the last collection (:func:`dcoded.engine.registry.drain_records`); the log takes them in
        (:meth:`TrainingLog.ingest`). Cheap: call it every few steps. A scheduler that goes
        away during the call is :class:`WorkerLost` with the reason, not a traceback."""

        def drain():
            # a worker that died took its records with it; the others still answer
            try:
                return self.client.run(
                    registry.drain_records, self.log.run_id, workers=workers, on_error="ignore"
                )
            except (OSError, TimeoutError) as e:
                raise WorkerLost(
                    f"{what}: lost the scheduler while collecting records ({e})"
                ) from None

        # bounded: a frozen worker never answers, and client.run would wait for it for ever
        self.log.ingest(self.bounded(what, drain).values())

    def check_cluster(self, what: str) -> None:
        """Raise :class:`WorkerLost` naming the worker (or the scheduler) that is gone."""
        if self.client is None:
            return
        self.check_connection(what)
        try:
            missing = self.missing_workers()
        except (OSError, TimeoutError) as e:
            raise WorkerLost(f"{what}: cannot reach the scheduler ({e})") from None
        if missing:
            said = "; ".join(f"{w} (rank {self.workers.index(w)}) {why}" for w, why in missing)
            raise WorkerLost(f"{what}: worker {said}", [w for w, _ in missing])


def pinned(address: str) -> dict:
    """Submit options that run a task on exactly this worker."""
    return {"workers": [address], "allow_other_workers": False, "pure": False}


class Clock:
    """Training wall time, with evaluation and bookkeeping paused out of it."""

    def __init__(self):
        self.start = time.perf_counter()
        self._paused = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.start - self._paused

    @contextlib.contextmanager
    def paused(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - t0


class Progress:
    """A tqdm bar over the training steps, opened at the first step (after cluster start-up
    and worker setup, which it would otherwise count as the first step's time).

    Where stderr is not a terminal or a notebook (a log file, a batch job, CI), a bar would
    write ``\r`` lines into it: there it prints one plain line at every tenth of the run.

    >>> import io, contextlib
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     p = Progress(20, "cdc")
    ...     for _ in range(20):
    ...         p.update()
    >>> err.getvalue().splitlines()[:2]
    ['cdc: step 2/20', 'cdc: step 4/20']
    """

    def __init__(self, total: int, desc: str, initial: int = 0):
        self.total, self.desc, self.initial = total, desc, initial
        self._bar, self._postfix = None, {}
        self._lines = not (sys.stderr.isatty() or _in_notebook())
        self._done = initial

    def update(self, n: int = 1) -> None:
        if self._lines:
            before, self._done = self._done, self._done + n
            tenth = max(self.total // 10, 1)
            if self._done // tenth != before // tenth or self._done == self.total:
                post = "".join(f", {k} {v}" for k, v in self._postfix.items())
                print(f"{self.desc}: step {self._done}/{self.total}{post}", file=sys.stderr)
            return
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=self.total, initial=self.initial, desc=self.desc, unit="step", leave=False
            )
        if self._postfix:
            self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.update(n)

    def set_postfix(self, **values) -> None:
        self._postfix = values

    def rewind(self, step: int) -> None:
        """Back to ``step`` done (a run that goes on from an earlier checkpoint)."""
        self._done = step
        if self._bar is not None:
            self._bar.n = step
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _in_notebook() -> bool:
    """Whether this is a Jupyter kernel (where tqdm draws a widget), not merely a process
    that imported IPython."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return any(c.__name__ == "ZMQInteractiveShell" for c in type(shell).__mro__)  # Colab's too


#: Steps between two drains of the workers' records.
COLLECT_EVERY = 10


def bookkeeping_due(ctx: Context, step: int) -> bool:
    """Whether :func:`after_step` does more than move the progress bar after ``step``."""
    spec, done = ctx.spec, step + 1
    return (
        done == spec.steps
        or done % COLLECT_EVERY == 0
        or bool(spec.eval_every and done % spec.eval_every == 0)
        or bool(spec.checkpoint_every and done % spec.checkpoint_every == 0)
    )


def after_step(
    ctx: Context,
    step: int,
    clock: Clock,
    theta: Callable[[], np.ndarray],
    snapshot: Callable[[], tuple[np.ndarray, dict]] | None = None,
) -> None:
    """Drain worker records now and then (and stop on a non-finite loss), evaluate every
    ``eval_every`` steps and at the last, checkpoint every ``checkpoint_every`` steps, write
    the rows a collection behind to ``history.csv``, and move the progress bar; none of it
    counts as training time.

    ``snapshot()`` returns ``(θ, full-length optimizer state)`` for a checkpoint.
    """
    spec, log = ctx.spec, ctx.log
    done = step + 1
    last = done == spec.steps
    checkpoint = snapshot is not None and checkpoint_due(ctx, done)
    # a checkpoint's history holds its steps whole, so their records are collected first
    due = last or done % COLLECT_EVERY == 0 or checkpoint
    with clock.paused():
        if ctx.client is not None and due:
            ctx.collect(f"after step {step}")
        check_finite(log.first_nonfinite_loss())
        if last or (spec.eval_every and done % spec.eval_every == 0):
            acc, loss = ctx.reference.evaluate(theta())
            log.evaluation(step, acc, loss)
            if ctx.progress is not None:
                ctx.progress.set_postfix(test_acc=f"{acc:.3f}")
        if checkpoint:
            save_checkpoint(ctx, done, *snapshot())
        elif due:  # rows a collection behind: every record of their steps is in
            log.write_rows(step - WRITE_LAG)
        if ctx.progress is not None:
            ctx.progress.update(1)


def checkpoint_due(ctx: Context, done: int) -> bool:
    """Whether a checkpoint is written once ``done`` steps are done."""
    every = ctx.spec.checkpoint_every
    return bool(ctx.run_dir and every and done % every == 0)


def save_checkpoint(ctx: Context, done: int, params: np.ndarray, opt_state: dict) -> None:
    """Write the checkpoint of ``done`` steps (``θ`` and the full-length optimizer state) and
    ``history.csv`` beside it; refuse non-finite parameters."""
    spec = ctx.spec
    if not np.all(np.isfinite(params)):
        raise Divergence(f"the parameters are not finite after step {done - 1}")
    meta = {
        "algorithm": spec.algorithm,
        "n_workers": spec.n_workers,
        "redundancy": spec.redundancy,
        "group_size": spec.placement.g,
        "seed": spec.seed,
        "batch_size": spec.batch_size,
        "run_id": spec.run_id,
        "dataset": spec.dataset.get("name"),
        "model": spec.model.get("name"),
        "optimizer": spec.optimizer.get("_target_"),
        "config": spec.extra.get("config"),  # what a resume says it changed
    }
    ckpt = checkpoint.Checkpoint(step=done, theta=params, optimizer=opt_state, meta=meta)
    ctx.last_checkpoint = checkpoint.save(ctx.run_dir, ckpt)
    ctx.log.checkpointed(done - 1)


def check_finite(found: tuple[int, float] | None) -> None:
    """Stop on the first non-finite training loss seen."""
    if found is not None:
        raise Divergence(f"the training loss became {found[1]} at step {found[0]}")
