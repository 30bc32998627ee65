"""The step time of every algorithm and scheme, predicted from its configuration alone.

    python -m dcoded.predict --summary RUN/summary.json          # one run: predicted, then measured
    python -m dcoded.predict -K 256 --d 25e6 --topology racks --rate-gbit 10 --samples-per-s 400
    python -m dcoded.predict --measure-rate model=dnn dataset=synthetic
    python -m dcoded.predict --fit SWEEP_DIR ... [--hold-out-K 12,16] [--hold-out-rate 50]
        [--hold-out-rack 4] [--hold-out-model cnn]

A step is modelled as four terms, each from the layout and the network, none from a run's
recorded times:

* **compute**: every worker's map, ``samples / samples_per_s + calls * per_call_s`` (a cdc
  worker computes ``B r / K`` samples in ``C(g-1, r-1)`` sub-batch calls; the others ``B / K``
  in one), times ``K / cores`` where the workers share one machine's cores (this one: 2); not
  on K machines, as under the scale model (:mod:`dcoded.scale`), whose times are undilated;
* **links**: the exchange's time bound on its topology (:mod:`dcoded.coding.bounds`: the
  busiest shared link's bytes at its rate, every phase), times ``link_overhead``;
* **messages**: ``per_message_s`` for every message the busiest worker sends or receives in a
  step (DDP's ring: ``2(K-1)`` rounds of one send and one receive), times ``K / cores`` on a
  shared machine;
* **per step**: ``per_step_s``, what a step costs whatever moves (Dask's launch and barrier).

``samples_per_s`` and ``per_call_s`` are measured by a short local run (``--measure-rate``) or
given; ``link_overhead``, ``per_message_s`` and ``per_step_s`` are fitted once per family (an
algorithm and, for cdc, its transport) by least relative squares on measured runs
(``--fit``; a scale-model run outside its fidelity is left out), and kept in
``dcoded/calibration.json``, with the error on the fitted runs and on the runs held out of the
fit by K, link rate, rack size or model. A layout the engine refuses (``r > g``,
``g`` not dividing ``K``, fewer samples than sub-batches, too many sub-batches to enumerate) is
predicted as impossible with the engine's reason.

>>> s = Scenario("ddp", n_workers=4, n_params=100_000, batch_size=240, rate_mbit=100)
>>> p = predict(s, Calibration.zero(samples_per_s=1e9))
>>> round(p.links_s * 1e3, 1)  # 2 (K-1)/K d float32 values at 12.5 MB/s
48.0
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dcoded import files
from dcoded.coding import bounds
from dcoded.coding.messages import algorithm_messages
from dcoded.coding.placement import check_layout
from dcoded.errors import ConfigError, DcodedError

#: Where the fitted costs and the measured compute rates live (shipped with the package).
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
#: Beyond this many messages a step's link loads come from the closed forms (symmetric
#: traffic) instead of enumerating every message.
MAX_ENUMERATED = 60_000
#: The most sub-batches or groups a layout may have (the engine's own limit).
MAX_SETS = 1_000_000
TOPOLOGIES = bounds.TOPOLOGIES
FAMILIES = ("cdc-direct", "cdc-multicast", "cdc-dask", "ddp", "ssgd", "asgd")
#: The model's stated error (percent of the measured median step, the worst run), on the runs
#: it was fitted on and on the runs of the K held out of the fit: for every family but
#: multicast; for multicast on a bus (its link time held at or above its bound, the fit leaves
#: 26% on one run); and on racks whose uplinks the paced senders overrun (its datagrams are
#: lost and repaired, by the thousand, which no term here models). What each family showed
#: is in the calibration (``fitted_on["error_pct"]``) and beside every prediction.
STATED_ERROR_PCT = {"fitted": 25.0, "held_out": 30.0}
STATED_ERROR_PCT_MULTICAST = {"fitted": 30.0, "held_out": 30.0}
STATED_ERROR_PCT_MULTICAST_RACKS = {"fitted": 35.0, "held_out": 50.0}
#: What a fit can hold out of its runs (``--hold-out-K``, ``-rate``, ``-rack``, ``-model``): by
#: the name ``fitted_on`` keeps it under (``held_out_<name>``), the scenario's field it reads.
HOLD_OUTS = {"K": "n_workers", "rate_mbit": "rate_mbit", "rack_size": "rack_size", "model": "model"}
#: Where a scenario's workers run (:attr:`Scenario.hosts`), as a fit's domain records it.
HOSTS = {"shared": "workers sharing one machine", "machines": "a machine per worker"}


def stated_error(family: str, topology: str, held_out: bool) -> float:
    """The error (percent) the model is held to for runs of this family on this topology."""
    table = STATED_ERROR_PCT
    if family == "cdc-multicast":
        table = STATED_ERROR_PCT_MULTICAST
        if topology in ("racks", "fattree"):
            table = STATED_ERROR_PCT_MULTICAST_RACKS
    return table["held_out" if held_out else "fitted"]


class ImpossibleLayout(ConfigError):
    """A layout the engine would refuse; the message says why."""


@dataclass(frozen=True)
class Scenario:
    """One step's inputs: the layout, the model's size, the network and the compute.

    ``topology``: ``switch`` | ``bus`` | ``racks`` (``rack_size`` workers behind uplinks of
    ``uplink_mbit``) | ``fattree`` (racks of ``rack_size``, ``pod_racks`` racks per pod behind
    uplinks of ``pod_uplink_mbit``). ``oversubscription`` sets an uplink that is not given:
    ``rack_size * rate_mbit / oversubscription``, and for a pod ``pod_racks * uplink /
    oversubscription``. ``cores``: the cores of the one machine every worker shares (``None``:
    a machine per worker, as the scale model emulates). ``samples_per_s`` / ``per_call_s``: one
    worker's compute, alone on its machine; ``None`` takes the calibration's for ``model``.
    """

    algorithm: str
    n_workers: int
    n_params: int
    batch_size: int
    rate_mbit: float
    redundancy: int = 1
    group_size: int | None = None
    shuffle: str = "coded"
    hybrid_m: int | None = None
    transport: str = "direct"
    topology: str = "switch"
    driver_rate_mbit: float | None = None
    rack_size: int | None = None
    uplink_mbit: float | None = None
    pod_racks: int | None = None
    pod_uplink_mbit: float | None = None
    oversubscription: float = 1.0
    model: str = "dnn"
    samples_per_s: float | None = None
    per_call_s: float | None = None
    cores: int | None = None
    bucket_mb: float = 25.0  # ddp: DistributedDataParallel's bucket_cap_mb

    @property
    def family(self) -> str:
        """Whose fitted costs apply: the algorithm, and for cdc its transport."""
        if self.algorithm in ("cdc", "serial"):
            return f"cdc-{self.transport}"
        return self.algorithm

    @property
    def hosts(self) -> str:
        """Where its workers run (a key of :data:`HOSTS`): ``shared``, one machine's ``cores``;
        ``machines``, one each (hosts of their own, or the scale model's emulated ones)."""
        return "shared" if self.cores is not None else "machines"

    def describe(self) -> str:
        if self.algorithm == "cdc":
            what = f"cdc r={self.redundancy} g={self.group_size or self.n_workers} {self.shuffle}"
            what += f" {self.transport}"
        else:
            what = self.algorithm
        net = f"{self.topology} {self.rate_mbit:g} Mbit/s"
        if self.topology in ("racks", "fattree"):
            net += f", racks of {self.rack_size} at {self.uplink():g} Mbit/s"
        if self.topology == "fattree":
            net += f", pods of {self.pod_racks} racks at {self.pod_uplink():g} Mbit/s"
        return f"{what}, K={self.n_workers}, d={self.n_params:,}, B={self.batch_size}, {net}"

    def uplink(self) -> float:
        if self.uplink_mbit is not None:
            return float(self.uplink_mbit)
        return (self.rack_size or 1) * self.rate_mbit / self.oversubscription

    def pod_uplink(self) -> float:
        if self.pod_uplink_mbit is not None:
            return float(self.pod_uplink_mbit)
        return (self.pod_racks or 1) * self.uplink() / self.oversubscription


@dataclass(frozen=True)
class Costs:
    """What one family pays beyond the links' rate: each fitted once, by name."""

    link_overhead: float = 1.0  # the link time over its bound (headers, TCP, pacing)
    per_message_s: float = 0.0  # per message the busiest worker sends or receives
    per_step_s: float = 0.0  # per step, whatever moves
    per_sub_batch_s: float = 0.0  # per sub-batch a worker maps, beyond its gradient's compute
    per_step_cpu_s: float = 0.0  # CPU a worker spends per step whatever it does (x K/cores shared)


@dataclass(frozen=True)
class Calibration:
    """Per family, its :class:`Costs`; per model, one worker's compute rate on the machine the
    runs were measured on (``samples_per_s``, ``per_call_s``), and where they were fitted."""

    costs: Mapping[str, Costs]
    compute: Mapping[str, Mapping[str, float]]
    fitted_on: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def zero(cls, samples_per_s: float = math.inf, per_call_s: float = 0.0) -> Calibration:
        """No cost but the links' bound, and compute at the given rate (for the bound)."""
        compute = {"*": {"samples_per_s": samples_per_s, "per_call_s": per_call_s}}
        return cls({f: Costs() for f in FAMILIES}, compute)

    @classmethod
    def load(cls, path: Path = CALIBRATION_FILE) -> Calibration:
        try:
            data = json.loads(Path(path).read_text())
            return cls(
                {f: Costs(**c) for f, c in data.get("costs", {}).items()},
                dict(data["compute"]),
                data.get("fitted_on", {}),
            )
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            raise ConfigError(f"cannot read the calibration {path}: {e!r}") from None

    def save(self, path: Path = CALIBRATION_FILE) -> None:
        data = {
            "costs": {f: asdict(c) for f, c in self.costs.items()},
            "compute": self.compute,
            "fitted_on": self.fitted_on,
        }
        files.write_text(Path(path), json.dumps(data, indent=1, sort_keys=True) + "\n")

    def costs_of(self, family: str) -> Costs:
        if family in self.costs:
            return self.costs[family]
        if family.startswith("cdc-") and "cdc-direct" in self.costs:
            return self.costs["cdc-direct"]
        raise ConfigError(
            f"no fitted costs for {family!r} (fitted: {', '.join(self.costs) or 'none'})"
        )

    def rate_of(self, model: str) -> tuple[float, float]:
        c = self.compute.get(model) or self.compute.get("*")
        if c is None:
            raise ConfigError(
                f"no compute rate for model {model!r} in the calibration (it has "
                f"{', '.join(self.compute) or 'none'}): give --samples-per-s, or measure one "
                f"worker here and store it (python -m dcoded.predict --measure-rate "
                f"model={model} [dataset=...] --calibration FILE)"
            )
        return float(c["samples_per_s"]), float(c.get("per_call_s", 0.0))


@dataclass(frozen=True)
class Prediction:
    """A predicted step, its four terms (seconds), and what they rest on."""

    scenario: Scenario
    compute_s: float
    links_s: float  # link_overhead x the bound
    bound_s: float  # the exchange's bound on the topology alone
    messages_s: float
    per_step_s: float
    messages: int  # sent + received by the busiest worker
    closed_form: bool  # link loads from the closed forms (too many messages to enumerate)
    hidden_s: float = 0.0  # ddp: all-reduce time that overlaps the backward pass
    #: how the scenario lies outside what its family's costs were fitted on (empty: inside)
    outside: tuple[str, ...] = ()
    #: the worst error (percent) of its family on the runs held out of the fit (None: none)
    error_pct: float | None = None

    @property
    def step_s(self) -> float:
        """The four terms: never below the exchange's bound, as ``link_overhead >= 1`` and
        what ddp hides is at most its compute."""
        return self.compute_s + self.links_s + self.messages_s + self.per_step_s - self.hidden_s

    def terms(self) -> str:
        ms = lambda x: f"{1e3 * x:.1f}"  # noqa: E731
        how = ", closed-form loads" if self.closed_form else ""
        return (
            f"compute {ms(self.compute_s)} + links {ms(self.links_s)} (bound "
            f"{ms(self.bound_s)}{how}) + messages {ms(self.messages_s)} ({self.messages} "
            f"messages) + per step {ms(self.per_step_s)} ms"
            + (f" - overlapped {ms(self.hidden_s)} ms" if self.hidden_s else "")
        )


# --------------------------------------------------------------------------- the layout


def check(s: Scenario) -> None:
    """:class:`ImpossibleLayout` for a layout the engine would refuse, with its reason."""
    K = s.n_workers
    if s.algorithm not in ("cdc", "serial", "ddp", "ssgd", "asgd"):
        raise ImpossibleLayout(
            f"algorithm {s.algorithm!r} is not known: choose cdc, ddp, ssgd or asgd"
        )
    if s.topology not in TOPOLOGIES:
        raise ImpossibleLayout(f"topology {s.topology!r} is not known: choose one of {TOPOLOGIES}")
    if s.topology in ("racks", "fattree") and not (s.rack_size and 1 <= s.rack_size < K):
        raise ImpossibleLayout(f"racks need a rack size in 1..{K - 1}, not {s.rack_size}")
    if s.topology == "fattree" and not (s.pod_racks and s.pod_racks >= 1):
        raise ImpossibleLayout("a fat tree needs pod_racks >= 1 (racks per pod)")
    if s.algorithm not in ("cdc", "serial"):
        if s.batch_size < K:
            raise ImpossibleLayout(f"batch_size={s.batch_size} is too small for {K} workers")
        return
    try:
        g = check_layout(K, s.redundancy, s.group_size)
    except ValueError as e:
        raise ImpossibleLayout(str(e)) from None
    most = max(math.comb(g, s.redundancy), math.comb(g, min(s.redundancy + 1, g)))
    if most > MAX_SETS:
        raise ImpossibleLayout(
            f"r={s.redundancy} with a group of {g} workers makes {most:,} sub-batches or groups "
            f"a step; the engine takes at most {MAX_SETS:,}"
        )
    need = (K // g) * math.comb(g, s.redundancy)
    if s.batch_size < need:
        raise ImpossibleLayout(
            f"batch_size={s.batch_size} is too small for r={s.redundancy}, g={g}, K={K}: it must "
            f"be >= {need:,} ({K // g} cluster(s) x C({g},{s.redundancy}) sub-batches)"
        )
    if s.shuffle == "hybrid":
        from dcoded.coding.hybrid import best_m, cached

        m = s.hybrid_m or best_m(g, s.redundancy)
        if not cached(g, s.redundancy, m):
            raise ImpossibleLayout(
                f"no hybrid family is tabulated for g={g}, r={s.redundancy}, m={m} "
                "(python -m dcoded.coding.covering extends the table)"
            )


def n_messages(s: Scenario) -> int:
    """How many messages the busiest worker sends or receives in one step."""
    K = s.n_workers
    if s.algorithm == "ddp":
        return 4 * (K - 1)  # 2(K-1) rounds of the ring, each one send and one receive
    if s.algorithm in ("ssgd", "asgd"):
        return 2
    counts = _message_counts(s.algorithm, K, s.redundancy, s.group_size, s.shuffle, s.hybrid_m)
    return counts[0 if s.transport == "multicast" else 1]


@functools.lru_cache(maxsize=4096)
def _message_counts(algorithm, K, r, g, shuffle, hybrid_m) -> tuple[int, int]:
    """``(multicast, unicast)``: the busiest worker's sent plus received messages, a
    multicast sent once, a unicast once per receiver."""
    if _uses_closed_form(Scenario(algorithm, K, 1, 1, 1.0, r, g, shuffle, hybrid_m)):
        # one symmetric cluster: coded (and hybrid, which is CDC's there), one packet per
        # group of r + 1 it is in, to r others, and as many in; uncoded, C(K-1, r) values out
        # and in; summed (and r = 1), one message to each of K - r owners; then its segment
        # to the K - 1 others, and theirs back
        inner = math.comb(K - 1, r) if shuffle != "summed" and r > 1 else K - r
        fan = r if shuffle in ("coded", "hybrid") and r > 1 else 1
        return inner + inner * fan + 1 + (K - 1), inner * fan * 2 + 2 * (K - 1)
    sent_m, sent_u, got = [0] * (K + 1), [0] * (K + 1), [0] * (K + 1)
    for messages in algorithm_messages(algorithm, K, r, g, shuffle, hybrid_m).values():
        for sender, receivers, _ in messages:
            sent_m[sender] += 1
            sent_u[sender] += len(receivers)
            for k in receivers:
                got[k] += 1
    multicast = max(sent_m[k] + got[k] for k in range(K))
    unicast = max(sent_u[k] + got[k] for k in range(K))
    return multicast, unicast


def _enumerated_size(algorithm, K, r, g, shuffle) -> int:
    """Roughly how many (message, receiver) pairs enumerating one step would visit."""
    if algorithm not in ("cdc", "serial"):
        return 2 * K
    g = g or K
    if shuffle == "summed":  # planning who sends which sum costs about g^3
        per_cluster = g**3
    else:
        per_cluster = math.comb(g, min(r + 1, g)) * (r + 1) * r
    return (K // g) * (per_cluster + g * g) + K * (K // g)


def _uses_closed_form(s: Scenario) -> bool:
    """One cluster (``g = K``) too large to enumerate: its traffic is symmetric, so the closed
    forms give the same loads on a switch and a bus."""
    g = s.group_size or s.n_workers
    size = _enumerated_size(s.algorithm, s.n_workers, s.redundancy, s.group_size, s.shuffle)
    return s.algorithm in ("cdc", "serial") and g == s.n_workers and size > MAX_ENUMERATED


def _loads(s: Scenario) -> tuple[list[dict], bool]:
    """Per phase, the link loads in units of ``d`` values; and whether from closed forms."""
    shape = (
        (s.topology, s.rack_size, s.pod_racks)
        if s.topology in ("racks", "fattree")
        else (s.topology,)
    )
    return _loads_of(
        s.algorithm,
        s.n_workers,
        s.redundancy,
        s.group_size,
        s.shuffle,
        s.hybrid_m,
        s.transport == "multicast",
        shape,
    )


@functools.lru_cache(maxsize=1024)
def _loads_of(algorithm, K, r, g, shuffle, m, multicast, shape) -> tuple[list[dict], bool]:
    rack_of = pod_of = None
    if shape[0] in ("racks", "fattree"):
        rack_of = [k // shape[1] for k in range(K)] + [None]  # the driver: on the core
    if shape[0] == "fattree":
        pod_of = [k // (shape[1] * shape[2]) for k in range(K)] + [None]
    probe = Scenario(algorithm, K, 1, 1, 1.0, r, g, shuffle, m)
    if _uses_closed_form(probe):
        return _closed_form_loads(K, r, shuffle, m, multicast, shape), True
    phases = algorithm_messages(algorithm, K, r, g, shuffle, m).values()
    return [bounds.link_bytes(msgs, K + 1, multicast, rack_of, pod_of) for msgs in phases], False


def _closed_form_loads(K, r, shuffle, m, multicast, shape) -> list[dict]:
    """Link loads of one cluster of ``K`` with every other worker an equally likely receiver:
    exact on a switch and a bus; on an uplink, a message to ``n`` receivers leaves its rack
    (or pod) unless all ``n`` are inside it."""
    from dcoded.coding import loads as closed

    if r == K:
        return []
    levels = []
    if shape[0] in ("racks", "fattree"):
        levels.append((shape[1], "up", "down"))
    if shape[0] == "fattree":
        levels.append((shape[1] * shape[2], "pod_up", "pod_down"))
    fan_shuffle = r if shuffle == "coded" else (m or 1) if shuffle == "hybrid" else 1
    out = []
    for load, fan in (
        (closed.shuffle(K, r, K, shuffle, m), fan_shuffle),
        (closed.allgather(K), K - 1),
    ):
        sent = load.multicast if multicast else load.unicast
        loads = {
            "egress": [sent] * K + [0.0],
            "ingress": [load.unicast] * K + [0.0],
            "medium": K * sent,
        }
        for size, up, down in levels:
            inside = (size - 1) / (K - 1)  # of a worker's receivers, in its own rack
            leaves = 1 - inside**fan if multicast else 1 - inside
            racks = range(-(-K // size))
            loads[up] = {i: size * sent * leaves for i in racks}
            loads[down] = dict(loads[up])  # symmetric traffic: as much comes in as goes out
        out.append(loads)
    return out


def _hosts_sharing(s: Scenario) -> float:
    """How many workers take turns on each core: ``K / cores`` on one shared machine."""
    return max(1.0, s.n_workers / s.cores) if s.cores else 1.0


def map_calls(s: Scenario) -> tuple[float, int]:
    """``(samples, sub-batch calls)`` of one worker's map in one step."""
    K = s.n_workers
    if s.algorithm in ("cdc", "serial"):
        g = s.group_size or K
        return s.batch_size * s.redundancy / K, math.comb(g - 1, s.redundancy - 1)
    return s.batch_size / K, 1


def compute_seconds(s: Scenario, cal: Calibration, per_sub_batch_s: float = 0.0) -> float:
    """One step's map on the busiest worker: its samples and its sub-batch calls."""
    rate, per_call = cal.rate_of(s.model)
    rate = s.samples_per_s or rate
    per_call = per_call if s.per_call_s is None else s.per_call_s
    samples, calls = map_calls(s)
    return (samples / rate + calls * (per_call + per_sub_batch_s)) * _hosts_sharing(s)


def bound_seconds(s: Scenario) -> tuple[float, bool]:
    """The exchange's time bound on the topology (every phase), and whether from closed forms."""
    rate = s.rate_mbit * 1e6 / 8 / (4 * s.n_params)  # d float32 values per second
    topology = {
        "kind": s.topology,
        "rate": rate,
        "uplink": s.uplink() * 1e6 / 8 / (4 * s.n_params),
        "pod_uplink": s.pod_uplink() * 1e6 / 8 / (4 * s.n_params),
    }
    phases, closed_form = _loads(s)
    total = 0.0
    for loads in phases:
        if s.algorithm in ("ssgd", "asgd") and s.driver_rate_mbit:
            loads = _driver_link(loads, s)
        total += bounds.seconds(topology, loads)
    return total, closed_form


def _driver_link(loads: dict, s: Scenario) -> dict:
    """The parameter server's link at its own rate: its bytes as the host links' equivalent."""
    scale = s.rate_mbit / s.driver_rate_mbit
    out = dict(loads)
    out["egress"] = [*loads["egress"][:-1], loads["egress"][-1] * scale]
    out["ingress"] = [*loads["ingress"][:-1], loads["ingress"][-1] * scale]
    return out


def predict(s: Scenario, cal: Calibration | None = None) -> Prediction:
    """The step of ``s`` (:class:`ImpossibleLayout` where the engine would refuse it)."""
    cal = cal or Calibration.load()
    check(s)
    costs = cal.costs_of(s.family)
    bound, closed_form = bound_seconds(s)
    count = n_messages(s)
    compute = compute_seconds(s, cal, costs.per_sub_batch_s)
    links = costs.link_overhead * bound
    messages = costs.per_message_s * count * _hosts_sharing(s)
    return Prediction(
        scenario=s,
        compute_s=compute,
        links_s=links,
        bound_s=bound,
        messages_s=messages,
        per_step_s=costs.per_step_s + costs.per_step_cpu_s * _hosts_sharing(s),
        messages=count,
        closed_form=closed_form,
        hidden_s=_overlapped(s, compute, links + messages),
        outside=tuple(outside_calibration(s, cal)),
        error_pct=(cal.fitted_on.get("error_pct", {}).get(s.family) or {}).get("held_out"),
    )


def outside_calibration(s: Scenario, cal: Calibration) -> list[str]:
    """How ``s`` lies outside the runs its family's costs were fitted on (``fitted_on``'s
    ``domain``: the K, link rates, topologies, models and hosts of the fit's runs, held-out runs
    included): each a phrase; none where it lies inside. A calibration without a domain
    (:meth:`Calibration.zero`, an older file) says nothing.

    >>> cal = Calibration.zero(1e9)
    >>> cal.fitted_on["domain"] = {"ddp": {"K": [4, 16], "rate_mbit": [25, 25],
    ...     "topologies": ["switch"], "models": ["dnn"], "hosts": ["machines"]}}
    >>> outside_calibration(Scenario("ddp", 8, 1000, 960, 25, cores=2), cal)
    ['workers sharing one machine (fitted on a machine per worker)']
    """
    domains = cal.fitted_on.get("domain")
    if domains is None:
        return []
    d = domains.get(s.family)
    if d is None:
        fitted = ", ".join(sorted(domains)) or "none"
        return [f"no runs of {s.family} were fitted (fitted: {fitted})"]
    out = []
    lo, hi = d["K"]
    if not lo <= s.n_workers <= hi:
        out.append(f"K={s.n_workers} (fitted {lo}..{hi})")
    lo, hi = d["rate_mbit"]
    if not lo <= s.rate_mbit <= hi:
        rate = (
            "no emulated link (loopback)"
            if math.isinf(s.rate_mbit)
            else (f"{s.rate_mbit:g} Mbit/s")
        )
        fitted = f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g}"
        out.append(f"{rate} (fitted at {fitted} Mbit/s)")
    if s.topology not in d["topologies"]:
        out.append(f"topology {s.topology} (fitted: {', '.join(d['topologies'])})")
    if s.model not in d["models"]:
        out.append(f"model {s.model} (fitted: {', '.join(d['models'])})")
    # an older domain says whether the workers shared one machine (``shared``: true, false)
    hosts = d.get("hosts") or ["shared" if x else "machines" for x in d.get("shared", [])]
    if hosts and s.hosts not in hosts:
        out.append(f"{HOSTS[s.hosts]} (fitted on {' and '.join(HOSTS[h] for h in hosts)})")
    return out


def _overlapped(s: Scenario, compute: float, exchange: float) -> float:
    """DDP all-reduces each bucket of ``bucket_mb`` once its gradients are ready, during the
    rest of the backward pass (about two thirds of the compute); only the last bucket's
    all-reduce is never hidden. A gradient within one bucket (d = 110 k: 0.44 MB) hides
    nothing."""
    if s.algorithm != "ddp":
        return 0.0
    last = min(1.0, s.bucket_mb * 2**20 / (4 * s.n_params))
    return min(exchange * (1 - last), 2 / 3 * compute)


# --------------------------------------------------------------------------- runs


def scenario_of(summary: Mapping) -> Scenario:
    """A run's :class:`Scenario` from its configuration (its layout, its model's ``d``, its
    emulated links, where its workers ran), never from the times it recorded. Workers on one
    host share its cores, but for a scale-model run (``scale_model``): K machines of
    ``host_cores`` each, emulated."""
    env = summary.get("environment") or {}
    net = env.get("netem") or {}
    hosts: dict[str, int] = {}
    for w in (env.get("per_worker") or {}).values():
        hosts[w.get("host")] = hosts.get(w.get("host"), 0) + 1
    shared = len(hosts) == 1 and summary["n_workers"] > 1 and not summary.get("scale_model")
    return Scenario(
        algorithm=summary["algorithm"],
        n_workers=int(summary["n_workers"]),
        n_params=int(summary["n_params"]),
        batch_size=int(summary["batch_size"]),
        rate_mbit=float(net.get("bandwidth_mbit") or math.inf),
        redundancy=int(summary.get("redundancy") or 1),
        group_size=summary.get("group_size")
        if summary.get("group_size") != summary["n_workers"]
        else None,
        shuffle=summary.get("shuffle") or "coded",
        hybrid_m=summary.get("hybrid_m") if summary.get("shuffle") == "hybrid" else None,
        transport=summary.get("transport") or "direct",
        topology=net.get("topology") or "switch",
        driver_rate_mbit=net.get("driver_bandwidth_mbit"),
        rack_size=net.get("rack_size"),
        uplink_mbit=net.get("uplink_mbit"),
        model=summary["model"],
        cores=int(env["cores"]) if shared and env.get("cores") else None,
    )


def compact(summary: Mapping) -> dict:
    """What :func:`scenario_of` reads of a summary, and the measured median step (and under
    the scale model, its model, undilated step and fidelity): a run kept small enough to check
    a calibration against (``--record``)."""
    env = summary.get("environment") or {}
    keys = ("algorithm", "n_workers", "n_params", "batch_size", "redundancy", "group_size")
    keys += ("shuffle", "hybrid_m", "transport", "model")
    return {
        **{k: summary.get(k) for k in keys},
        "environment": {
            "cores": env.get("cores"),
            "netem": env.get("netem"),
            "per_worker": {
                w: {"host": v.get("host")} for w, v in env.get("per_worker", {}).items()
            },
        },
        "time_s": {"step_median": summary["time_s"]["step_median"]},
        **(
            {
                "scale_model": {
                    k: v for k, v in summary["scale_model"].items() if k != "hosts_used"
                },
                "time_s_undilated": {"step_median": measured_step(summary)},
                "fidelity": {k: (summary.get("fidelity") or {}).get(k) for k in ("ok", "problems")},
            }
            if summary.get("scale_model")
            else {}
        ),
    }


def measured_step(summary: Mapping) -> float:
    """The run's median step (seconds): what a prediction is compared with; under the scale
    model, the emulated cluster's (``time_s_undilated``: the wall times over its TDF).

    >>> measured_step({"time_s": {"step_median": 0.5}})
    0.5
    >>> measured_step({"time_s": {"step_median": 2.0}, "scale_model": {"tdf": 4.0},
    ...     "time_s_undilated": {"step_median": 0.5}})
    0.5
    """
    times = summary["time_s_undilated"] if summary.get("scale_model") else summary["time_s"]
    return float(times["step_median"])


def measured_map(summary: Mapping) -> float | None:
    """The run's median map (seconds, undilated under the scale model): the busiest worker's
    gradients of a step, or ``None`` where the summary does not say (a ``--record``ed run)."""
    times = summary.get("time_s_undilated") if summary.get("scale_model") else summary["time_s"]
    value = (times or {}).get("map")
    return float(value) if value else None


#: The algorithms whose ``map`` is one call of the gradients alone (ddp's all-reduce runs
#: inside its backward pass, and cdc's map sends what each sub-batch made ready).
PURE_MAP = ("ssgd", "asgd")


def fit_compute(
    summaries: Sequence[Mapping], measured: Mapping[str, Mapping[str, float]]
) -> dict[str, dict]:
    """Per model, the compute rate its runs' own maps show (``map = sharing x (samples / rate
    + per_call)``, least relative squares, non-negative), from the runs whose map is one call
    of the gradients alone (:data:`PURE_MAP`; cdc's map also sends what each sub-batch made
    ready, which its family's ``per_sub_batch_s`` takes): one worker's compute as the workers
    ran it, where ``--measure-rate`` times one process alone. A model with fewer than two
    such runs keeps the rate it was given (``measured``); a fitted one says on how many runs.

    >>> runs = [{"algorithm": "ssgd", "n_workers": K, "batch_size": 240, "model": "m",
    ...          "n_params": 10, "time_s": {"step_median": 1.0, "map": 0.002 + 240 / K / 1e3}}
    ...         for K in (4, 6, 8)]
    >>> got = fit_compute(runs, {"cnn": {"samples_per_s": 50.0}})
    >>> round(got["m"]["samples_per_s"]), round(1e3 * got["m"]["per_call_s"], 3), got["m"]["runs"]
    (1000, 2.0, 3)
    >>> got["cnn"]
    {'samples_per_s': 50.0}
    """
    import numpy as np
    from scipy.optimize import nnls

    rows: dict[str, list] = {}
    for summary in summaries:
        y = measured_map(summary)
        s = scenario_of(summary)
        if y is None or s.algorithm not in PURE_MAP:
            continue
        samples, calls = map_calls(s)
        share = _hosts_sharing(s)
        rows.setdefault(s.model, []).append(([share * samples / y, share * calls / y], 1.0))
    out = {m: dict(c) for m, c in measured.items()}
    for model, data in rows.items():
        A = np.array([a for a, _ in data])
        if len(data) < 2:
            continue
        (inverse_rate, per_call), _ = nnls(A, np.ones(len(data)))
        if inverse_rate <= 0:
            continue
        out[model] = {
            "samples_per_s": float(1 / inverse_rate),
            "per_call_s": float(per_call),
            "runs": len(data),
        }
    return out


def faithful(summary: Mapping) -> bool:
    """Whether a run's times stand for the cluster it ran as: every run's but a scale-model
    run's outside its fidelity (``fidelity.ok`` not true)."""
    return not summary.get("scale_model") or bool((summary.get("fidelity") or {}).get("ok"))


def run_name(summary: Mapping) -> str:
    """A run, named in a message: its ``summary.json``'s path, else what it was."""
    return summary.get("_path") or scenario_of(summary).describe()


def held_out_by(s: Scenario, held: Mapping[str, Iterable]) -> list[str]:
    """Which of a fit's hold-outs leave ``s`` out of it (``held``: by name of :data:`HOLD_OUTS`,
    the values it held out).

    >>> s = Scenario("ddp", 12, 1000, 960, 50.0)
    >>> held_out_by(s, {"K": [12, 16], "rate_mbit": [50.0], "model": ["cnn"]})
    ['K', 'rate_mbit']
    """
    return [name for name, f in HOLD_OUTS.items() if getattr(s, f) in held.get(name, ())]


def held_outs(fitted_on: Mapping) -> dict[str, list]:
    """What a calibration's fit held out (``held_out_<name>``), by name of :data:`HOLD_OUTS`."""
    return {name: list(fitted_on.get(f"held_out_{name}") or []) for name in HOLD_OUTS}


def load_summaries(paths: Iterable[Path]) -> list[dict]:
    """Every finished run's ``summary.json`` under the given run or sweep folders, and the runs
    of files written by ``--record``."""
    out = []
    for root in paths:
        root = Path(root)
        if root.is_file() and root.name != "summary.json":  # runs kept by --record
            out += json.loads(root.read_text())
            continue
        found = [root] if root.name == "summary.json" else sorted(root.rglob("summary.json"))
        for f in found:
            s = json.loads(f.read_text())
            if s.get("status", "finished") == "finished" and s.get("time_s", {}).get("step_median"):
                s["_path"] = str(f)
                out.append(s)
    return out


def fit(
    summaries: Sequence[Mapping],
    compute: Mapping[str, Mapping[str, float]],
    hold_out: Iterable[int] = (),
    hold_out_rate: Iterable[float] = (),
    hold_out_rack: Iterable[int] = (),
    hold_out_model: Iterable[str] = (),
) -> Calibration:
    """Each family's :class:`Costs` by least relative squares (non-negative) on the runs that no
    hold-out leaves out (by their ``K``, link rate in Mbit/s, rack size or model): ``measured -
    compute = link_overhead * bound + per_message_s * messages * sharing + per_step_s``. A
    scale-model run outside its fidelity is left out of everything, with a note. ``fitted_on``
    keeps the hold-outs (``held_out_<name>``), the domain of the runs, held-out ones included,
    and each family's error on the fitted runs and on the held-out ones (:func:`errors`)."""
    import numpy as np
    from scipy.optimize import nnls

    held = {
        "K": sorted(set(hold_out)),
        "rate_mbit": sorted({float(x) for x in hold_out_rate}),
        "rack_size": sorted(set(hold_out_rack)),
        "model": sorted(set(hold_out_model)),
    }
    kept = []
    for summary in summaries:
        if faithful(summary):
            kept.append(summary)
            continue
        problems = (summary.get("fidelity") or {}).get("problems") or ["not checked"]
        print(
            f"note: left out of the fit, outside the scale model's fidelity "
            f"({'; '.join(problems)}): {run_name(summary)}",
            file=sys.stderr,
        )
    fitted_runs = [m for m in kept if not held_out_by(scenario_of(m), held)]
    compute = fit_compute(fitted_runs, compute)
    base = Calibration({f: Costs() for f in FAMILIES}, compute)
    rows: dict[str, list] = {}
    used: dict[str, list] = {}
    domain: dict[str, dict] = {}
    for summary in kept:
        s = scenario_of(summary)
        try:
            p = predict(s, base)
        except ImpossibleLayout:
            continue
        d = domain.setdefault(
            s.family, {"K": [], "rate_mbit": [], "topologies": set(), "models": set(),
                       "hosts": set()}
        )  # fmt: skip
        d["K"].append(s.n_workers)
        d["rate_mbit"].append(s.rate_mbit)
        d["topologies"].add(s.topology)
        d["models"].add(s.model)
        d["hosts"].add(s.hosts)
        if held_out_by(s, held):
            continue
        y = measured_step(summary)
        share = _hosts_sharing(s)
        calls = map_calls(s)[1] * share
        rows.setdefault(s.family, []).append(
            (
                [p.bound_s / y, p.messages * share / y, 1.0 / y, calls / y, share / y],
                1.0 - p.compute_s / y,
            )
        )
        used.setdefault(s.family, []).append(summary.get("_path", ""))
    costs = dict(base.costs)
    for family, data in rows.items():
        A = np.array([a for a, _ in data])
        b = np.array([v for _, v in data])
        if not family.startswith("cdc"):  # one call a step: per sub-batch is per step CPU
            A[:, 3] = 0.0
        # the links never beat their bound: link_overhead = 1 + a non-negative excess
        x, _ = nnls(A, b - A[:, 0])
        costs[family] = Costs(
            link_overhead=1.0 + float(x[0]),
            per_message_s=float(x[1]),
            per_step_s=float(x[2]),
            per_sub_batch_s=float(x[3]),
            per_step_cpu_s=float(x[4]),
        )
    fitted_on = {
        "runs": {f: len(v) for f, v in used.items()},
        **{f"held_out_{name}": values for name, values in held.items()},
        "domain": {
            f: {
                "K": [min(d["K"]), max(d["K"])],
                "rate_mbit": [min(d["rate_mbit"]), max(d["rate_mbit"])],
                "topologies": sorted(d["topologies"]),
                "models": sorted(d["models"]),
                "hosts": sorted(d["hosts"]),  # where the workers ran (HOSTS)
            }
            for f, d in domain.items()
            if f in used
        },
    }
    fitted = Calibration(costs, compute, fitted_on)
    found = errors(compare(kept, fitted))
    fitted_on["error_pct"] = {f: e for f, e in found.items() if f in used}
    return fitted


def errors(rows: Iterable[Mapping]) -> dict[str, dict]:
    """Per family, the error (percent of the measured median step, its size) of :func:`compare`'s
    rows: the worst on the fitted runs (``fitted``) and on the held-out ones (``held_out``;
    ``None``: none), the mean of each (``mean``), and per hold-out that left runs out
    (``held_out_by``: a run held out by two is in both) their number, mean and worst.

    >>> rows = [{"family": "ddp", "error_pct": e, "held_out_by": by}
    ...     for e, by in [(2.0, []), (-4.0, []), (10.0, ["K"]), (-6.0, ["K", "model"])]]
    >>> errors(rows)["ddp"]  # doctest: +NORMALIZE_WHITESPACE
    {'fitted': 4.0, 'held_out': 10.0, 'mean': {'fitted': 3.0, 'held_out': 8.0},
     'held_out_by': {'K': {'runs': 2, 'mean': 8.0, 'worst': 10.0},
                     'model': {'runs': 1, 'mean': 6.0, 'worst': 6.0}}}
    """
    found: dict[str, dict[str, list]] = {}
    for row in rows:
        groups = found.setdefault(row["family"], {"fitted": [], "held_out": []})
        size = abs(row["error_pct"])
        for name in ["held_out", *row["held_out_by"]] if row["held_out_by"] else ["fitted"]:
            groups.setdefault(name, []).append(size)
    worst = lambda x: max(x) if x else None  # noqa: E731
    mean = lambda x: round(sum(x) / len(x), 1) if x else None  # noqa: E731
    return {
        family: {
            "fitted": worst(g["fitted"]) or 0.0,
            "held_out": worst(g["held_out"]),
            "mean": {"fitted": mean(g["fitted"]) or 0.0, "held_out": mean(g["held_out"])},
            "held_out_by": {
                name: {"runs": len(x), "mean": mean(x), "worst": worst(x)}
                for name, x in g.items()
                if name in HOLD_OUTS
            },
        }
        for family, g in found.items()
    }


def compare(summaries: Sequence[Mapping], cal: Calibration | None = None) -> list[dict]:
    """Per run: predicted and measured median step (ms) and the error, in percent; whether
    the calibration's fit held it out, and by which hold-outs (``held_out_by``); and whether
    its times are faithful (:func:`faithful`)."""
    cal = cal or Calibration.load()
    held = held_outs(cal.fitted_on)
    out = []
    for summary in summaries:
        s = scenario_of(summary)
        try:
            p = predict(s, cal)
        except ImpossibleLayout:
            continue
        y = measured_step(summary)
        by = held_out_by(s, held)
        out.append(
            {
                "run": s.describe(),
                "K": s.n_workers,
                "topology": s.topology,
                "family": s.family,
                "held_out": bool(by),
                "held_out_by": by,
                "predicted_ms": round(1e3 * p.step_s, 2),
                "measured_ms": round(1e3 * y, 2),
                "bound_ms": round(1e3 * p.bound_s, 2),
                "error_pct": round(100 * (p.step_s - y) / y, 1),
                "outside": list(p.outside),
                "faithful": faithful(summary),
            }
        )
    return out


def measure_rate(overrides: Sequence[str] = (), sizes=(1, 4, 16, 64), repeats: int = 20) -> dict:
    """One worker's compute, measured here: the gradient of ``n`` samples for each ``n`` in
    ``sizes`` (one torch thread, as in every worker), the least time of ``repeats``, fitted as
    ``per_call_s + n / samples_per_s``."""
    import time

    import numpy as np
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from dcoded.config import build_spec, compose_config
    from dcoded.engine.replica import Replica

    try:
        cfg = compose_config(["cluster=local", *overrides])
    except (HydraException, OmegaConfBaseException) as e:  # one line, not Hydra's traceback
        raise ConfigError(f"--measure-rate {' '.join(overrides)}: {e}".split("\n")[0]) from None
    spec, _, _ = build_spec(cfg)
    replica = Replica(spec)
    order = np.arange(max(sizes))
    times = []
    for n in sizes:
        replica.grad_sum(order[:n])  # warm up this size
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            replica.grad_sum(order[:n])
            best = min(best, time.perf_counter() - t0)
        times.append(best)
    slope, intercept = np.polyfit(np.array(sizes, float), np.array(times), 1)
    return {
        "model": cfg.model.name,
        "samples_per_s": float(1 / slope),
        "per_call_s": float(max(intercept, 0.0)),
        "n_params": replica.n_params,
    }


# --------------------------------------------------------------------------- the command


def _scenario_from_args(a: argparse.Namespace) -> Scenario:
    rate = a.rate_mbit if a.rate_mbit is not None else 1e3 * a.rate_gbit
    return Scenario(
        algorithm=a.algorithm,
        n_workers=a.K,
        n_params=int(a.d),
        batch_size=a.batch_size or 64 * a.K,
        rate_mbit=rate,
        redundancy=a.r,
        group_size=a.g,
        shuffle=a.shuffle,
        hybrid_m=a.m,
        transport=a.transport,
        topology=a.topology,
        rack_size=a.rack_size,
        pod_racks=a.pod_racks,
        oversubscription=a.oversubscription,
        model=a.model,
        samples_per_s=a.samples_per_s,
        per_call_s=a.per_call_s,
        cores=a.cores,
    )


def _positive(kind):
    """An argparse type: a number of ``kind`` above zero (a rate, a size, a count)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text} is not allowed: it must be above 0")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _listed(kind):
    """An argparse type: values of ``kind`` between commas (``12,16``); ``""``: none."""

    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a list such as 12,16") from None

    parse.__name__ = f"{kind.__name__} list"
    return parse


def _error_lines(error: Mapping, fitted_runs: int, held: Mapping[str, list]) -> list[str]:
    """A family's error (:func:`errors`) on the fitted runs and on each hold-out's, a line each.

    >>> error = {"mean": {"fitted": 3.0}, "fitted": 4.0,
    ...     "held_out_by": {"K": {"runs": 2, "mean": 8.0, "worst": 10.0}}}
    >>> print("\\n".join(_error_lines(error, 5, {"K": [12, 16]})))
      error on the 5 fitted runs: mean 3.0%, worst 4.0% (of the measured median step)
      error on the 2 runs held out by K=12,16: mean 8.0%, worst 10.0%
    """
    out = [
        f"  error on the {fitted_runs} fitted runs: mean {error['mean']['fitted']:.1f}%, "
        f"worst {error['fitted']:.1f}% (of the measured median step)"
    ]
    for name, e in (error.get("held_out_by") or {}).items():
        values = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in held[name])
        out.append(
            f"  error on the {e['runs']} runs held out by {name}={values}: mean "
            f"{e['mean']:.1f}%, worst {e['worst']:.1f}%"
        )
    return out


def _engine_default(name: str):
    """``coding.<name>`` as ``python -m dcoded`` has it by default."""
    from dcoded.config import config_defaults

    return config_defaults()["coding"][name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dcoded.predict",
        description="The predicted step time of a layout on a network (see the module's doc).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--summary", type=Path, help="predict this run's step from its config")
    what.add_argument("--fit", nargs="+", type=Path, metavar="DIR", help="fit the costs on runs")
    what.add_argument(
        "--compare", nargs="+", type=Path, metavar="DIR", help="predicted vs measured"
    )
    what.add_argument("--measure-rate", nargs="*", metavar="OVERRIDE", help="time one worker here")
    what.add_argument(
        "--record", nargs="+", type=Path, metavar=("OUT", "DIR"), help="keep runs, compacted"
    )
    parser.add_argument(
        "--hold-out-K", type=_listed(int), default="", help="--fit: K values left out, e.g. 12,16"
    )
    parser.add_argument(
        "--hold-out-rate",
        type=_listed(float),
        default="",
        help="--fit: link rates left out (Mbit/s)",
    )
    parser.add_argument(
        "--hold-out-rack", type=_listed(int), default="", help="--fit: rack sizes left out"
    )
    parser.add_argument(
        "--hold-out-model", type=_listed(str), default="", help="--fit: models left out, e.g. cnn"
    )
    parser.add_argument("--calibration", type=Path, default=CALIBRATION_FILE)
    parser.add_argument("--algorithm", default="cdc", choices=["cdc", "ddp", "ssgd", "asgd"])
    parser.add_argument("-K", type=_positive(int), default=16, help="workers")
    parser.add_argument(
        "-r", type=_positive(int), default=_engine_default("redundancy"), help="redundancy"
    )
    parser.add_argument("-g", type=_positive(int), default=None, help="group size (None: K)")
    parser.add_argument(
        "--shuffle",
        default=_engine_default("shuffle"),
        choices=["coded", "uncoded", "summed", "hybrid"],
    )
    parser.add_argument("-m", type=_positive(int), default=None, help="hybrid_m (None: least load)")
    parser.add_argument("--transport", default="direct", choices=["direct", "multicast", "dask"])
    parser.add_argument("--d", type=_positive(float), default=109_386, help="parameters (float32)")
    parser.add_argument(
        "--batch-size", type=_positive(int), default=None, help="global B (None: 64 K)"
    )
    parser.add_argument("--topology", default="switch", choices=list(TOPOLOGIES))
    parser.add_argument(
        "--rate-mbit", type=_positive(float), default=None, help="link rate (None: --rate-gbit)"
    )
    parser.add_argument("--rate-gbit", type=_positive(float), default=10.0, help="link rate")
    parser.add_argument("--rack-size", type=_positive(int), default=None, help="workers a rack")
    parser.add_argument("--pod-racks", type=_positive(int), default=None, help="racks a pod")
    parser.add_argument(
        "--oversubscription", type=_positive(float), default=1.0, help="uplink oversubscription"
    )
    parser.add_argument("--model", default="dnn", help="whose measured compute rate to use")
    parser.add_argument(
        "--samples-per-s", type=_positive(float), default=None, help="one worker's rate"
    )
    parser.add_argument(
        "--per-call-s", type=_positive(float), default=None, help="compute per call"
    )
    parser.add_argument(
        "--cores", type=_positive(int), default=None, help="workers share one such machine"
    )
    a = parser.parse_args(argv)
    try:
        return _command(a)
    except DcodedError as e:  # bad input, a missing rate or file: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


def _command(a: argparse.Namespace) -> int:
    if a.measure_rate is not None:
        rate = measure_rate(a.measure_rate)
        print(json.dumps(rate, indent=1))
        path = Path(a.calibration)
        cal = Calibration.load(path) if path.exists() else Calibration({}, {})
        cal.compute[rate["model"]] = {k: rate[k] for k in ("samples_per_s", "per_call_s")}
        cal.save(path)
        print(f"stored as the compute rate of {rate['model']}: {path}")
        return 0
    if a.record:
        out, *dirs = a.record
        runs = [compact(s) for s in load_summaries(dirs)]
        files.write_text(Path(out), json.dumps(runs, indent=0, sort_keys=True) + "\n")
        print(f"{len(runs)} runs written: {out}")
        return 0
    if a.fit:
        cal = Calibration.load(a.calibration)
        new = fit(
            load_summaries(a.fit),
            cal.compute,
            a.hold_out_K,
            a.hold_out_rate,
            a.hold_out_rack,
            a.hold_out_model,
        )
        new.save(a.calibration)
        held = held_outs(new.fitted_on)
        for family, c in new.costs.items():
            runs = new.fitted_on["runs"].get(family)
            if runs:
                print(
                    f"{family}: link_overhead {c.link_overhead:.3f}, per_message "
                    f"{1e3 * c.per_message_s:.3f} ms, per_step {1e3 * c.per_step_s:.1f} ms, "
                    f"per_sub_batch {1e3 * c.per_sub_batch_s:.3f} ms, per_step_cpu "
                    f"{1e3 * c.per_step_cpu_s:.2f} ms "
                    f"({runs} runs)"
                )
                print("\n".join(_error_lines(new.fitted_on["error_pct"][family], runs, held)))
        print(f"written: {a.calibration}")
        return 0
    cal = Calibration.load(a.calibration)
    if a.compare:
        rows = compare(load_summaries(a.compare), cal)
        for row in rows:
            tag = f" (held out by {', '.join(row['held_out_by'])})" if row["held_out"] else ""
            if not row["faithful"]:
                tag += " (outside the scale model's fidelity)"
            if row["outside"]:
                tag += f" (outside the calibration: {'; '.join(row['outside'])})"
            print(
                f"{row['run']}: predicted {row['predicted_ms']} ms, measured "
                f"{row['measured_ms']} ms ({row['error_pct']:+.1f}%){tag}"
            )
        return 0
    if a.summary:
        path = a.summary / "summary.json" if a.summary.is_dir() else a.summary
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"error: cannot read {path}: {e}", file=sys.stderr)
            return 2
        s = scenario_of(summary)
    else:
        s = _scenario_from_args(a)
    try:
        p = predict(s, cal)
    except ImpossibleLayout as e:
        print(f"{s.describe()}\nimpossible: {e}")
        return 1
    print(s.describe())
    print(p.terms())
    if p.outside:
        line = (
            f"not predicted: outside the calibration ({'; '.join(p.outside)}); the terms "
            "above use its costs where they were not measured"
        )
    else:
        line = f"predicted {1e3 * p.step_s:.1f} ms " + (
            f"± {p.error_pct:.0f}% (the worst error of {s.family} on runs held out of its fit)"
            if p.error_pct is not None
            else f"(no runs of {s.family} were held out of the fit: its error is not known)"
        )
    if a.summary:
        y = measured_step(summary)
        line += f", measured {1e3 * y:.1f} ms"
        if not p.outside:
            line += f" ({100 * (p.step_s - y) / y:+.1f}%)"
    print(line)
    return OUTSIDE if p.outside else 0


#: The exit status of a scenario outside the calibration (1: an impossible layout; 2: usage).
OUTSIDE = 3


if __name__ == "__main__":
    sys.exit(main())
