"""An emulated network on one machine: Linux network namespaces joined by rate-limited links.

``cluster=netem`` puts the Dask scheduler, every worker and the driver each in a network
namespace of its own, joined by a veth pair to one bridge (which lives in a namespace of its
own too, so nothing of it shows in the machine's own namespace). ``tc ... tbf`` caps every link
in both directions: egress of the host's end, and egress of the bridge's end toward the host.
Workers are real ``dask worker`` processes started inside their namespaces; the driver runs as
a child process inside its own namespace, as a client of that scheduler. The only addresses
are those of one private /24 inside these namespaces; nothing else is ever contacted.

Wire bytes come from the interfaces' own counters (``/sys/class/net/<if>/statistics``), read
inside each namespace. Everything made here is removed on exit, on error and on Ctrl-C, and
``python -m dcoded.netem cleanup`` removes what a killed run left behind.

From a shell, as root: ``python -m dcoded cluster=netem cluster.bandwidth_mbit=100``.

>>> Links.from_config({"bandwidth_mbit": 100, "topology": "bus"}).topology
'bus'
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dcoded import files, scale, topology
from dcoded.engine import straggle
from dcoded.errors import NetemRunFailed, NetemUnavailable
from dcoded.interrupt import Interrupted, signals_deferred

#: Every namespace a run makes starts with this, so a stale set is easy to find; the
#: environment variable ``DCODED_NETEM_PREFIX`` sets another, so that runs (a test suite)
#: beside others on one machine find and remove only their own.
PREFIX = "dcn"


def prefix() -> str:
    """The namespace prefix of this process's runs (``DCODED_NETEM_PREFIX``, or ``dcn``)."""
    name = os.environ.get("DCODED_NETEM_PREFIX") or PREFIX
    if not (name.isascii() and name.isalnum() and len(name) <= 12):
        raise NetemUnavailable(
            f"DCODED_NETEM_PREFIX={name!r} is not allowed: letters and digits, at most 12"
        )
    return name


#: How long a frame may wait in a shaped link's queue (tbf ``latency``), by default: a switch
#: port's buffer, not the 100 ms of bufferbloat that made control messages wait behind data.
QUEUE_MS = 20.0
SUBNET = "10.213.47"  # a /24 that exists only inside the run's namespaces
SCHEDULER_PORT = 8786
#: How long an interrupted run's driver may take to write what it measured and exit.
STOP_WAIT_S = 60.0


@dataclass
class Host:
    name: str  # "sched", "w0", ..., "drv"
    ns: str
    ip: str
    ifname: str  # the host's end of its veth pair, inside ns
    rate_mbit: float


@dataclass(frozen=True)
class Links:
    """The emulated network's shape and rates (``cluster.*`` of ``cluster=netem``).

    ``switch``: every host its own full-duplex link of ``rate_mbit`` to one bridge.
    ``bus``: the same links, and every frame that enters the bridge crosses one shared queue
    of ``rate_mbit`` once (all ports' ingress redirected to one shaped IFB device), whoever
    sent it and however many hosts receive it: a hub, a shared medium.
    ``racks``: workers in racks of ``rack_size`` behind a rack bridge; each rack joined to the
    core bridge (scheduler and driver) by an uplink of ``uplink_mbit`` each way.
    ``fattree``: the racks in pods of ``pod_racks``, each rack's uplink to its pod's bridge,
    each pod joined to the core bridge by an uplink of ``pod_uplink_mbit`` each way.
    """

    rate_mbit: float
    driver_rate_mbit: float | None = None
    topology: str = "switch"
    queue_ms: float = QUEUE_MS
    rack_size: int | None = None
    uplink_mbit: float | None = None
    pod_racks: int | None = None
    pod_uplink_mbit: float | None = None
    #: each worker's process pinned to one core (``cluster.pin_workers``): with as many workers
    #: as cores, the truth the scale model is checked against
    pin_workers: bool = False

    @classmethod
    def from_config(cls, cluster: Mapping) -> Links:
        return cls(
            rate_mbit=float(cluster["bandwidth_mbit"]),
            driver_rate_mbit=cluster.get("driver_bandwidth_mbit"),
            topology=cluster.get("topology") or "switch",
            queue_ms=float(cluster.get("queue_ms") or QUEUE_MS),
            rack_size=cluster.get("rack_size"),
            uplink_mbit=cluster.get("uplink_mbit"),
            pod_racks=cluster.get("pod_racks"),
            pod_uplink_mbit=cluster.get("pod_uplink_mbit"),
            pin_workers=bool(cluster.get("pin_workers")),
        )

    def host_rate(self, name: str) -> float:
        return float(
            self.driver_rate_mbit if name == "drv" and self.driver_rate_mbit else self.rate_mbit
        )

    @property
    def shape(self) -> topology.Shape:
        """Who shares which link, and at what rate."""
        return topology.Shape(
            self.topology,
            float(self.rate_mbit),
            self.rack_size,
            self.uplink_mbit,
            self.pod_racks,
            self.pod_uplink_mbit,
        )

    def queueing_ms(self) -> float:
        """The longest a frame can wait in queues between two hosts: every shaped queue of
        the longest path full (the sender's link, the bus or both rack uplinks, the
        receiver's link)."""
        return self.shape.queues_on_path() * self.queue_ms

    def as_dict(self) -> dict:
        return {
            "topology": self.topology,
            "bandwidth_mbit": float(self.rate_mbit),
            "driver_bandwidth_mbit": self.host_rate("drv"),
            "queue_ms": self.queue_ms,
            **(
                {"rack_size": self.rack_size, "uplink_mbit": float(self.uplink_mbit)}
                if self.shape.racked
                else {}
            ),
            **(
                {"pod_racks": self.pod_racks, "pod_uplink_mbit": float(self.pod_uplink_mbit)}
                if self.topology == "fattree"
                else {}
            ),
        }


