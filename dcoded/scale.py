"""The scale model: K machines emulated on one host by CPU quotas and time dilation.

On the emulated network (``cluster=netem``) every host (each worker, the scheduler and the
driver) shares this machine's cores. Shared freely, redundant compute costs ``K / cores`` times
what it costs on ``K`` machines, and a host that waits on the network lends its CPU to the
others, which separate machines cannot do. With ``cluster.scale_model=true``:

- every host runs in a cgroup of its own with a hard CPU quota (``cpu.cfs_quota_us``: never more
  than its share, whatever the others do), all equal, pinned one core each (hosts of at most
  one core), adding up to :data:`QUOTA_FRACTION` of each core at most (the rest is left to
  the kernel's network work and the parent process);
- the time-dilation factor follows, ``TDF = host_cores x hosts / cores given to quotas`` (or a
  larger ``cluster.dilation``, the quotas then shrinking to match): every host computes ``TDF``
  times slower than one core of ``host_cores``, so every link rate is divided by ``TDF`` (its
  queues keep their size in bytes) and every protocol timer that stands for a network or
  compute time is multiplied by it;
- a host computes slower per CPU second under a quota than without one (measured, not
  explained): the driver measures by how much on the run's own gradient
  (:func:`measure_speed`) and every quota is raised to match (:func:`corrected_quota`);
- the times reported for the emulated cluster are the wall times divided by ``TDF``
  (``summary.json``'s ``time_s_undilated``, beside ``time_s``);
- fidelity is checked on every run (:func:`judge`): the machine's idle CPU, each host's quota
  use and throttling, the compute speed under the quota, and every shaped link's rate against
  its setting.

What it cannot dilate: the kernel's own TCP timers (a minimum retransmission timeout of 200 ms)
and Dask's heartbeats run in real time, so a loss recovers ``TDF`` times faster, in emulated
time, than on the machines it stands for.

>>> m = plan(host_cores=1, hosts=6, cores=2)
>>> round(m.tdf, 3), round(m.quota_cores, 4), m.quota()
(5.0, 0.2, (2000, 10000))
>>> plan(1, 6, 2, dilation=10).quota()
(1000, 10000)
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dcoded.topology import bucket_bytes

#: The fraction of the machine's cores the hosts' quotas may add up to. The rest stays idle for
#: the kernel: on the emulated network every byte is copied by the kernel in softirq context
#: (veth, bridge, tbf), which no quota charges to a host; on this 2-core kind of machine a
#: cdc K = 8 run at full link rate used 0.2 to 0.3 of a core there. Mininet-HiFi kept 35%.
QUOTA_FRACTION = 0.6
#: The quota's period (us): short, so that a throttled host runs in slices of milliseconds;
#: longer only where the quota would fall under the kernel's 1 ms minimum.
PERIOD_US = 10_000
#: Fidelity: the least idle fraction of the machine's cores the run must keep in at least
#: :data:`IDLE_SHARE` of its sampling intervals (with less, the kernel's network work and the hosts
#: compete: the links or the quotas no longer hold).
IDLE_MIN = 0.15
IDLE_SHARE = 0.95
#: Fidelity: a link's rate never above its setting by more than this fraction (Mininet-HiFi's
#: tests accept 20%). Its rate in an interval whose two ends found its queue backlogged is
#: reported (``least``) but not judged: a queue backlogged at both ends may have been empty in
#: between (a run of cnn gradients showed 0.2 of the rate so); a link starved of the kernel's
#: CPU shows as a machine without idle, which is judged.
LINK_TOLERANCE = 0.2
#: Fidelity: a host's CPU use over the run may not exceed its quota by more than this fraction.
QUOTA_TOLERANCE = 0.05
#: How often the run's counters are sampled (s).
SAMPLE_S = 0.5
#: The compute speed under the quota (:func:`measure_speed`) the quotas are corrected for at
#: most: a host slower than this per CPU second is given ``1 / SPEED_MIN`` of its quota, and its
#: compute reads ``SPEED_MIN / speed`` times long (:func:`compute_bend`). Raised more, the quotas
#: would leave the kernel too little of the cores (0.6 / 0.7 of each at most).
SPEED_MIN = 0.7
#: Fidelity: how much of the median step the compute left uncorrected may add (a fraction).
BEND_TOLERANCE = 0.1
#: The unthrottled CPU time (s) the speed probe computes for, and as much again under the quota.
PROBE_S = 0.3
#: The speed probe's rounds (unthrottled, then throttled, each round).
PROBE_ROUNDS = 3

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
CPUACCT_ROOT = Path("/sys/fs/cgroup/cpuacct")
#: Every host cgroup a run makes starts with this (a killed run's are found by it).
GROUP_PREFIX = "dcoded-sm-"


def machine_cores() -> float:
    """The cores this process may run on."""
    try:
        return float(len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return float(os.cpu_count() or 1)


def cfs_quota(cores: float) -> tuple[int, int]:
    """``(cfs_quota_us, cfs_period_us)`` that let a cgroup use ``cores`` of a core: periods of
    :data:`PERIOD_US`, longer only where the quota would fall under the kernel's 1 ms minimum.

    >>> cfs_quota(0.2), cfs_quota(0.05)
    ((2000, 10000), (1000, 20000))
    """
    period = max(PERIOD_US, math.ceil(1000 / cores))
    return max(1000, round(cores * period)), period


@dataclass(frozen=True)
class ScaleModel:
    """One run's quotas and dilation (see :func:`plan`)."""

    host_cores: float
    hosts: int
    cores: float
    tdf: float
    least_tdf: float

    @property
    def pinned(self) -> bool:
        """Whether each host runs on one core of its own choosing (``host_cores <= 1``): its
        threads then draw on one core's share of the quota. Spread over several cores a host's
        quota is handed to each core in slices, and a slice one core holds while another of
        its threads is throttled is lost: a 2-core run lost a quarter of its quota so, more the
        smaller the quota, which bent times upward as the dilation grew."""
        return self.host_cores <= 1

    def cpu(self, index: int) -> int | None:
        """The core (an index into the cores this process may use) host ``index`` runs on,
        round-robin; ``None`` where hosts are not pinned."""
        return index % int(self.cores) if self.pinned else None

    @property
    def quota_cores(self) -> float:
        """Each host's share of the machine, in cores: ``host_cores / TDF``."""
        return self.host_cores / self.tdf

    def quota(self) -> tuple[int, int]:
        """``(cfs_quota_us, cfs_period_us)`` of each host."""
        return cfs_quota(self.quota_cores)

    def as_dict(self) -> dict:
        quota_us, period_us = self.quota()
        return {
            "tdf": self.tdf,
            "least_tdf": self.least_tdf,
            "host_cores": self.host_cores,
            "hosts": self.hosts,
            "machine_cores": self.cores,
            "quota_fraction": QUOTA_FRACTION,
            "quota_cores": self.quota_cores,
            "quota_us": quota_us,
            "period_us": period_us,
            "pinned": self.pinned,
        }


