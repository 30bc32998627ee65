"""Stragglers to measure against (the ``straggle`` config group), injected on the workers.

Every algorithm meets the same stragglers: what is injected at ``(train.seed, step, rank)`` is
drawn from a generator seeded by exactly that, so ``ddp``, ``ssgd``, ``asgd`` and ``cdc`` see the
same slow workers at the same steps (``serial`` has no workers and ignores it).

- ``none``: nothing.
- ``slow``: the workers in ``straggle.workers`` run at ``straggle.speed`` of their fair share of
  the host's cores for the whole run. Where the worker may (root, a cgroup v1 ``cpu``
  controller at :data:`CGROUP_ROOT`, one worker per process) its process is put in a cgroup
  whose CPU quota is that share: a real slowdown of everything it does. Elsewhere it falls
  back to a delay after each computation of ``(1/speed - 1)`` times what it took.
- ``stall``: each worker, each step, stalls with probability ``straggle.p`` for
  ``straggle.stall_ms`` before computing (the Bernoulli stall).
- ``exp``: each worker's computation, each step, starts after an exponential delay of mean
  ``straggle.mean_ms``: with the computation itself as the shift, its time is the shifted
  exponential of Lee et al. and Li et al.

A delay ends early when the computation it delays is abandoned (``cdc`` with
``coding.stragglers``). What was injected is recorded per step and rank (``straggle_ms`` in
``history.csv``, ``straggle`` in ``summary.json``).

>>> spec = {"model": "stall", "p": 0.5, "stall_ms": 200.0}
>>> [drawn_ms(spec, 0, 3, rank) for rank in range(4)]
[200.0, 0.0, 0.0, 200.0]
>>> drawn_ms(spec, 0, 3, 1) == drawn_ms(spec, 0, 3, 1)  # the same for every algorithm
True
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from dcoded.scale import cfs_quota

#: The straggler models (``straggle.model``).
MODELS = ("none", "slow", "stall", "exp")
#: Where the cgroup v1 cpu controller is mounted (a worker of the emulated network is told
#: another way to it in ``DCODED_CGROUP_ROOT``: see :func:`cgroup_root`).
CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")


def cgroup_root() -> Path:
    """The cpu controller as this process sees it."""
    return Path(os.environ.get("DCODED_CGROUP_ROOT") or CGROUP_ROOT)


#: What a slow worker's cgroup is named with (then the run and the rank); a worker of the
#: emulated network is told its network's own in ``DCODED_CGROUP_PREFIX``: the network's
#: teardown removes them by it, also where the run's driver could not (killed with it).
CGROUP_PREFIX = "dcoded-"


def cgroup_name(run_id: str, rank: int) -> str:
    """The cgroup ``rank`` of ``run_id`` is slowed in, as this process names it.

    >>> cgroup_name("dc1a2b", 1)
    'dcoded-dc1a2b-1'
    """
    return f"{os.environ.get('DCODED_CGROUP_PREFIX') or CGROUP_PREFIX}{run_id}-{rank}"


#: A word mixed into the seed, so the draws do not coincide with any other use of the seed.
_STREAM = 0x5354524C
#: How often an interruptible delay looks whether its computation was abandoned.
POLL_S = 0.002


def check(straggle: Mapping | None, n_workers: int) -> dict:
    """The ``straggle`` group as plain data, checked; ``ValueError`` names the bad setting.

    >>> check({"model": "slow", "workers": [1], "speed": 0.33}, 4)["workers"]
    [1]
    >>> check({"model": "stall", "p": 1.5, "stall_ms": 10}, 4)
    Traceback (most recent call last):
    ...
    ValueError: straggle.p=1.5 is not allowed: it must be a probability in 0..1
    """
    s = dict(straggle or {"model": "none"})
    model = s.get("model", "none")
    if model not in MODELS:
        raise ValueError(f"straggle={model!r} is not known: choose one of {MODELS}")

    def number(name, low, high=None, low_open=False):
        v = s.get(name)
        bad = not isinstance(v, int | float) or isinstance(v, bool) or not np.isfinite(v)
        if not bad:
            bad = v <= low if low_open else v < low
            bad = bad or (high is not None and v > high)
        if bad:
            what = {
                "speed": "a fraction of the worker's fair share in (0, 1]",
                "p": "a probability in 0..1",
            }.get(name, f"a number {'>' if low_open else '>='} {low}")
            raise ValueError(f"straggle.{name}={v!r} is not allowed: it must be {what}")
        return float(v)

    out = {"model": model}
    if model == "slow":
        workers = s.get("workers")
        if (
            not isinstance(workers, list | tuple)
            or not workers
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in workers)
            or not all(0 <= w < n_workers for w in workers)
        ):
            raise ValueError(
                f"straggle.workers={workers!r} is not allowed: it must be a non-empty list of "
                f"ranks in 0..{n_workers - 1}"
            )
        out.update(workers=sorted(set(workers)), speed=number("speed", 0.0, 1.0, low_open=True))
    elif model == "stall":
        out.update(p=number("p", 0.0, 1.0), stall_ms=number("stall_ms", 0.0))
    elif model == "exp":
        out.update(mean_ms=number("mean_ms", 0.0, low_open=True))
    return out


def drawn_ms(straggle: Mapping | None, seed: int, step: int, rank: int) -> float:
    """The delay before the computation of ``rank`` at ``step`` (ms): the same for every
    algorithm. ``slow`` draws nothing (it slows the whole process, or its fallback scales
    each computation: :func:`slowdown`)."""
    model = (straggle or {}).get("model", "none")
    if model not in ("stall", "exp"):
        return 0.0
    rng = np.random.default_rng([_STREAM, seed, step, rank])
    if model == "stall":
        return float(straggle["stall_ms"]) if rng.random() < straggle["p"] else 0.0
    return float(rng.exponential(straggle["mean_ms"]))


def slowdown(straggle: Mapping | None, rank: int) -> float | None:
    """``slow``: the fraction of its fair share ``rank`` runs at, else ``None``."""
    if (straggle or {}).get("model") == "slow" and rank in straggle["workers"]:
        return float(straggle["speed"])
    return None


def wait(seconds: float, stop: Callable[[], bool] | None = None) -> float:
    """Sleep ``seconds``, ending early once ``stop()`` says so; return the seconds slept."""
    t0 = time.monotonic()
    if seconds <= 0:
        return 0.0
    if stop is None:
        time.sleep(seconds)
        return time.monotonic() - t0
    end = t0 + seconds
    while (left := end - time.monotonic()) > 0 and not stop():
        time.sleep(min(left, POLL_S))
    return time.monotonic() - t0


class Injector:
    """What one rank injects at one step: the drawn delay before it computes, and the
    ``slow`` fallback's delay after each computation; totals for the record."""

    def __init__(self, spec, rank: int, step: int, throttled: bool):
        straggle = spec.straggle
        self.drawn_ms = drawn_ms(straggle, spec.seed, step, rank)
        self.dilation = float(getattr(spec, "dilation", 1.0))  # the scale model's TDF
        speed = slowdown(straggle, rank)
        self.scale = 0.0 if speed is None or throttled else 1 / speed - 1
        self.slept = 0.0

    def before(self, stop=None) -> None:
        self.slept += wait(self.drawn_ms / 1000 * self.dilation, stop)

    def after(self, computed_s: float, stop=None) -> None:
        """The fallback of ``slow``: a delay proportional to the computation just done."""
        if self.scale:
            self.slept += wait(self.scale * computed_s, stop)

    def fields(self) -> dict:
        """For the record: what was drawn and what was slept (less, if abandoned), in the
        emulated cluster's time (undilated)."""
        return {"drawn_ms": self.drawn_ms, "slept_ms": 1000 * self.slept / self.dilation}

    @property
    def active(self) -> bool:
        return bool(self.drawn_ms or self.scale)


