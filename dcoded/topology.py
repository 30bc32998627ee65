"""The network's shape: the topologies, who shares which link, and what a step's messages put
on each link and cost there.

One :class:`Shape` is read by everything that needs the network's physics: the emulated
network (:mod:`dcoded.netem`: which bridge a host hangs on, which queues a frame crosses), the
run's settings (:mod:`dcoded.config`: each multicast sender's pace), the benchmark and the
paper (each phase's time bound beside what a run measured), and the performance model
(:mod:`dcoded.predict`). Hosts ``0..K-1`` are the workers and host ``K`` the driver, which sits
on the core (in no rack and no pod). The byte algebra itself is :mod:`dcoded.coding.bounds`.

>>> shape = Shape("racks", rate_mbit=100, rack_size=2, uplink_mbit=50)
>>> shape.rack_of(4), shape.n_racks(4), shape.queues_on_path()
([0, 0, 1, 1, None], 2, 4)
>>> loads = shape.link_bytes([(0, [1, 2, 3], 50e6 / 8)], 4, multicast=True)
>>> shape.seconds(loads)  # 50 Mbit once up rack 0's uplink of 50 Mbit/s
1.0

Adding a topology: name it in :data:`TOPOLOGIES` (and in :data:`EMULATED` once
:mod:`dcoded.netem` builds it), give its links in :meth:`Shape.link_bytes` (through
:func:`dcoded.coding.bounds.link_bytes`) and their bound in :func:`dcoded.coding.bounds.seconds`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dcoded.coding import bounds
from dcoded.coding.bounds import TOPOLOGIES  # every topology the model knows, in table order
from dcoded.coding.messages import algorithm_messages

__all__ = [
    "EMULATED",
    "RACKED",
    "TOPOLOGIES",
    "Shape",
    "check",
    "link_loads",
    "link_report",
    "phase_bounds",
    "phase_messages",
    "rank_hosts",
    "sender_shares",
]
#: The ones the emulated network builds (``cluster.topology`` of ``cluster=netem``).
EMULATED = ("switch", "bus", "racks", "fattree")
#: The topologies whose workers sit in racks behind uplinks.
RACKED = ("racks", "fattree")
#: Per topology, the shaped queues on the longest path between two hosts: the sender's link,
#: the bus or the uplinks up and down, the receiver's link.
QUEUES_ON_PATH = {"switch": 2, "bus": 3, "racks": 4, "fattree": 6}
#: The share of the busiest link's rate a multicast sender's pace is set to fill.
PACE_SHARE = 0.95
#: The same for a TCP sender (``transport=direct``): the kernel paces IP packets, so 1500
#: bytes a frame where the link carries 1514; TCP backs off where a queue still fills.
TCP_PACE_SHARE = 0.99


def bucket_bytes(rate_mbit: float) -> int:
    """An emulated link's token bucket (``tc tbf``'s burst): what it passes at full speed after
    it idled, about 4 ms of its traffic (one timer tick at 250 Hz), at least 16 kB. A real link
    has none; a step's exchange phases each find it full.

    >>> bucket_bytes(100), bucket_bytes(25)
    (50000, 16000)
    """
    return max(int(rate_mbit * 1e6 / 8 / 250), 16_000)


def bucket_seconds(rate_mbit: float) -> float:
    """The time an emulated link's full :func:`bucket_bytes` saves a transfer, at its rate.

    >>> round(1e3 * bucket_seconds(100), 2), round(1e3 * bucket_seconds(25), 2)
    (4.0, 5.12)
    """
    return bucket_bytes(rate_mbit) / (rate_mbit * 1e6 / 8)


Message = tuple[int, Sequence[int], float]


@dataclass(frozen=True)
class Shape:
    """A network: ``kind`` (one of :data:`TOPOLOGIES`), each host link's ``rate_mbit``, and
    where there are racks, ``rack_size`` workers behind an uplink of ``uplink_mbit`` (each
    way; ``None``: ``rate_mbit``), and in a fat tree ``pod_racks`` racks a pod behind an
    uplink of ``pod_uplink_mbit`` (``None``: the rack uplink's)."""

    kind: str = "switch"
    rate_mbit: float = 1.0
    rack_size: int | None = None
    uplink_mbit: float | None = None
    pod_racks: int | None = None
    pod_uplink_mbit: float | None = None

    @classmethod
    def of(cls, links: Mapping) -> Shape:
        """From the emulated network's settings (``cluster.*`` of ``cluster=netem``, or the
        ``environment.netem`` a run's summary records)."""
        return cls(
            kind=links.get("topology") or "switch",
            rate_mbit=float(links["bandwidth_mbit"]),
            rack_size=links.get("rack_size"),
            uplink_mbit=links.get("uplink_mbit"),
            pod_racks=links.get("pod_racks"),
            pod_uplink_mbit=links.get("pod_uplink_mbit"),
        )

    @property
    def racked(self) -> bool:
        """Whether workers sit in racks behind uplinks."""
        return self.kind in RACKED

    def uplink(self) -> float:
        """Each rack uplink's rate, Mbit/s each way."""
        return float(self.uplink_mbit or self.rate_mbit)

    def pod_uplink(self) -> float:
        """Each pod uplink's rate, Mbit/s each way."""
        return float(self.pod_uplink_mbit or self.uplink())

    def rack_of(self, n_workers: int) -> list[int | None] | None:
        """Each host's rack (the driver, last: ``None``, on the core); ``None`` without racks."""
        if not self.racked:
            return None
        return [k // self.rack_size for k in range(n_workers)] + [None]

    def pod_of_rack(self, rack: int) -> int | None:
        """The pod rack ``rack`` is in (``None`` outside a fat tree)."""
        return rack // self.pod_racks if self.kind == "fattree" else None

    def pod_of(self, n_workers: int) -> list[int | None] | None:
        """Each host's pod (the driver, last: ``None``); ``None`` outside a fat tree."""
        if self.kind != "fattree":
            return None
        return [self.pod_of_rack(k // self.rack_size) for k in range(n_workers)] + [None]

    def n_racks(self, n_workers: int) -> int:
        """How many racks ``n_workers`` fill (0 without racks)."""
        return -(-n_workers // self.rack_size) if self.racked else 0

    def n_pods(self, n_workers: int) -> int:
        """How many pods the racks of ``n_workers`` fill (0 outside a fat tree)."""
        return -(-self.n_racks(n_workers) // self.pod_racks) if self.kind == "fattree" else 0

    def wiring(self, n_workers: int) -> tuple:
        """What a network of ``n_workers`` is built as, rates aside: two shapes with the same
        wiring are the same bridges and links, re-rated."""
        return self.kind, self.rack_of(n_workers), self.pod_of(n_workers)

    def queues_on_path(self) -> int:
        """How many shaped queues a frame crosses on the longest path between two hosts."""
        return QUEUES_ON_PATH[self.kind]

    def link_bytes(
        self, messages: Iterable[Message], n_workers: int, multicast: bool
    ) -> dict[str, object]:
        """What ``messages`` between the ``n_workers`` workers and the driver (host
        ``n_workers``) put on each link (:func:`dcoded.coding.bounds.link_bytes`)."""
        return bounds.link_bytes(
            messages, n_workers + 1, multicast, self.rack_of(n_workers), self.pod_of(n_workers)
        )

    def seconds(self, loads: Mapping, unit_bytes: float = 1.0) -> float:
        """The time bound of an exchange with these link loads (in units of ``unit_bytes``)."""
        return bounds.seconds(self._rates(lambda mbit: mbit * 1e6 / 8 / unit_bytes), loads)

    def _rates(self, unit) -> dict:
        """The topology as :func:`dcoded.coding.bounds.seconds` takes it, each rate in Mbit/s
        given to ``unit``."""
        return {
            "kind": self.kind,
            "rate": unit(self.rate_mbit),
            "uplink": unit(self.uplink()),
            "pod_uplink": unit(self.pod_uplink()),
        }

    def paces(
        self,
        phases: Mapping[str, Iterable[Message]],
        multicast: bool = True,
        share: float = PACE_SHARE,
    ) -> dict[str, float]:
        """Per phase, the pace (Mbit/s) at which every sender can send at once without
        overrunning a link. A sender that spreads its phase's ``B(s)`` bytes evenly at
        pace ``p`` puts ``p · b(s→x) / B(s)`` on a link ``x`` that carries ``b(s→x)`` of them,
        so ``p`` is the link's rate over ``max_x Σ_s b(s→x) / B(s)``: the link loads of each
        message scaled by ``1 / B(its sender)``, at the rates over the host link's. Never above
        a sender's own link; ``share`` of that, to leave room for the rest. ``multicast``:
        a message for several receivers leaves once; else once for each (TCP).

        >>> all_to_all = {"shuffle": [(s, [r], 1.0) for s in range(4) for r in range(4) if r != s]}
        >>> Shape("switch", 100).paces(all_to_all, multicast=False, share=1.0)
        {'shuffle': 100.0}
        >>> Shape("bus", 100).paces(all_to_all, multicast=False, share=1.0)
        {'shuffle': 25.0}
        """
        out = {}
        for phase, messages in phases.items():
            messages = list(messages)
            if not multicast:
                messages = [(s, [r], size) for s, receivers, size in messages for r in receivers]
            sent: dict[int, float] = {}
            for sender, _, size in messages:
                sent[sender] = sent.get(sender, 0.0) + size
            shares = [(s, r, size / sent[s]) for s, r, size in messages]
            n_hosts = 1 + max((max([s, *r]) for s, r, _ in messages), default=0)
            loads = self.link_bytes(shares, n_hosts, multicast=True)
            # in units of the host link: 1 where a link is as busy as the sender's own
            use = bounds.seconds(self._rates(lambda mbit: mbit / self.rate_mbit), loads)
            out[phase] = share * self.rate_mbit / max(1.0, use)
        return out


def sender_shares(messages: Iterable[Message], sender: int) -> dict[int, float]:
    """Each receiver's share of what ``sender`` sends in ``messages``, counted once per
    receiver (the unicast pace of each of its connections is its pace times this).

    >>> sender_shares([(0, [1, 2], 2.0), (0, [3], 4.0), (1, [0], 9.0)], 0)
    {1: 0.25, 2: 0.25, 3: 0.5}
    """
    sent: dict[int, float] = {}
    for s, receivers, size in messages:
        if s == sender:
            for r in receivers:
                sent[r] = sent.get(r, 0.0) + size
    total = sum(sent.values())
    return {r: v / total for r, v in sorted(sent.items())} if total else {}


def check(
    links: Mapping, n_workers: int, allowed: Sequence[str] = EMULATED, prefix: str = "cluster."
) -> None:
    """``ValueError`` naming the setting (``prefix`` and its key) for a shape that cannot be:
    a topology not in ``allowed``, racks without an integer size that makes two racks or
    more, a fat tree without pods."""
    kind = links.get("topology") or "switch"
    if kind not in allowed:
        raise ValueError(f"{prefix}topology={kind!r} is not known: choose one of {tuple(allowed)}")
    if kind in RACKED:
        size = links.get("rack_size")
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size < n_workers:
            raise ValueError(
                f"{prefix}rack_size={size!r} is not allowed with {prefix}topology={kind} and "
                f"{prefix}n_workers={n_workers}: it must be an integer in 1..{n_workers - 1} "
                "(the rack size: workers per rack; at least two racks)"
            )
    if kind == "fattree":
        pods = links.get("pod_racks")
        if not isinstance(pods, int) or isinstance(pods, bool) or pods < 1:
            raise ValueError(
                f"{prefix}pod_racks={pods!r} is not allowed with {prefix}topology=fattree: "
                "it must be an integer >= 1 (racks per pod)"
            )


def phase_messages(summary: Mapping) -> dict[str, list[Message]]:
    """The messages of one step of a run, ``(sender, receivers, bytes)``, by phase: the
    gradient exchange and the parameter distribution
    (:func:`dcoded.coding.messages.algorithm_messages` of its layout). Hosts ``0..K-1`` are
    the workers, ``K`` the driver (the parameter server)."""
    d4 = 4 * summary["n_params"]
    phases = algorithm_messages(
        summary["algorithm"],
        summary["n_workers"],
        summary["redundancy"],
        summary["group_size"],
        summary["shuffle"],
        summary.get("hybrid_m"),
    )
    return {k: [(s, r, v * d4) for s, r, v in m] for k, m in phases.items()}


def phase_bounds(summary: Mapping) -> dict[str, float]:
    """Seconds per step that each exchange phase of a run needs at least on its emulated
    network, and their sum (``comm``); ``{}`` for a run without ``cluster=netem``."""
    net = summary["environment"].get("netem")
    if not net:
        return {}
    shape = Shape.of(net)
    multicast = summary.get("transport") == "multicast"
    out = {"shuffle": 0.0, "params": 0.0}
    for phase, messages in phase_messages(summary).items():
        out[phase] = shape.seconds(_on_hosts(summary, shape, messages, multicast))
    out["comm"] = out["shuffle"] + out["params"]
    return out


def link_loads(summary: Mapping) -> dict[str, float]:
    """The bytes one step of a run's exchange (:func:`phase_messages`, both phases) puts on
    each link of its emulated network, by the names the network gives its queues: ``"w0 in"``
    and ``"w0 out"`` (the driver's: ``"drv ..."``), ``"rack0 up"`` / ``"rack0 down"``,
    ``"pod0 up"`` / ``"pod0 down"``, and ``"bus"``."""
    shape = Shape.of(summary["environment"]["netem"])
    host = [f"w{h}" for h in range(_n_hosts(summary))] + ["drv"]
    out: dict[str, float] = {}

    def add(name: str, value: float) -> None:
        out[name] = out.get(name, 0.0) + float(value)

    multicast = summary.get("transport") == "multicast"
    for messages in phase_messages(summary).values():
        loads = _on_hosts(summary, shape, messages, multicast)
        for way, key in (("out", "egress"), ("in", "ingress")):
            for h, value in enumerate(loads[key]):
                add(f"{host[h]} {way}", value)
        for key, name in (("up", "rack{} up"), ("down", "rack{} down")):
            for r, value in loads[key].items():
                add(name.format(r), value)
        for key, name in (("pod_up", "pod{} up"), ("pod_down", "pod{} down")):
            for q, value in loads[key].items():
                add(name.format(q), value)
        if shape.kind == "bus":
            add("bus", loads["medium"])
    return out


def rank_hosts(summary: Mapping) -> list[int]:
    """The emulated host each rank of a run ran on (``k`` for ``w{k}``), by its worker's IP
    (``environment.worker_ips``): after a recovery a rank may sit on any host. Rank ``k`` on
    host ``k`` where the summary does not say (the ranks are the workers in address order).

    >>> rank_hosts({"n_workers": 2, "environment": {"worker_ips": ["10.0.0.2", "10.0.0.3",
    ...     "10.0.0.4"], "workers": ["tcp://10.0.0.4:1", "tcp://10.0.0.2:7"]}})
    [2, 0]
    """
    K = summary["n_workers"]
    env = summary.get("environment", {})
    ips, workers = env.get("worker_ips") or [], env.get("workers") or []
    found = [a.split("://")[-1].rsplit(":", 1)[0] for a in workers[:K]]
    if len(found) < K or any(ip not in ips for ip in found):
        return list(range(K))
    return [ips.index(ip) for ip in found]


def _n_hosts(summary: Mapping) -> int:
    """How many worker hosts the run's emulated network has (its workers', at least)."""
    return max(summary["n_workers"], len(summary["environment"].get("worker_ips") or ()))


def _on_hosts(summary: Mapping, shape: Shape, messages, multicast: bool) -> dict:
    """:meth:`Shape.link_bytes` of a run's ``messages`` (ranks ``0..K-1``, the driver ``K``)
    from the hosts the ranks ran on (:func:`rank_hosts`); the driver is the last host."""
    n_hosts = _n_hosts(summary)
    on = [*rank_hosts(summary), n_hosts]
    placed = [(on[s], [on[r] for r in receivers], v) for s, receivers, v in messages]
    return shape.link_bytes(placed, n_hosts, multicast)


def link_rate(net: Mapping, name: str) -> float:
    """The rate (Mbit/s) of link ``name`` of the emulated network described by ``net``."""
    if name.startswith("rack"):
        return float(net["uplink_mbit"])
    if name.startswith("pod"):
        return float(net["pod_uplink_mbit"])
    if name.startswith("drv"):
        return float(net.get("driver_bandwidth_mbit") or net["bandwidth_mbit"])
    return float(net["bandwidth_mbit"])


def link_report(summary: Mapping, measured: Mapping[str, float] | None, steps: int):
    """``summary.json``'s ``links`` (``None`` off the emulated network): the bytes per step on
    every link, measured (all the link's queue passed in the training loop: headers, Dask's
    control traffic and evaluation included) beside the bound's (:func:`link_loads`: the
    exchange's payload alone); the busiest link of each, the one with the most bytes for its
    rate (a scheme's load as Topological CDC counts it), and the total (all that was sent,
    each copy once)."""
    net = summary["environment"].get("netem")
    if not net or not measured or steps <= 0:
        return None
    bound = link_loads(summary)
    per_step = {name: value / steps for name, value in measured.items()}
    names = sorted(set(per_step) | set(bound))

    def busiest(loads: Mapping[str, float]) -> dict:
        name = max(names, key=lambda n: (loads.get(n, 0.0) / link_rate(net, n), n))
        return {"link": name, "bytes": loads.get(name, 0.0), "rate_mbit": link_rate(net, name)}

    def total(loads: Mapping[str, float]) -> float:
        return sum(v for n, v in loads.items() if n.endswith(" out") and not n.startswith("sched"))

    return {
        "bytes_per_step": {
            n: {"measured": per_step.get(n, 0.0), "bound": bound.get(n, 0.0)} for n in names
        },
        "busiest": {"measured": busiest(per_step), "bound": busiest(bound)},
        "total": {"measured": total(per_step), "bound": total(bound)},
    }