def plan(host_cores: float, hosts: int, cores: float | None = None, dilation="auto") -> ScaleModel:
    """The quotas and dilation for ``hosts`` emulated machines of ``host_cores`` each on
    ``cores`` real ones: ``TDF = host_cores x hosts / (cores x QUOTA_FRACTION)``, or
    ``dilation`` where that is larger (``ValueError`` where it is smaller: the quotas would
    add up to more than the machine can give). Hosts of at most one core are pinned one core
    each, round-robin (:attr:`ScaleModel.pinned`): then the busiest core's hosts count,
    ``TDF = host_cores x ceil(hosts / cores) / QUOTA_FRACTION``.

    >>> plan(1, 10, 2).tdf
    8.333333333333334
    >>> plan(1, 5, 2).tdf  # three hosts on one core, two on the other
    5.0
    >>> plan(2, 5, 2).tdf  # hosts of two cores are not pinned
    8.333333333333334
    >>> plan(1, 10, 2, dilation=4)
    Traceback (most recent call last):
    ...
    ValueError: cluster.dilation=4 is not allowed: 10 hosts of 1 core on 2 cores need at least 8.33
    """
    cores = machine_cores() if cores is None else float(cores)
    if not host_cores > 0:
        raise ValueError(f"cluster.host_cores={host_cores!r} is not allowed: it must be > 0")
    if host_cores <= 1:  # pinned: the busiest core's hosts
        least = host_cores * math.ceil(hosts / max(1, int(cores))) / QUOTA_FRACTION
    else:
        least = host_cores * hosts / (cores * QUOTA_FRACTION)
    if dilation in (None, "auto"):
        tdf = least
    else:
        if isinstance(dilation, bool) or not isinstance(dilation, int | float):
            raise ValueError(
                f"cluster.dilation={dilation!r} is not allowed: auto, or a number >= {least:.3g}"
            )
        if dilation < least * (1 - 1e-9):
            raise ValueError(
                f"cluster.dilation={dilation!r} is not allowed: {hosts} hosts of {host_cores:g} "
                f"core{'s' * (host_cores != 1)} on {cores:g} cores need at least {least:.3g}"
            )
        tdf = float(dilation)
    return ScaleModel(float(host_cores), int(hosts), cores, float(tdf), float(least))