def check_links(cluster: Mapping, n_workers: int) -> None:
    """``ValueError`` naming the setting, for a shape the emulated network cannot take."""
    topology.check(cluster, n_workers)
    for key in (
        "bandwidth_mbit",
        "driver_bandwidth_mbit",
        "queue_ms",
        "uplink_mbit",
        "pod_uplink_mbit",
    ):
        value = cluster.get(key)
        if value is not None and (not isinstance(value, int | float) or value <= 0):
            unit = "ms" if key == "queue_ms" else "Mbit/s"
            raise ValueError(f"cluster.{key}={value!r} is not allowed: it must be > 0 ({unit})")
    if cluster.get("bandwidth_mbit") is None:
        raise ValueError("cluster=netem needs cluster.bandwidth_mbit (Mbit/s per link)")
    kind = cluster.get("topology")
    if kind in topology.RACKED and cluster.get("uplink_mbit") is None:
        raise ValueError(
            f"cluster.topology={kind} needs cluster.uplink_mbit (Mbit/s of each rack's uplink)"
        )
    if kind == "fattree" and cluster.get("pod_uplink_mbit") is None:
        raise ValueError(
            "cluster.topology=fattree needs cluster.pod_uplink_mbit (Mbit/s of each pod's uplink)"
        )
    if cluster.get("scale_model"):
        scale.from_config(cluster, hosts=n_workers + 2)  # ValueError naming the setting
        why = scale.usable()
        if why:
            raise ValueError(f"cluster.scale_model=true {why}")


@dataclass
class Network:
    run: str
    hub: str
    links: Links
    hosts: dict[str, Host] = field(default_factory=dict)
    processes: list[subprocess.Popen] = field(default_factory=list)
    logs: list = field(default_factory=list)  # open log files of those processes
    scratch: str | None = None  # the workers' scratch folder (removed with the network)
    #: the scale model (``cluster.scale_model``): every host in a CPU cgroup of its own, the
    #: links and timers dilated by its TDF; ``None``: the hosts share the machine freely
    model: scale.ScaleModel | None = None
    groups: scale.HostGroups | None = None
    awake: scale.CpusAwake | None = None  # the CPUs kept out of sleep while the network lives

    @property
    def tdf(self) -> float:
        return self.model.tdf if self.model else 1.0

    @property
    def scheduler_address(self) -> str:
        return f"tcp://{self.hosts['sched'].ip}:{SCHEDULER_PORT}"

    def workers(self) -> list[Host]:
        return [h for n, h in self.hosts.items() if n.startswith("w")]


def check_available() -> None:
    """Fail at once, with the reason, where namespaces cannot be made."""
    missing = [tool for tool in ("ip", "tc", "bridge") if shutil.which(tool) is None]
    if missing:
        raise NetemUnavailable(
            f"cluster=netem needs iproute2 ({', '.join(missing)} not found); "
            "use cluster=local instead"
        )
    if os.geteuid() != 0:
        raise NetemUnavailable(
            "cluster=netem needs root to create network namespaces; use cluster=local instead"
        )


#: What a cluster=netem config keeps when it falls back to loopback (``cluster.fallback``).
LOOPBACK_KEEPS = ("n_workers", "torch_threads", "connect_timeout_s")


def loopback_reason(cluster: Mapping) -> str | None:
    """Why a ``cluster=netem`` config with ``cluster.fallback=local`` runs on loopback here
    (the emulated network cannot be made: :func:`check_available`); ``None`` where it runs
    emulated, or where it asks no fallback (and so is refused as before)."""
    if cluster.get("kind") != "netem" or cluster.get("fallback") != "local":
        return None
    try:
        check_available()
    except NetemUnavailable as e:
        return str(e).split("; use cluster=local")[0]
    return None


_FELL_BACK: set[str] = set()  # said once per process: the jobs of a sweep each fall back


def or_loopback(cfg: Mapping) -> Mapping:
    """``cfg`` itself, or, where it asks for ``cluster=netem`` with ``cluster.fallback=local``
    and the emulated network cannot be made here, the same run on ``cluster=local`` (worker
    processes on loopback, no emulated link; ``transport=multicast`` as ``direct``, TCP, as
    loopback has no IP multicast), said in one line."""
    from omegaconf import DictConfig, OmegaConf

    from dcoded.settings import conf_values  # conf/'s files as shipped

    why = loopback_reason(cfg.get("cluster") or {})
    if why is None:
        return cfg
    out = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else dict(cfg)
    out["cluster"] = conf_values("cluster/local.yaml") | {
        k: cfg["cluster"][k] for k in LOOPBACK_KEEPS if k in cfg["cluster"]
    }
    transport = cfg.get("transport") or {}
    multicast = transport.get("name") == "multicast"
    if multicast:
        direct = conf_values("transport/direct.yaml")
        kept = {k: transport[k] for k in direct if k != "name" and k in transport}
        out["transport"] = direct | kept
    if why not in _FELL_BACK:
        _FELL_BACK.add(why)
        print(
            f"warning: {why}: running on loopback instead (cluster=local"
            + (", transport=direct" if multicast else "")
            + ", as cluster.fallback=local asks): no emulated link, so bytes cost almost nothing",
            file=sys.stderr,
        )
    return OmegaConf.create(out) if isinstance(cfg, DictConfig) else out


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if result.returncode:
        raise NetemUnavailable(f"`{' '.join(cmd)}` failed: {result.stderr.strip()}")


