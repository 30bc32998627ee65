"""What every driver loop shares: pinning tasks to workers, bounded waits, the clock that
leaves evaluation out of the training time, and periodic evaluation."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from distributed import wait

from dcoded.engine.record import TrainingLog
from dcoded.engine.spec import RunSpec


class StepTimeout(RuntimeError):
    """A step did not finish within ``train.step_timeout_s``."""


def pinned(address: str) -> dict:
    """Submit options that run a task on exactly this worker."""
    return {"workers": [address], "allow_other_workers": False, "pure": False}


def wait_all(futures, spec: RunSpec, what: str) -> None:
    """Wait for ``futures`` within ``spec.step_timeout_s``; re-raise the first task error as
    soon as it happens, with the worker's own exception."""
    pending = set(futures)
    deadline = time.monotonic() + spec.step_timeout_s
    while pending:
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            done, pending = wait(pending, timeout=remaining, return_when="FIRST_COMPLETED")
        except TimeoutError:
            keys = [f.key for f in pending]
            raise StepTimeout(
                f"{what} did not finish within train.step_timeout_s={spec.step_timeout_s:g}s "
                f"({len(keys)} task(s) pending, e.g. {keys[:2]})"
            ) from None
        for f in done:
            if f.status == "error":
                f.result()  # raises the worker's exception


class Clock:
    """Training wall time, with evaluation and bookkeeping paused out of it."""

    def __init__(self):
        self.start = time.perf_counter()
        self._paused = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.start - self._paused

    def paused(self):
        clock = self

        class _Pause:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                clock._paused += time.perf_counter() - self.t0

        return _Pause()


class Progress:
    """A tqdm bar over the training steps, opened at the first step (after cluster start-up
    and worker setup, which it would otherwise count as the first step's time)."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self._bar, self._postfix = total, desc, None, {}

    def update(self, n: int = 1) -> None:
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit="step", leave=False)
        if self._postfix:
            self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.update(n)

    def set_postfix(self, refresh: bool = False, **values) -> None:
        self._postfix = values

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    return n_train // batch_size


def after_step(
    step: int,
    spec: RunSpec,
    log: TrainingLog,
    clock: Clock,
    theta: Callable[[], np.ndarray],
    evaluate: Callable[[np.ndarray], tuple[float, float]],
    client=None,
    progress=None,
    pull_every: int = 10,
) -> None:
    """Evaluate every ``eval_every`` steps and at the last, drain worker records now and then,
    and move the progress bar; none of it counts as training time."""
    last = step + 1 == spec.steps
    with clock.paused():
        if client is not None and (last or (step + 1) % pull_every == 0):
            log.pull(client)
        if last or (spec.eval_every and (step + 1) % spec.eval_every == 0):
            acc, loss = evaluate(theta())
            log.evaluation(step, acc, loss)
            if progress is not None:
                progress.set_postfix(test_acc=f"{acc:.3f}", refresh=False)
        if progress is not None:
            progress.update(1)