def from_config(cluster: Mapping, hosts: int) -> ScaleModel | None:
    """The run's scale model from ``cluster.*`` (``None`` where ``scale_model`` is off)."""
    if not cluster.get("scale_model"):
        return None
    return plan(cluster.get("host_cores", 1), hosts, dilation=cluster.get("dilation", "auto"))


def usable() -> str | None:
    """Why host cgroups cannot be made here, or ``None`` where they can."""
    if os.geteuid() != 0:
        return "needs root (a CPU cgroup per host)"
    for root in (CPU_ROOT, CPUACCT_ROOT):
        if not (root / "cgroup.procs").exists():
            return f"needs the cgroup v1 controller at {root}"
    return None


# --------------------------------------------------------------------------- the host cgroups


class HostGroups:
    """One cgroup per emulated host, in the ``cpu`` hierarchy (the quota) and ``cpuacct``
    (its CPU use), made at once and removed by :meth:`remove`."""

    def __init__(self, run: str, names: Sequence[str], model: ScaleModel):
        self.model = model
        self.names = list(names)
        self.run = run
        self.quota_us, period_us = model.quota()
        self.made: list[Path] = []
        try:
            for name in self.names:
                cpu, acct = self.cpu(name), self.acct(name)
                for path in (cpu, acct):
                    path.mkdir(exist_ok=True)
                    self.made.append(path)
                (cpu / "cpu.cfs_period_us").write_text(str(period_us))
                (cpu / "cpu.cfs_quota_us").write_text("-1")  # until the run's loop: limit()
        except OSError:
            self.remove()
            raise

    def quota_files(self, root: str = "") -> list[str]:
        """Each host's ``cpu.cfs_quota_us``, as a process whose ``/`` is ``root`` reaches it
        (the emulated network's driver: ``/proc/<pid>/root`` of this process)."""
        return [f"{root}{self.cpu(name)}/cpu.cfs_quota_us" for name in self.names]

    def limit(self) -> None:
        """Put every host's quota in force (what :func:`quotas_in_force` does in the driver)."""
        write_quotas(self.quota_files(), self.quota_us)

    def unlimit(self) -> None:
        write_quotas(self.quota_files(), -1)

    def cpu(self, name: str) -> Path:
        return CPU_ROOT / f"{GROUP_PREFIX}{self.run}-{name}"

    def acct(self, name: str) -> Path:
        return CPUACCT_ROOT / f"{GROUP_PREFIX}{self.run}-{name}"

    def enter(self, name: str) -> Callable[[], None]:
        """A ``preexec_fn``: the child process joins host ``name``'s groups before it runs
        anything (its children and threads follow)."""
        paths = [self.cpu(name) / "cgroup.procs", self.acct(name) / "cgroup.procs"]

        def join() -> None:
            for path in paths:
                with open(path, "w") as f:
                    f.write(str(os.getpid()))

        return join

    def counters(self) -> dict[str, dict[str, int]]:
        """Each host's ``cpuacct.usage`` (ns) and ``cpu.stat`` now."""
        out = {}
        for name in self.names:
            try:
                row = {"usage_ns": int((self.acct(name) / "cpuacct.usage").read_text())}
                for line in (self.cpu(name) / "cpu.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key in ("nr_periods", "nr_throttled", "throttled_time"):
                        row[key] = int(value)
            except (OSError, ValueError):
                continue
            out[name] = row
        return out

    def remove(self) -> None:
        """Remove every group (a process still in one goes back to the root group)."""
        for path in reversed(self.made):
            remove_group(path)
        self.made = []


def write_quotas(paths: Sequence[str], quota_us: int) -> None:
    for path in paths:
        Path(path).write_text(str(quota_us))


@contextlib.contextmanager
def quotas_in_force(given: Mapping | None, quota_us: int | None = None):
    """The hosts' quotas in force while the block runs: the emulated network's driver wraps its
    training loop in it (``given``: the ``scale`` its parent told it, with ``quota_files``), so
    start-up (torch's import, the data, the replicas), which nothing times, runs unthrottled.
    ``quota_us``: the quota corrected for the compute speed (:func:`corrected_quota`), else
    the plan's. Nothing happens without a scale model."""
    paths = list((given or {}).get("quota_files") or [])
    if paths:
        write_quotas(paths, int(quota_us or given["quota_us"]))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            write_quotas(paths, -1)


def _cpu_of(work: Callable[[], object], calls: int) -> float:
    """This process's CPU time (s) for ``calls`` calls of ``work`` (torch's threads counted)."""
    start = time.process_time()
    for _ in range(calls):
        work()
    return time.process_time() - start


def measure_speed(
    work: Callable[[], object], quota_file: str, quota_us: int, probe_s: float = PROBE_S
) -> dict:
    """How fast this process computes ``work`` under the quota ``quota_us`` (written to its own
    host's ``quota_file`` for the while, then lifted), per CPU second, against unthrottled:
    ``{"calls", "cpu_ms_free", "cpu_ms_quota", "speed"}`` (``speed``: free CPU time over
    throttled, 1 where the quota costs nothing).

    Time dilation assumes that a host given ``1 / TDF`` of a core computes ``TDF`` times slower.
    On a virtual machine it computes slower still. Measured on this kind of machine, one
    process pinned to a core, the CPUs kept awake: a CNN's gradient (40 to 240 samples) took
    1.12 to 1.22 times its unthrottled CPU time at a quota of 0.3 or 0.15 of a core, whatever
    the period (5 to 100 ms: not a cost per throttled slice), a DNN's 1.1 to 1.25 times, a loop
    of Python arithmetic 1.0; a process that slept 150 ms between gradients, with no quota,
    took 1.1 times too. Work with a working set loses speed on a core that idles (its caches,
    or the hypervisor's view of the vCPU: not pinned down). So every compute time a
    scale-model run reported read up to a fifth long. The probe runs the run's own gradient,
    unthrottled, then throttled, :data:`PROBE_ROUNDS` times interleaved, and keeps the least
    CPU time of each way: another process's burst on the core is noise, not the quota's."""
    work()  # warm: the first call allocates
    one = _cpu_of(work, 1)
    calls = max(2, min(200, math.ceil(probe_s / PROBE_ROUNDS / max(one, 1e-6))))
    free, throttled = [], []
    for _ in range(PROBE_ROUNDS):
        free.append(_cpu_of(work, calls))
        write_quotas([quota_file], int(quota_us))
        try:
            throttled.append(_cpu_of(work, calls))
        finally:
            write_quotas([quota_file], -1)
    return {
        "calls": calls * PROBE_ROUNDS,
        "cpu_ms_free": 1e3 * min(free) / calls,
        "cpu_ms_quota": 1e3 * min(throttled) / calls,
        "speed": min(free) / min(throttled) if min(throttled) > 0 else 1.0,
    }


def compute_bend(compute: Mapping, step_s: float | None) -> float | None:
    """The fraction of the median step ``step_s`` (undilated) that the compute the quota's
    correction left adds: each worker's gradient calls of a step (``calls_per_step`` of
    ``cpu_ms_free`` each, the machine's own speed) read ``SPEED_MIN / speed`` times long where
    the speed fell under :data:`SPEED_MIN`; 0 where it did not, ``None`` without a step.

    >>> c = {"speed": 0.35, "cpu_ms_free": 2.0, "calls_per_step": 10}
    >>> round(compute_bend(c, 0.2), 3), compute_bend({**c, "speed": 0.8}, 0.2)
    (0.1, 0.0)
    """
    if not step_s or not compute.get("calls_per_step"):
        return None
    left = max(0.0, SPEED_MIN / max(float(compute["speed"]), 1e-9) - 1)
    return compute["calls_per_step"] * compute["cpu_ms_free"] / 1e3 * left / step_s


def corrected_quota(quota_us: int, period_us: int, speed: float, host_cores: float = 1) -> int:
    """The quota that gives a host computing at ``speed`` (:func:`measure_speed`) per CPU
    second the compute of ``quota_us`` unthrottled: ``quota_us / speed``, for a speed of at
    least :data:`SPEED_MIN` and at most 1 (a faster one is noise: the quota stays), and never
    more than the host's cores allow (a pinned host has one core), nor less than planned.

    >>> corrected_quota(3000, 10000, 0.85), corrected_quota(3000, 10000, 1.03)
    (3529, 3000)
    >>> corrected_quota(3000, 10000, 0.2), corrected_quota(8000, 10000, 0.7)
    (4286, 10000)
    >>> corrected_quota(15000, 10000, 0.75, host_cores=2)  # a host of two cores, not pinned
    20000
    """
    speed = min(1.0, max(SPEED_MIN, float(speed)))
    most = int(period_us * max(1.0, float(host_cores)))
    return max(int(quota_us), min(most, round(int(quota_us) / speed)))


#: Dask's own timers that run in real time and cost CPU each time they fire (the event loop's
#: tick, the system and GIL monitors, the profiler, the memory monitor, work stealing): under
#: the scale model they are dilated like dcoded's own, or a host throttled to ``1 / TDF`` of a
#: core spends ``TDF`` times more of its share on them than a machine would.
DASK_TIMERS = (
    "distributed.admin.tick.interval",
    "distributed.admin.tick.limit",
    "distributed.admin.tick.cycle",
    "distributed.admin.system-monitor.interval",
    "distributed.admin.system-monitor.gil.interval",
    "distributed.worker.profile.interval",
    "distributed.worker.profile.cycle",
    "distributed.worker.memory.monitor-interval",
    "distributed.scheduler.work-stealing-interval",
)


def dask_timers(tdf: float) -> dict[str, str]:
    """Environment variables that set each of :data:`DASK_TIMERS` to ``TDF`` times its value
    in this process's Dask config, for the processes of the emulated hosts.

    >>> env = dask_timers(4.0)
    >>> env["DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL"], env["DASK_DISTRIBUTED__ADMIN__TICK__LIMIT"]
    ('80ms', '12000ms')
    """
    import dask.config
    import distributed  # noqa: F401  (its config's defaults)
    from dask.utils import parse_timedelta

    out = {}
    for key in DASK_TIMERS:
        value = dask.config.get(key, None)
        if value is None:
            continue
        ms = parse_timedelta(value, default="s") * 1000 * tdf
        name = "DASK_" + "__".join(part.upper().replace("-", "_") for part in key.split("."))
        out[name] = f"{ms:.6g}ms"
    return out


#: The kernel's PM QoS file: a process that holds it open with 0 written keeps every CPU out of
#: its sleep states (the idle loop polls) for as long as it holds it.
CPU_LATENCY = Path("/dev/cpu_dma_latency")


class CpusAwake:
    """Every CPU kept out of its sleep states while held (:data:`CPU_LATENCY` at 0).

    A host throttled by its quota leaves its core idle for most of each period; an idle core
    sleeps (in a virtual machine its vCPU halts and the hypervisor runs something else), and
    the host resumes on cold caches. Measured on this kind of machine: a CNN step computed at
    a quota of 0.15 of a core with 10 ms periods took 1.14 times its CPU time unthrottled,
    1.01 times with the CPUs kept awake; the error grew with the dilation. An awake idle CPU
    polls: it still counts as idle, and it burns power (or the hypervisor's CPU)."""

    def __init__(self):
        self.fd: int | None = None
        try:
            self.fd = os.open(CPU_LATENCY, os.O_WRONLY)
            os.write(self.fd, struct.pack("i", 0))
        except OSError:
            self.close()

    @property
    def held(self) -> bool:
        return self.fd is not None

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def remove_group(path: Path) -> None:
    """Remove a cgroup and its children, moving what still runs in them to the root group."""
    if not path.is_dir():
        return
    for child in [p for p in path.iterdir() if p.is_dir()]:
        remove_group(child)
    root = path.parent
    while root.name.startswith(GROUP_PREFIX):
        root = root.parent
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(pid)
    for _ in range(50):  # a moved process leaves its group a moment later
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.02)