def _tc(ns: str, *args: str) -> None:
    cmd = ["tc", "-n", ns, *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if result.returncode:
        raise NetemUnavailable(f"`{' '.join(cmd)}` failed: {result.stderr.strip()}")


def _tbf(
    ns: str, ifname: str, rate_mbit: float, queue_ms: float = QUEUE_MS, tdf: float = 1.0
) -> None:
    """Cap egress of ``ifname`` at ``rate_mbit`` (token bucket; burst sized for the rate), with
    a queue that holds ``queue_ms`` of traffic. Dilated by ``tdf`` (the scale model): the rate
    is divided by it and the queue and burst keep their size in bytes."""
    burst = topology.bucket_bytes(rate_mbit)  # about 4 ms of traffic, >= 16 kB
    rate_mbit, queue_ms = rate_mbit / tdf, queue_ms * tdf
    _tc(
        ns,
        "qdisc",
        "replace",
        "dev",
        ifname,
        "root",
        "tbf",
        "rate",
        f"{rate_mbit}mbit",
        "burst",
        str(burst),
        "latency",
        f"{queue_ms}ms",
    )


def build(n_workers: int, links: Links, model: scale.ScaleModel | None = None) -> Network:
    """Make the namespaces, the bridges and the shaped links (no processes yet); with
    ``model`` (the scale model) a CPU cgroup per host too."""
    check_available()
    run = f"{uuid.uuid4().hex[:6]}p{os.getpid()}"  # the builder's pid: cleanup spares a live run
    net = Network(run=run, hub=f"{prefix()}-{run}-hub", links=links, model=model)
    names = ["sched", *(f"w{k}" for k in range(n_workers)), "drv"]
    try:
        if model is not None:
            net.groups = scale.HostGroups(f"{prefix()}-{run}", names, model)
            net.awake = scale.CpusAwake()
        _build_hub(net, n_workers)
        for i, name in enumerate(names):
            _add_host(net, i, name, n_workers)
        _shape(net)
    except BaseException:
        destroy(net)
        raise
    return net


def _build_hub(net: Network, n_workers: int) -> None:
    """The hub's namespace and what lives in it before any host joins: the core bridge, the
    pods' and racks' bridges with their uplinks, and the bus's IFB device."""
    hub, shape = net.hub, net.links.shape
    _ip("netns", "add", hub)
    _bridge(hub, "br0", snoop=net.links.topology != "bus")
    for q in range(shape.n_pods(n_workers)):
        # the pod's uplink: pu{q} on the pod bridge, pc{q} on the core
        _bridge(hub, f"pd{q}")
        _uplink(hub, f"pu{q}", f"pd{q}", f"pc{q}", "br0")
    for r in range(shape.n_racks(n_workers)):
        # the rack's uplink: u{r} on the rack bridge, c{r} on the core (or its pod's bridge)
        above = "br0" if (pod := shape.pod_of_rack(r)) is None else f"pd{pod}"
        _bridge(hub, f"rk{r}")
        _uplink(hub, f"u{r}", f"rk{r}", f"c{r}", above)
    if net.links.topology == "bus":
        _ip("link", "add", "ifb0", "type", "ifb", ns=hub)
        _ip("link", "set", "ifb0", "up", ns=hub)


def _add_host(net: Network, i: int, name: str, n_workers: int) -> None:
    """Host ``name`` (the ``i``-th): its namespace, joined to its bridge in the hub by a veth
    pair (``eth0`` in the host, ``v{i}`` in the hub), with its address and multicast route."""
    hub, shape = net.hub, net.links.shape
    ns = f"{prefix()}-{net.run}-{name}"
    host = Host(name, ns, f"{SUBNET}.{i + 1}", "eth0", net.links.host_rate(name))
    _ip("netns", "add", host.ns)
    net.hosts[name] = host  # from here on, destroy() removes it
    _ip("link", "set", "lo", "up", ns=host.ns)
    hub_end = f"v{i}"
    # both ends are made in the hub; eth0 moves to the host's namespace at once
    _ip(
        "link",
        "add",
        "eth0",
        "netns",
        host.ns,
        "type",
        "veth",
        "peer",
        "name",
        hub_end,
        ns=hub,
    )
    bridge = "br0"
    if shape.racked and name.startswith("w"):
        bridge = f"rk{shape.rack_of(n_workers)[int(name[1:])]}"
    _port(hub, hub_end, bridge, snoop=net.links.topology != "bus")
    _ip("addr", "add", f"{host.ip}/24", "dev", "eth0", ns=host.ns)
    _ip("link", "set", "eth0", "up", ns=host.ns)
    # IP multicast leaves by the host's one link; a worker joins a group per receiver set
    _ip("route", "add", "224.0.0.0/4", "dev", "eth0", ns=host.ns)
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            host.ns,
            "sysctl",
            "-qw",
            "net.ipv4.igmp_max_memberships=1024",
        ],
        capture_output=True,
        timeout=30,
    )
    if net.links.topology == "bus":  # every frame the host sends crosses the one medium
        _onto_bus(hub, hub_end)


def _onto_bus(hub: str, hub_end: str) -> None:
    """Redirect all that enters the hub by ``hub_end`` (what its host sends) to the bus's IFB
    device, whose one shaped queue every frame then crosses."""
    _tc(hub, "qdisc", "add", "dev", hub_end, "handle", "ffff:", "ingress")
    _tc(
        hub,
        "filter",
        "add",
        "dev",
        hub_end,
        "parent",
        "ffff:",
        "protocol",
        "all",
        "u32",
        "match",
        "u32",
        "0",
        "0",
        "action",
        "mirred",
        "egress",
        "redirect",
        "dev",
        "ifb0",
    )


def _bridge(ns: str, name: str, snoop: bool = True) -> None:
    """A bridge that forwards a multicast datagram only to the ports of its group's entries
    (:func:`route_groups`), as a switch with IGMP snooping does; without ``snoop`` (a bus: a
    hub, where every host hears every frame) to every port. A Linux bridge ignores its
    entries while it knows of no querier, and for a query response interval (10 s by
    default, 1 s here) after one appears; its ports flood no group, so in that window it
    forwards multicast nowhere. It is its own querier, and that interval is set before the
    querier (it is the wait the querier starts)."""
    _ip("link", "add", name, "type", "bridge", ns=ns)
    _ip("link", "set", name, "up", ns=ns)
    if snoop:
        _ip("link", "set", name, "type", "bridge", "mcast_snooping", "1", ns=ns)
        _ip("link", "set", name, "type", "bridge", "mcast_query_response_interval", "100", ns=ns)
        _ip("link", "set", name, "type", "bridge", "mcast_querier", "1", ns=ns)


def _port(ns: str, end: str, bridge: str, uplink: bool = False, snoop: bool = True) -> None:
    """``end`` a port of ``bridge``; with ``snoop``, one that never gets a multicast datagram
    no entry sends it (``mcast_flood off``), and an uplink's end never counts as a multicast
    router's port either, which would draw every group across it."""
    _ip("link", "set", end, "master", bridge, ns=ns)
    if snoop:
        flags = ["mcast_flood", "off", *(["mcast_router", "0"] if uplink else [])]
        _ip("link", "set", "dev", end, "type", "bridge_slave", *flags, ns=ns)
    _ip("link", "set", end, "up", ns=ns)


def _uplink(ns: str, low: str, below: str, high: str, above: str) -> None:
    """A veth pair joining bridge ``below`` (its end ``low``) to bridge ``above`` (``high``)."""
    _ip("link", "add", low, "type", "veth", "peer", "name", high, ns=ns)
    for end, bridge in ((low, below), (high, above)):
        _port(ns, end, bridge, uplink=True)