# --------------------------------------------------------------------------- the cgroup


def cgroup_usable() -> bool:
    """Whether this process can make cgroups with a CPU quota (root, cgroup v1 ``cpu``)."""
    root = cgroup_root()
    try:
        return (
            hasattr(os, "geteuid")
            and os.geteuid() == 0
            and (root / "cgroup.procs").exists()
            and os.access(root, os.W_OK)
        )
    except OSError:
        return False


def quota(speed: float, cores: float, n_workers: int) -> tuple[int, int]:
    """``(cfs_quota_us, cfs_period_us)`` for ``speed`` of a fair share ``cores / n_workers``
    of a core. The period is short (10 ms, longer only where the quota would fall under the
    kernel's 1 ms minimum), so a throttled worker runs in slices of milliseconds, not of
    tenths of a second.

    >>> quota(0.33, 2, 4)
    (1650, 10000)
    >>> quota(0.1, 2, 16)
    (1000, 80000)
    """
    return cfs_quota(speed * cores / n_workers)


class Throttle:
    """This worker process in a cgroup of its own with a CPU quota (``slow`` as root)."""

    def __init__(self, name: str, speed: float, cores: float, n_workers: int):
        self.root = cgroup_root()
        self.path = self.root / name
        self.quota_us, self.period_us = quota(speed, cores, n_workers)
        self.path.mkdir(exist_ok=True)
        (self.path / "cpu.cfs_period_us").write_text(str(self.period_us))
        (self.path / "cpu.cfs_quota_us").write_text(str(self.quota_us))
        (self.path / "cgroup.procs").write_text(str(os.getpid()))  # every thread moves

    def describe(self) -> str:
        return f"cgroup {self.path.name}: {self.quota_us} us per {self.period_us} us"

    def release(self) -> None:
        """Move this process back to the root group and remove the cgroup."""
        with contextlib.suppress(OSError):
            (self.root / "cgroup.procs").write_text(str(os.getpid()))
        remove(self.path)


def remove(path: Path) -> None:
    """Remove a cgroup, moving any process still in it back to the root group first."""
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (path.parent / "cgroup.procs").write_text(pid)
        path.rmdir()


def remove_stale(prefix: str = "dcoded-") -> list[str]:
    """Remove the cgroups that runs which did not end cleanly left behind."""
    root = cgroup_root()
    if not root.exists():
        return []
    gone = []
    for path in root.glob(f"{prefix}*"):
        if path.is_dir():
            remove(path)
            gone.append(path.name)
    return gone