def remove_stale(alive: Callable[[str], bool]) -> list[str]:
    """Remove the host cgroups of runs that are gone (``alive(run)`` says which are not)."""
    gone = []
    for root in (CPU_ROOT, CPUACCT_ROOT):
        if not root.is_dir():
            continue
        for path in root.glob(f"{GROUP_PREFIX}*"):
            run = path.name.removeprefix(GROUP_PREFIX).rsplit("-", 1)[0]
            if not alive(run):
                remove_group(path)
                gone.append(str(path))
    return gone


# --------------------------------------------------------------------------- the monitor


def cpu_times() -> tuple[float, float, float]:
    """``(idle, total, softirq)`` jiffies of the whole machine (``/proc/stat``; iowait counts
    idle; softirq is where the kernel moves the emulated links' packets)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields[:8]), fields[6]


class Monitor:
    """Samples, every :data:`SAMPLE_S` in a thread, the machine's idle CPU, each host's
    cgroup counters and each shaped queue's counters (``queues()``: ``{name: {"bytes",
    "backlog"}}``), from :meth:`start` to :meth:`stop`."""

    def __init__(self, groups: HostGroups | None, queues: Callable[[], dict] | None = None):
        self.groups, self.queues = groups, queues
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dcoded-scale-monitor", daemon=True)

    def sample(self) -> dict:
        idle, total, softirq = cpu_times()
        out = {"t": time.monotonic(), "unix": time.time(), "idle": idle, "total": total}
        out["softirq"] = softirq
        if self.groups is not None:
            out["hosts"] = self.groups.counters()
        if self.queues is not None:
            with contextlib.suppress(Exception):  # a namespace torn down under us
                out["queues"] = self.queues()
        return out

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append(self.sample())

    def start(self) -> Monitor:
        self.samples.append(self.sample())
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(timeout=10)
        self.samples.append(self.sample())
        return self.samples


def judge(
    samples: Sequence[Mapping],
    model: ScaleModel,
    rates_mbit: Mapping[str, float],
    window: Sequence[float] | None = None,
    compute: Mapping | None = None,
    step_s: float | None = None,
) -> dict:
    """The run's fidelity from the monitor's samples: ``{"ok", "problems", "idle", "hosts",
    "links"}``, over the samples in ``window`` (the training loop's first and last step, unix
    seconds; for a loop shorter than two samples the pair around it, without judging the
    quotas), or all. It holds if the machine kept at
    least :data:`IDLE_MIN` of its cores idle in :data:`IDLE_SHARE` of the intervals, no host
    used more than its quota (``compute["quota_us_in_force"]``, the quota corrected for the
    compute speed, where the driver measured it), the compute the correction left (a speed under
    :data:`SPEED_MIN`) added at most :data:`BEND_TOLERANCE` of the median step ``step_s``
    (undilated; :func:`compute_bend`), and no shaped queue (``rates_mbit``: the real, dilated
    rate of each) ran above its rate by more than :data:`LINK_TOLERANCE` in any interval.

    >>> m = plan(1, 2, 2)
    >>> s = [{"t": 0.0, "idle": 0.0, "total": 0.0}, {"t": 1.0, "idle": 10.0, "total": 200.0}]
    >>> j = judge(s, m, {})
    >>> j["ok"], j["problems"][0][:45]
    (False, 'the machine was idle 5% (< 15%) in 1 of 1 sam')
    """
    samples, judge_quota = _in_window(samples, window)
    idle, softirq = _idle(samples)
    low = sum(x < IDLE_MIN for x in idle)
    problems = _idle_problems(idle, low)
    quota_cores = model.quota_cores
    bend = compute_bend(compute, step_s) if compute else None
    if compute:
        quota_cores = int(compute["quota_us_in_force"]) / model.quota()[1]
        problems += _bend_problems(compute, bend)
    hosts = _hosts_used(samples, quota_cores)
    if judge_quota:
        problems += _quota_problems(hosts)
    links = _links_used(samples, rates_mbit, model.tdf)
    problems += _link_problems(links)
    return {
        "ok": not problems,
        "problems": problems,
        # False for a loop shorter than two samples: its pair holds unthrottled time
        "quotas_judged": judge_quota,
        "tolerance": _tolerance(),
        # the fraction of the median step the uncorrected compute added (None: nothing left)
        "compute_bend": bend,
        "idle": _idle_summary(idle, softirq, low),
        "hosts": hosts,
        "links": links,
    }


def _idle_problems(idle: Sequence[float], low: int) -> list[str]:
    """:func:`judge`'s problem where the machine was idle under :data:`IDLE_MIN` in more than
    ``1 - IDLE_SHARE`` of the intervals (``low`` of them)."""
    if idle and low > (1 - IDLE_SHARE) * len(idle):
        return [
            f"the machine was idle {100 * min(idle):.0f}% (< {100 * IDLE_MIN:.0f}%) in {low} of "
            f"{len(idle)} samples: the quotas and the kernel competed"
        ]
    return []


def _bend_problems(compute: Mapping, bend: float | None) -> list[str]:
    """:func:`judge`'s problem where the compute the quota's correction left added more than
    :data:`BEND_TOLERANCE` of the step."""
    if bend is not None and bend > BEND_TOLERANCE:
        return [
            f"the hosts computed at {compute['speed']:.2f} of their unthrottled speed under "
            f"the quota, corrected to {SPEED_MIN:g} only: the step's compute reads "
            f"{SPEED_MIN / compute['speed']:.2f}x long, {100 * bend:.0f}% of the step"
        ]
    return []


def _quota_problems(hosts: Mapping[str, Mapping]) -> list[str]:
    """:func:`judge`'s problem for each host that used more than its quota, beyond
    :data:`QUOTA_TOLERANCE`."""
    problems = []
    for name, row in hosts.items():
        if row["share_of_quota"] is not None and row["share_of_quota"] > 1 + QUOTA_TOLERANCE:
            problems.append(f"host {name} used {row['share_of_quota']:.2f} of its quota")
    return problems


def _link_problems(links: Mapping[str, Mapping]) -> list[str]:
    """:func:`judge`'s problem for each shaped queue that ran above its rate, beyond
    :data:`LINK_TOLERANCE`, in some interval."""
    return [
        f"link {name} ran at {row['busiest']:.2f} of its rate"
        for name, row in links.items()
        if row["busiest"] > 1 + LINK_TOLERANCE
    ]


def _tolerance() -> dict:
    """The limits :func:`judge` held the run to, as its verdict records them."""
    return {
        "idle_min": IDLE_MIN,
        "idle_share": IDLE_SHARE,
        "link": LINK_TOLERANCE,
        "quota": QUOTA_TOLERANCE,
        "speed_min": SPEED_MIN,
        "compute_bend": BEND_TOLERANCE,
    }


def _idle_summary(idle: Sequence[float], softirq: Sequence[float], low: int) -> dict:
    """The machine's idle share over the intervals (``low`` of them under :data:`IDLE_MIN`),
    and the kernel's packet work as a share of the machine, as :func:`judge` records them."""
    return {
        "samples": len(idle),
        "min": min(idle) if idle else None,
        "median": sorted(idle)[len(idle) // 2] if idle else None,
        "samples_below": low,
        # the kernel's packet work, as a fraction of the machine (what the quotas leave for)
        "softirq_median": sorted(softirq)[len(softirq) // 2] if softirq else None,
        "softirq_max": max(softirq) if softirq else None,
    }


def _in_window(samples: Sequence[Mapping], window) -> tuple[Sequence[Mapping], bool]:
    """The samples of the training loop (``window``: its first and last step, unix seconds),
    and whether the quotas can be judged on them: for a loop shorter than two samples, the
    pair around it, which holds unthrottled start-up or teardown (not judged)."""
    if not (window and len(samples) > 2):
        return samples, True
    inside = [s for s in samples if window[0] <= s.get("unix", window[0]) <= window[1]]
    judge_quota = True
    if len(inside) < 2:
        before = [s for s in samples if s.get("unix", 0) < window[0]][-1:]
        after = [s for s in samples if s.get("unix", 0) > window[1]][:1]
        inside = before + inside + after
        judge_quota = False
    return (inside if len(inside) >= 2 else samples), judge_quota


def _idle(samples: Sequence[Mapping]) -> tuple[list[float], list[float]]:
    """Per interval, the machine's idle share and its softirq share (the kernel's packets)."""
    idle, softirq = [], []
    for a, b in itertools.pairwise(samples):
        if b["total"] > a["total"]:
            idle.append((b["idle"] - a["idle"]) / (b["total"] - a["total"]))
            softirq.append((b.get("softirq", 0) - a.get("softirq", 0)) / (b["total"] - a["total"]))
    return idle, softirq


def _hosts_used(samples: Sequence[Mapping], quota_cores: float) -> dict[str, dict]:
    """Per host, the CPU it used over the samples, as a share of its quota, and how often
    and how long the kernel throttled it."""
    hosts = {}
    first, last = samples[0].get("hosts") or {}, samples[-1].get("hosts") or {}
    wall = samples[-1]["t"] - samples[0]["t"] if len(samples) > 1 else 0.0
    for name, end in last.items():
        start = first.get(name, {})
        used = (end.get("usage_ns", 0) - start.get("usage_ns", 0)) / 1e9
        hosts[name] = {
            "cpu_s": used,
            "share_of_quota": used / (quota_cores * wall) if wall > 0 else None,
            "nr_periods": end.get("nr_periods", 0) - start.get("nr_periods", 0),
            "nr_throttled": end.get("nr_throttled", 0) - start.get("nr_throttled", 0),
            "throttled_s": (end.get("throttled_time", 0) - start.get("throttled_time", 0)) / 1e9,
        }
    return hosts


def _links_used(
    samples: Sequence[Mapping], rates_mbit: Mapping[str, float], tdf: float = 1.0
) -> dict[str, dict]:
    """Per shaped queue, the most it carried in an interval as a share of its rate, how many
    intervals it stayed backlogged, and the least it carried while backlogged. A token bucket
    may pass its burst (``topology.bucket_bytes`` of the undilated rate, kept in bytes under
    ``tdf``) on top of its rate in any interval: ``busiest`` counts what it carried beyond that
    burst, so a queue that kept its rate reads at most 1 however slow its dilated rate (at
    1 Mbit/s the 16 kB burst alone is 0.13 s of traffic).

    >>> s = [{"t": 0.0, "queues": {"q": {"bytes": 0, "backlog": 0}}},
    ...      {"t": 1.0, "queues": {"q": {"bytes": 141_000, "backlog": 0}}}]
    >>> round(_links_used(s, {"q": 1.0}, tdf=5.0)["q"]["busiest"], 3)  # 125 kB + 16 kB burst
    1.0
    """
    links = {}
    for name, rate in rates_mbit.items():
        burst = bucket_bytes(rate * tdf)
        busy, worst, most = 0, None, 0.0
        for a, b in itertools.pairwise(samples):
            qa, qb = (a.get("queues") or {}).get(name), (b.get("queues") or {}).get(name)
            if not qa or not qb or b["t"] <= a["t"]:
                continue
            sent, dt = qb["bytes"] - qa["bytes"], b["t"] - a["t"]
            most = max(most, max(0, sent - burst) * 8 / 1e6 / dt / rate)
            if qa["backlog"] and qb["backlog"]:
                busy += 1
                got = sent * 8 / 1e6 / dt / rate
                worst = got if worst is None else min(worst, got)
        links[name] = {
            "rate_mbit": rate,
            "burst_bytes": burst,
            "busiest": most,
            "backlogged_s": busy,
            "least": worst,
        }
    return links


def undilated(times: Mapping, tdf: float) -> dict:
    """``time_s`` as the emulated cluster would see it: every time divided by ``TDF``.

    >>> undilated({"total": 10.0, "map": 0.5, "process": None}, 5.0)
    {'total': 2.0, 'map': 0.1, 'process': None}
    """
    return {k: (v / tdf if isinstance(v, int | float) else v) for k, v in times.items()}


def probe_samples(spec) -> tuple[int, int]:
    """The samples of one worker's gradient call and its calls a step: a sub-batch for cdc
    (``B`` over the clusters' ``C(g, r)`` sub-batches each), ``C(g - 1, r - 1)`` of them;
    one call of ``B / K`` otherwise."""
    p = spec.placement
    if spec.algorithm == "cdc":
        calls = p.n_clusters * p.n_sub_batches
        return max(1, spec.batch_size // calls), math.comb(p.g - 1, p.redundancy - 1)
    return max(1, spec.batch_size // spec.n_workers), 1


def speed_probe(ctx, given: Mapping | None) -> tuple[object, int | None]:
    """Under the scale model (``given``), measure how fast the driver's replica computes one
    worker's gradient call (a sub-batch for cdc, ``B / K`` samples otherwise) under its host's
    quota (:func:`~dcoded.scale.measure_speed`): the context, its log holding the measure and
    ``straggle=slow``'s quota scaled to match, and the corrected quota for every host."""
    if not given or not given.get("probe_file"):
        return ctx, None
    spec = ctx.spec
    samples, per_step = probe_samples(spec)
    indices = ctx.reference.step_samples(ctx.start_step)[1][:samples]
    speed = measure_speed(
        lambda: ctx.reference.grad_sum(indices), given["probe_file"], int(given["quota_us"])
    )
    quota_us = corrected_quota(
        given["quota_us"], given["period_us"], speed["speed"], given.get("host_cores", 1)
    )
    ctx.log.compute_speed = {
        **speed,
        "samples": samples,
        "calls_per_step": per_step,
        "quota_us_in_force": quota_us,
    }
    ctx.spec = replace(spec, host_quota_scale=quota_us / int(given["quota_us"]))
    return ctx, quota_us