def group_ports(links: Links, n_workers: int, members: Iterable[int]) -> list[tuple[str, str]]:
    """The bridge ports, ``(bridge, port)``, that a multicast group of workers ``members``
    (``k`` for host ``w{k}``) needs so that a datagram from any host reaches every member and
    crosses only the links toward them: each member's own port; a rack's uplink (a pod's) when
    a member is outside it; the way down into a rack (a pod) that holds a member.

    >>> group_ports(Links(25.0, topology="racks", rack_size=2, uplink_mbit=25.0), 4, [1, 2])
    [('br0', 'c0'), ('br0', 'c1'), ('rk0', 'u0'), ('rk0', 'v2'), ('rk1', 'u1'), ('rk1', 'v3')]
    >>> group_ports(Links(25.0), 4, [1, 2])
    [('br0', 'v2'), ('br0', 'v3')]
    """
    shape, members = links.shape, sorted(set(members))
    racks = shape.rack_of(n_workers)
    ports = set()
    for k in members:  # host w{k} is the hub's v{k+1} (the scheduler is v0)
        ports.add((f"rk{racks[k]}" if racks else "br0", f"v{k + 1}"))
    if racks:
        held = {racks[k] for k in members}
        for r in range(shape.n_racks(n_workers)):
            pod = shape.pod_of_rack(r)
            if held - {r}:
                ports.add((f"rk{r}", f"u{r}"))
            if r in held:
                ports.add(("br0" if pod is None else f"pd{pod}", f"c{r}"))
        pods = {shape.pod_of_rack(r) for r in held} - {None}
        for q in range(shape.n_pods(n_workers)):
            if pods - {q}:
                ports.add((f"pd{q}", f"pu{q}"))
            if q in pods:
                ports.add(("br0", f"pc{q}"))
    return sorted(ports)


def route_groups(hub: str, links: Links, n_workers: int, groups: Mapping[str, Iterable[int]]):
    """Give each multicast group (address: its workers) its entries on the hub's bridges
    (:func:`group_ports`), in place of every entry a run put there before (a network that
    several runs share keeps none of an earlier run's groups), and of any entry a bridge
    learned for these groups from a join (a worker of an earlier attempt, or of a run whose
    tag gave the same address, may still hold one: the kernel refuses a permanent entry
    where a learned one is)."""
    cmd = ["bridge", "-n", hub, "-j", "mdb", "show"]
    shown = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    try:
        if shown.returncode:
            raise ValueError(shown.stderr.strip())
        tables = json.loads(shown.stdout or "[]")
    except ValueError as e:
        raise NetemUnavailable(f"`{' '.join(cmd)}` failed: {e}") from None
    lines = []
    for table in tables:
        for entry in table.get("mdb", []):
            grp = entry.get("grp", "")
            if (entry.get("state") == "permanent" and "." in grp) or grp in groups:
                lines.append(f"mdb del dev {entry['dev']} port {entry['port']} grp {grp}")
    for address, members in groups.items():
        for bridge, port in group_ports(links, n_workers, members):
            lines.append(f"mdb add dev {bridge} port {port} grp {address} permanent")
    if not lines:
        return
    result = subprocess.run(
        ["bridge", "-n", hub, "-batch", "-"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode:
        why = result.stderr.strip()
        raise NetemUnavailable(f"the multicast groups' bridge entries failed: {why}")


def route_run(cluster: Mapping, groups: Mapping[str, Iterable[str]]) -> None:
    """:func:`route_groups` for a run's driver: ``cluster`` its config (``worker_ips``, the
    hub's namespace, the network), ``groups`` each group's members by their Dask address."""
    links = Links.from_config(cluster["netem"])
    if links.topology == "bus":  # a hub: every host hears every frame, as on a real one
        return
    ips = list(cluster["worker_ips"])  # w0's first
    where = {
        address: [ips.index(member.split("://")[-1].rsplit(":", 1)[0]) for member in members]
        for address, members in groups.items()
    }
    route_groups(cluster["namespaces"]["hub"], links, len(ips), where)


def _shape(net: Network) -> None:
    """Set every shaped queue to the network's rates: each host's link both ways (egress of
    the host's end: what it sends; of the bridge's end: what it receives), the bus, and the
    rack uplinks both ways."""
    links, tdf = net.links, net.tdf
    for i, host in enumerate(net.hosts.values()):  # the order build() gave the hub ends
        host.rate_mbit = links.host_rate(host.name)
        _tbf(host.ns, "eth0", host.rate_mbit, links.queue_ms, tdf)
        _tbf(net.hub, f"v{i}", host.rate_mbit, links.queue_ms, tdf)
    if links.topology == "bus":
        _tbf(net.hub, "ifb0", links.rate_mbit, links.queue_ms, tdf)
    for r in range(links.shape.n_racks(len(net.workers()))):
        for end in (f"u{r}", f"c{r}"):
            _tbf(net.hub, end, links.uplink_mbit, links.queue_ms, tdf)
    for q in range(links.shape.n_pods(len(net.workers()))):
        for end in (f"pu{q}", f"pc{q}"):
            _tbf(net.hub, end, links.pod_uplink_mbit, links.queue_ms, tdf)


def hub_queues(net: Network) -> dict[str, tuple[str, float]]:
    """The shaped queues in the hub, by what they carry: ``"w0 in"`` (what host w0 receives),
    ``"bus"``, ``"rack0 up"`` and ``"rack0 down"``, ``"pod0 up"`` and ``"pod0 down"``;
    values are the device and its real (dilated) rate, Mbit/s."""
    links = net.links
    out = {
        f"{host.name} in": (f"v{i}", links.host_rate(host.name))
        for i, host in enumerate(net.hosts.values())
    }
    if links.topology == "bus":
        out["bus"] = ("ifb0", links.rate_mbit)
    for r in range(links.shape.n_racks(len(net.workers()))):
        out[f"rack{r} up"] = (f"u{r}", links.uplink_mbit)
        out[f"rack{r} down"] = (f"c{r}", links.uplink_mbit)
    for q in range(links.shape.n_pods(len(net.workers()))):
        out[f"pod{q} up"] = (f"pu{q}", links.pod_uplink_mbit)
        out[f"pod{q} down"] = (f"pc{q}", links.pod_uplink_mbit)
    return {name: (dev, float(rate) / net.tdf) for name, (dev, rate) in out.items()}


def queue_rates(net: Network) -> dict[str, float]:
    """The real (dilated) rate of each of :func:`hub_queues`, Mbit/s."""
    return {name: rate for name, (_, rate) in hub_queues(net).items()}


def queue_counters(net: Network) -> dict[str, dict[str, int]]:
    """Bytes sent and the backlog now of each of :func:`hub_queues` (``tc -s -j``)."""
    by_dev = _root_queues(net.hub)
    out = {}
    for name, (dev, _) in hub_queues(net).items():
        q = by_dev.get(dev)
        if q is not None:
            out[name] = {"bytes": int(q.get("bytes", 0)), "backlog": int(q.get("backlog", 0))}
    return out


def _in_ns(
    host: Host,
    argv: list[str],
    env: Mapping | None = None,
    net: Network | None = None,
    cpu: int | None = None,
    **kw,
) -> subprocess.Popen:
    """Start ``argv`` in ``host``'s namespace (and, under the scale model, its CPU cgroup;
    with ``cpu``, pinned to that core)."""
    steps = []
    if net is not None and net.groups is not None:
        steps.append(net.groups.enter(host.name))
    if cpu is not None:
        steps.append(lambda: os.sched_setaffinity(0, {cpu}))
    if steps:
        kw["preexec_fn"] = lambda: [step() for step in steps]
    return subprocess.Popen(
        ["ip", "netns", "exec", host.ns, *argv],
        env={**os.environ, **(env or {})},
        start_new_session=True,  # its own process group, killed as one on teardown
        **kw,
    )


def start_dask(net: Network, log_dir: Path, connect_timeout_s: float = 60) -> None:
    """Start ``dask scheduler`` and one single-threaded ``dask worker`` per worker namespace
    (each worker's scratch space in a folder of the network's own, not Dask's shared one);
    with ``net.links.pin_workers`` worker ``k`` pinned to core ``k`` mod the cores."""
    cpus = sorted(os.sched_getaffinity(0))
    _own_folder(log_dir)
    net.scratch = tempfile.mkdtemp(prefix=f"{net.hub.removesuffix('-hub')}-")  # mode 0700
    timers = scale.dask_timers(net.tdf) if net.model else {}  # Dask's own, dilated too
    sched = net.hosts["sched"]
    out = files.create(log_dir / "scheduler.log")  # closed by destroy()
    net.logs.append(out)
    net.processes.append(
        _in_ns(
            sched,
            [
                _dask(),
                "scheduler",
                "--host",
                sched.ip,
                "--port",
                str(SCHEDULER_PORT),
                "--no-dashboard",
            ],
            env=timers,
            net=net,
            cpu=host_cpu(net, "sched", cpus),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    )
    for host in net.workers():
        env = _worker_env(net, host, timers)
        out = files.create(log_dir / f"worker-{host.name}.log")  # closed by destroy()
        net.logs.append(out)
        net.processes.append(
            _in_ns(
                host,
                _worker_argv(net, host, connect_timeout_s),
                env=env,
                net=net,
                cpu=host_cpu(net, host.name, cpus),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )


def _dask() -> str:
    """The ``dask`` command of this Python's environment."""
    return str(Path(sys.executable).parent / "dask")


def _worker_argv(net: Network, host: Host, connect_timeout_s: float) -> list[str]:
    """The command line of worker ``host``'s ``dask worker``."""
    return [
        _dask(),
        "worker",
        net.scheduler_address,
        "--host",
        host.ip,
        "--nthreads",
        "1",
        "--no-dashboard",
        "--name",
        host.name,
        "--death-timeout",
        str(connect_timeout_s),
        "--preload",
        "dcoded.engine.direct",
        "--local-directory",
        net.scratch,
    ]


def _worker_env(net: Network, host: Host, timers: Mapping[str, str]) -> dict[str, str]:
    """What worker ``host``'s ``dask worker`` adds to this process's environment: one thread
    for OpenMP and MKL, where its CPU cgroups are (``DCODED_CGROUP_ROOT``), its host's cores
    under the scale model, and Dask's ``timers``."""
    # `ip netns exec` mounts a /sys of its own, without the cgroups: a worker reaches the
    # host's (straggle=slow: a group inside its own host's, under the scale model) through
    # this process's root
    cgroups = f"/proc/{os.getpid()}/root/sys/fs/cgroup/cpu"
    extra = {}
    if net.groups is not None:
        cgroups += "/" + net.groups.cpu(host.name).name
        extra["DCODED_HOST_CORES"] = repr(net.model.quota_cores)
    return {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "DCODED_CGROUP_ROOT": cgroups,
        "DCODED_CGROUP_PREFIX": slow_cgroups(net.run),
        **extra,
        **timers,
    }


def slow_cgroups(run: str) -> str:
    """What the cgroups of the network ``run``'s slow workers (``straggle=slow``) are named
    with: :func:`destroy` removes them, and :func:`cleanup` those of a killed run.

    >>> slow_cgroups("1a2b3cp42") == f"dcoded-{prefix()}-1a2b3cp42-"
    True
    """
    return f"{straggle.CGROUP_PREFIX}{prefix()}-{run}-"


def host_cpu(net: Network, name: str, cpus: list[int] | None = None) -> int | None:
    """The core a host's processes are pinned to, or ``None``: worker ``k`` to core ``k`` mod
    the cores with ``cluster.pin_workers``; under the scale model every host, round-robin in
    the order sched, w0, w1, ..., drv (:meth:`~dcoded.scale.ScaleModel.cpu`)."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    if net.links.pin_workers and name.startswith("w"):
        return cpus[int(name[1:]) % len(cpus)]
    if net.model is not None:
        index = net.model.cpu(list(net.hosts).index(name))
        return None if index is None else cpus[index % len(cpus)]
    return None


def tx_bytes(host: Host) -> int:
    """Bytes the host's interface has sent (its own counter, read inside its namespace)."""
    path = f"/sys/class/net/{host.ifname}/statistics/tx_bytes"
    result = subprocess.run(
        ["ip", "netns", "exec", host.ns, "cat", path], capture_output=True, text=True, timeout=30
    )
    return int(result.stdout.strip())


def destroy(net: Network) -> None:
    """Stop every process and delete every namespace (with them the links and the bridge)
    and every cgroup its workers made. A second Ctrl-C or SIGTERM waits until it is done (it
    cut the teardown in half, and left namespaces and cgroups for ``cleanup``)."""
    with signals_deferred():
        _destroy(net)


def _destroy(net: Network) -> None:
    for proc in net.processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in net.processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for ns in [*(h.ns for h in net.hosts.values()), net.hub]:
        _delete_namespace(ns)
    # a slow worker's cgroup, which its run's driver removes when it can (not when the signal
    # that stopped the sweep stopped the driver and the workers too)
    straggle.remove_stale(slow_cgroups(net.run))
    if net.groups is not None:
        net.groups.remove()
    if net.awake is not None:
        net.awake.close()
    for f in net.logs:
        f.close()
    if net.scratch:
        shutil.rmtree(net.scratch, ignore_errors=True)


def _own_folder(path: Path) -> None:
    """Make a folder dcoded names itself in a run folder (``netem/``), refusing one that is a
    symbolic link: root would write its fixed names wherever it points."""
    if path.is_symlink():
        raise NetemUnavailable(f"{path} is a symbolic link: remove it, or choose another folder")
    path.mkdir(parents=True, exist_ok=True)


def _delete_namespace(ns: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    for pid in pids.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def stale_namespaces() -> list[str]:
    """The namespaces of this prefix's runs (:func:`prefix`) that exist now."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{prefix()}-")]


def builder(ns: str) -> int | None:
    """The pid of the process that made a namespace (its name says it), if it still runs and
    is not this one: that run is live.

    >>> builder("dcn-1a2b3cp1-w0")  # pid 1, init: alive, and not this process
    1
    >>> builder("dcn-1a2b3c-w0") is None  # a name of an older dcoded: no pid in it
    True
    """
    run = ns.split("-")[1] if ns.count("-") >= 2 else ""
    pid = run.rpartition("p")[2]
    if "p" not in run or not pid.isdigit() or int(pid) == os.getpid():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        pass
    return int(pid)


def cleanup(force: bool = False) -> tuple[list[str], list[str]]:
    """Remove every namespace (and the processes in it) that a netem run of this prefix
    (:func:`prefix`) left behind: ``(removed, spared)``. A namespace whose builder still runs
    (another process's live run) is spared unless ``force``."""
    gone, spared = [], []
    for ns in stale_namespaces():
        (spared if builder(ns) and not force else gone).append(ns)
    for ns in gone:
        _delete_namespace(ns)
    for name in _slow_cgroups_left():  # the slow workers' cgroups of runs that are gone
        if force or not builder(name.removeprefix(straggle.CGROUP_PREFIX)):
            straggle.remove(straggle.CGROUP_ROOT / name)
            gone.append(name)
    if scale.usable() is None:  # the host cgroups of the scale model, of runs that are gone
        mine = f"{prefix()}-"
        gone += scale.remove_stale(
            lambda run: not run.startswith(mine) or (bool(builder(f"{run}-x")) and not force)
        )
    return gone, spared


def _slow_cgroups_left() -> list[str]:
    """The slow workers' cgroups of this prefix's networks (:func:`slow_cgroups`) that exist."""
    if not straggle.CGROUP_ROOT.is_dir():
        return []
    ours = f"{straggle.CGROUP_PREFIX}{prefix()}-*"
    return sorted(p.name for p in straggle.CGROUP_ROOT.glob(ours))


@contextlib.contextmanager
def network(
    n_workers: int, links: Links, log_dir: Path, model: scale.ScaleModel | None = None
) -> Iterator[Network]:
    """The whole emulated cluster, removed on exit (also on error, Ctrl-C and SIGTERM)."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        net = build(n_workers, links, model)
        try:
            start_dask(net, log_dir)
            yield net
        finally:
            destroy(net)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum, frame):
    """SIGTERM while a network lives: stop as Ctrl-C does (its teardown runs), saying which;
    it stays the handler, so a second one cannot end the process before the teardown."""
    raise Interrupted("stopped by SIGTERM", signal.SIGTERM)


def retune(net: Network, links: Links) -> None:
    """Set every link's rate and queue anew (both directions, the bus and the uplinks),
    keeping hosts and processes; the topology stays what it was built as."""
    n_workers = len(net.workers())
    if links.shape.wiring(n_workers) != net.links.shape.wiring(n_workers):
        raise ValueError("retune keeps the topology: build a new network for another one")
    net.links = links
    _shape(net)


_shared: list[Network] = []  # at most one: the cluster that the jobs of a multirun share


def shared_network(
    n_workers: int, links: Links, log_dir: Path, model: scale.ScaleModel | None = None
) -> Network:
    """One emulated cluster kept for the jobs of a multirun that run in this process.

    Building it (namespaces, and ``K + 1`` Dask processes importing torch) costs about half a
    minute on two cores, more than a short run. A job with other rates or queues re-rates the
    same links; one with another ``n_workers`` or topology gets a new cluster. It is removed
    when the process exits (also on error, Ctrl-C and SIGTERM), or by :func:`release_shared`.
    """
    if _shared and (
        len(_shared[0].workers()) != n_workers
        or _shared[0].links.shape.wiring(n_workers) != links.shape.wiring(n_workers)
        or _shared[0].model != model  # other quotas: other cgroups and processes
        or _shared[0].links.pin_workers != links.pin_workers
    ):
        release_shared()
    if not _shared:
        signal.signal(signal.SIGTERM, _raise_interrupt)  # so that atexit runs
        net = build(n_workers, links, model)
        _shared.append(net)
        atexit.register(release_shared)
        start_dask(net, log_dir)
    net = _shared[0]
    if net.links != links:
        retune(net, links)
    return net


def release_shared() -> None:
    """Remove the cluster :func:`shared_network` kept (nothing if there is none)."""
    while _shared:
        destroy(_shared.pop())


# --------------------------------------------------------------------------- the run


def run_netem(cfg: Mapping, out_dir: Path, reuse: bool = False) -> dict:
    """Run one experiment on a new emulated cluster; return its summary (with wire bytes).

    With ``reuse`` (the jobs of a multirun) the cluster outlives the run, for the next job:
    see :func:`shared_network`; its process logs go to the run's parent folder.
    """
    cluster = cfg["cluster"]
    out_dir = Path(out_dir)
    n_workers, links = int(cluster["n_workers"]), Links.from_config(cluster)
    model = scale.from_config(cluster, hosts=n_workers + 2)  # the workers, scheduler, driver
    if reuse:
        folder = out_dir.parent / f"netem-{n_workers}-workers"
        net = shared_network(n_workers, links, folder, model)
        return run_in_network(cfg, out_dir, net)
    with network(n_workers, links, out_dir / "netem", model) as net:
        return run_in_network(cfg, out_dir, net)


def run_in_network(cfg: Mapping, out_dir: Path, net: Network) -> dict:
    """Run one experiment on an existing emulated cluster (several runs can share one).

    The driver is a child process inside the driver namespace, running the same config as a
    client of the emulated scheduler (``cluster.kind=address``); the interfaces' counters
    around its training loop give ``bytes_per_worker.wire``.
    """
    out_dir = Path(out_dir)
    _own_folder(out_dir / "netem")
    child = _driver_config(cfg, net)
    # the driver reads its config from a pipe: a file root wrote and a root child read back
    # could be swapped in between; config.json is only the record of what it was given
    text = json.dumps(child)
    files.write_text(out_dir / "netem" / "config.json", text)
    monitor = None
    if net.model is not None:
        monitor = scale.Monitor(net.groups, lambda: queue_counters(net)).start()
    proc = _in_ns(
        net.hosts["drv"],
        [sys.executable, "-m", "dcoded.run", "-", str(out_dir), "--no-table"],
        env={
            **(scale.dask_timers(net.tdf) if net.model else {}),
            # a warning of the network's workers, said once for the jobs of a sweep
            **({"DCODED_SAID_FILE": str(Path(net.scratch, "said"))} if net.scratch else {}),
        },
        net=net,
        cpu=host_cpu(net, "drv"),
        stdin=subprocess.PIPE,
        text=True,
    )
    with contextlib.suppress(BrokenPipeError):  # a driver that died at once says why itself
        proc.stdin.write(text)
        proc.stdin.close()
    try:
        code = _wait_for_driver(proc, out_dir)
    finally:
        samples = monitor.stop() if monitor else None
    if samples is not None:
        _record_scale(out_dir, net, samples)
    if code:
        raise NetemRunFailed(code)
    return json.loads((out_dir / "summary.json").read_text())


def _driver_config(cfg: Mapping, net: Network) -> dict:
    """The driver's config: ``cfg`` with its cluster that of a client of ``net``'s scheduler
    (``cluster.kind=address``), saying where the wire and loss counters are."""
    cluster = cfg["cluster"]
    child = copy.deepcopy(dict(cfg))
    child["cluster"] = {
        "kind": "address",
        "address": net.scheduler_address,
        "n_workers": int(cluster["n_workers"]),
        "torch_threads": int(cluster.get("torch_threads", 1)),
        "connect_timeout_s": float(cluster.get("connect_timeout_s", 60)),
        "wire": [{"ns": h.ns, "ifname": h.ifname, "name": h.name} for h in net.workers()],
        # every namespace, for the kernel's loss counters around the training loop
        "namespaces": {**{n: h.ns for n, h in net.hosts.items()}, "hub": net.hub},
        # the hub's shaped queues by name: what each link carried in the training loop
        "queues": {name: dev for name, (dev, _) in hub_queues(net).items()},
        "netem": net.links.as_dict(),
        # each worker's address, w0 first: the multicast groups' bridge entries
        "worker_ips": [h.ip for h in net.workers()],
        "given": dict(cluster),  # what summary.json records as the run's cluster
        # the driver dilates every timer that stands for a network or compute time, and puts
        # the hosts' quotas in force while its training loop runs
        **(
            {
                "scale": {
                    **net.model.as_dict(),
                    "quota_files": net.groups.quota_files(f"/proc/{os.getpid()}/root"),
                    # the driver's own: it measures the compute speed under the quota there
                    "probe_file": f"/proc/{os.getpid()}/root{net.groups.cpu('drv')}"
                    "/cpu.cfs_quota_us",
                }
            }
            if net.model
            else {}
        ),
    }
    return child


def _wait_for_driver(proc: subprocess.Popen, out_dir: Path) -> int:
    """The driver's exit code. Interrupted (or failing) while waiting, it stops the driver as
    one process group, :data:`STOP_WAIT_S` to write what it measured before it is killed, and
    raises again."""
    try:
        return wait_interruptibly(proc)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # it writes what it measured, then exits
        try:
            wait_interruptibly(proc, STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            print(
                f"the driver had not stopped {STOP_WAIT_S:g}s after the interrupt: killed it "
                f"(what it wrote is in {out_dir})",
                file=sys.stderr,
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise


def _record_scale(out_dir: Path, net: Network, samples: list[dict]) -> None:
    """Add the scale model to the run's ``summary.json`` (where the driver wrote one): its
    quotas and TDF with each host's CPU use (``scale_model``), the times undilated
    (``time_s_undilated``) and the fidelity judged from the samples (``fidelity``); say in one
    line where the run fell outside the tolerance."""
    path = out_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else None
    window = (summary or {}).get("loop_unix_s")
    compute = ((summary or {}).get("scale_model") or {}).get("compute")  # the driver's probe
    undilated = scale.undilated((summary or {}).get("time_s") or {}, net.tdf)
    step_s = undilated.get("step_median")  # undilated, as the probe's times are
    fidelity = scale.judge(samples, net.model, queue_rates(net), window, compute, step_s)
    if summary is not None:
        summary["scale_model"] = {
            **net.model.as_dict(),
            "compute": compute,
            "cpus_kept_awake": bool(net.awake and net.awake.held),
            "hosts_used": fidelity.pop("hosts"),
        }
        summary["time_s_undilated"] = undilated
        summary["fidelity"] = fidelity
        text = json.dumps(summary, indent=2, default=str) + "\n"  # as the driver wrote it
        files.replace(path, lambda f: f.write(text))
    if not fidelity["ok"]:
        print(
            f"warning: outside the scale model's fidelity: {'; '.join(fidelity['problems'])}",
            file=sys.stderr,
        )


#: The kernel's UDP counters (``/proc/net/snmp``) that say a datagram was lost in a host.
UDP_COUNTERS = ("InDatagrams", "InErrors", "RcvbufErrors", "SndbufErrors")
#: The kernel's TCP counters that say a segment was sent again (``/proc/net/snmp``'s ``Tcp:``
#: and ``/proc/net/netstat``'s ``TcpExt:``): every retransmission, and those after a
#: retransmission timeout (the kernel's 200 ms at least, which the scale model cannot dilate).
TCP_COUNTERS = {"Tcp:": ("RetransSegs",), "TcpExt:": ("TCPTimeouts",)}


def loss_counters(namespaces: Mapping[str, str]) -> dict:
    """The kernel's own loss counters now, by host name: each namespace's UDP counters, its TCP
    retransmissions and timeouts (:data:`TCP_COUNTERS`) and the drops of each of its queues
    (``tc -s qdisc``: ``{"qdisc_dropped": {dev: n}}``)."""
    script = "cat /proc/net/snmp /proc/net/netstat; echo ---; tc -s qdisc show"
    out = {}
    for name, ns in namespaces.items():
        text = subprocess.run(
            ["ip", "netns", "exec", ns, "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        snmp, _, qdiscs = text.partition("---")
        tcp = {
            k: v
            for row, names in TCP_COUNTERS.items()
            for k, v in _counters(snmp, row, names).items()
        }
        out[name] = {
            **_counters(snmp, "Udp:", UDP_COUNTERS),
            **tcp,
            "qdisc_dropped": _qdisc_drops(qdiscs),
        }
    return out


def link_counters(namespaces: Mapping[str, str], queues: Mapping[str, str]) -> dict[str, int]:
    """The bytes each shaped link has passed so far, by name: the hub's queues (``queues``:
    name -> device, as :func:`hub_queues` names them: what each host receives, the bus, the
    uplinks both ways) and what each host sends (``"w0 out"``: its own link's queue)."""
    hub = _root_queues(namespaces["hub"])
    out = {name: int(hub.get(dev, {}).get("bytes", 0)) for name, dev in queues.items()}
    for name, ns in namespaces.items():
        if name != "hub":
            out[f"{name} out"] = int(_root_queues(ns).get("eth0", {}).get("bytes", 0))
    return out


def _root_queues(ns: str) -> dict[str, dict]:
    """The root queue of each device of namespace ``ns``, with its counters (``tc -s -j``)."""
    text = subprocess.run(
        ["tc", "-n", ns, "-s", "-j", "qdisc", "show"], capture_output=True, text=True, timeout=30
    ).stdout
    return {q.get("dev"): q for q in json.loads(text or "[]") if q.get("root")}


def _counters(text: str, row: str, names) -> dict[str, int]:
    """The counters ``names`` of the kernel's table ``row`` (``Udp:``, ``Tcp:``, ``TcpExt:``:
    a line of names, then a line of values) in ``text``.

    >>> text = "Tcp: A RetransSegs\\nTcp: 1 7\\nUdp: InErrors\\nUdp: 2"
    >>> _counters(text, "Tcp:", ["RetransSegs"]), _counters(text, "TcpExt:", ["TCPTimeouts"])
    ({'RetransSegs': 7}, {})
    """
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith(row)]
    if len(rows) < 2:
        return {}
    values = dict(zip(rows[0], rows[1], strict=False))
    return {k: int(values[k]) for k in names if k in values}


def _qdisc_drops(text: str) -> dict[str, int]:
    drops, dev = {}, None
    for line in text.splitlines():
        if line.startswith("qdisc "):
            words = line.split()  # qdisc KIND HANDLE: dev DEV ...
            dev = f"{words[words.index('dev') + 1]} {words[1]}" if "dev" in words else None
        elif dev and "dropped" in line:
            drops[dev] = int(line.split("dropped", 1)[1].split(",")[0])
    return drops


def loss_delta(before: Mapping, after: Mapping) -> dict:
    """What the counters of :func:`loss_counters` rose by, only where they rose (and the
    datagrams received, for scale)."""
    out = {}
    for name, now in after.items():
        was = before.get(name, {})
        rose = {k: v - was.get(k, 0) for k, v in now.items() if k != "qdisc_dropped"}
        rose = {k: v for k, v in rose.items() if v or k == "InDatagrams"}
        qd = {
            dev: n - was.get("qdisc_dropped", {}).get(dev, 0)
            for dev, n in now["qdisc_dropped"].items()
        }
        if any(qd.values()):
            rose["qdisc_dropped"] = {dev: n for dev, n in qd.items() if n}
        out[name] = rose
    return out


def wait_interruptibly(proc: subprocess.Popen, timeout: float | None = None) -> int:
    """``proc.wait(timeout)`` that Ctrl-C always ends. A main thread blocked in ``waitpid``
    is woken only by a signal the kernel hands to that thread, and it may hand a process's
    signal to any of its threads (torch's among them): the Ctrl-C was then held until the child
    ended, which for a long run was never. This waits in short slices, so the handler runs."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
        try:
            return proc.wait(timeout=max(left, 0.0))
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise


def wire_probe(hosts: list[Mapping]):
    """A callable giving each worker interface's ``tx_bytes`` now (the wire counters)."""
    parsed = [Host(h["name"], h["ns"], "", h["ifname"], 0.0) for h in hosts]
    return lambda: [tx_bytes(h) for h in parsed]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dcoded.netem")
    sub = parser.add_subparsers(dest="command", required=True)
    clean = sub.add_parser("cleanup", help="remove namespaces and processes left by a killed run")
    clean.add_argument(
        "--force", action="store_true", help="also those of a run whose process still runs"
    )
    sub.add_parser("list", help="list the namespaces of netem runs")
    args = parser.parse_args(argv)
    if args.command == "list":
        names = stale_namespaces()
        print("\n".join(f"{ns}{'  (live)' if builder(ns) else ''}" for ns in names) or "none")
        return 0
    gone, spared = cleanup(args.force)
    print(f"removed {len(gone)} namespace(s)" + (": " + ", ".join(gone) if gone else ""))
    if spared:
        runs = ", ".join(map(str, sorted({builder(ns) for ns in spared} - {None})))
        print(
            f"left {len(spared)} namespace(s) of live runs alone (process {runs}): "
            "--force removes them too"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
