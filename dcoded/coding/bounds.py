"""What a set of messages costs on each emulated topology: bytes per link and the time bound.

A message is ``(sender, receivers, nbytes)`` between hosts ``0..n-1``. Sent by unicast, it
crosses the network once per receiver; sent by multicast, once, and the network copies it
where paths part. The bound of an exchange is the time its busiest shared resource needs at
its rate; no schedule can do better:

* ``switch`` (each host its own full-duplex link to one bridge): the larger of what the
  busiest host sends and what the busiest host receives;
* ``bus`` (one shared medium every frame crosses once): everything sent, multicast once;
* ``racks`` (hosts in racks of ``rack_size`` behind uplinks of ``uplink`` to a core): the
  switch bound of the hosts' own links, or the busiest uplink in either direction, whichever
  is larger (a multicast crosses a rack's uplink once, whatever number of receivers is there);
* ``fattree`` (two levels: racks behind uplinks of ``uplink``, racks in pods behind uplinks of
  ``pod_uplink`` to the core): the racks bound, or the busiest pod uplink, whichever is larger.

>>> msgs = [(0, [1, 2, 3], 100), (1, [0, 2, 3], 100)]
>>> seconds({"kind": "bus", "rate": 100.0}, link_bytes(msgs, 4, multicast=True))
2.0
>>> seconds({"kind": "switch", "rate": 100.0}, link_bytes(msgs, 4, multicast=False))
3.0
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

TOPOLOGIES = ("switch", "bus", "racks", "fattree")


def link_bytes(
    messages: Iterable[tuple[int, Sequence[int], float]],
    n_hosts: int,
    multicast: bool,
    rack_of: Sequence[int | None] | None = None,
    pod_of: Sequence[int | None] | None = None,
) -> dict[str, object]:
    """Bytes on every link: ``egress[h]``, ``ingress[h]``, ``medium`` (all that was sent,
    each copy once), with ``rack_of`` (host -> rack, ``None`` for a host on the core)
    ``up[rack]`` / ``down[rack]`` on the rack uplinks, and with ``pod_of`` (host -> pod)
    ``pod_up[pod]`` / ``pod_down[pod]`` on the pods' uplinks to the core.

    >>> loads = link_bytes([(0, [1, 2, 3], 10)], 4, True, rack_of=[0, 0, 1, 1], pod_of=[0, 0, 1, 1])
    >>> dict(loads["up"]), dict(loads["down"]), dict(loads["pod_up"]), dict(loads["pod_down"])
    ({0: 10.0}, {1: 10.0}, {0: 10.0}, {1: 10.0})
    """
    egress, ingress = [0.0] * n_hosts, [0.0] * n_hosts
    up: dict[int, float] = defaultdict(float)
    down: dict[int, float] = defaultdict(float)
    pod_up: dict[int, float] = defaultdict(float)
    pod_down: dict[int, float] = defaultdict(float)
    medium = 0.0
    for sender, receivers, nbytes in messages:
        copies = [list(receivers)] if multicast else [[r] for r in receivers]
        for targets in copies:
            egress[sender] += nbytes
            medium += nbytes
            for r in targets:
                ingress[r] += nbytes
            if rack_of is not None:
                home = rack_of[sender]
                away = {rack_of[r] for r in targets} - {home}
                if away and home is not None:
                    up[home] += nbytes
                for rack in away - {None}:
                    down[rack] += nbytes
            if pod_of is not None:
                home = pod_of[sender]
                away = {pod_of[r] for r in targets} - {home}
                if away and home is not None:
                    pod_up[home] += float(nbytes)
                for pod in away - {None}:
                    pod_down[pod] += float(nbytes)
    return {
        "egress": egress,
        "ingress": ingress,
        "medium": medium,
        "up": up,
        "down": down,
        "pod_up": pod_up,
        "pod_down": pod_down,
    }


def seconds(topology: Mapping, loads: Mapping) -> float:
    """The time bound of an exchange with these link loads on ``topology``: a mapping with
    ``kind``, ``rate`` (bytes/s of each host link, and of the bus), and for racks ``uplink``
    (bytes/s of each uplink, each way)."""
    kind, rate = topology["kind"], float(topology["rate"])
    hosts = max(max(loads["egress"], default=0.0), max(loads["ingress"], default=0.0)) / rate
    if kind == "switch":
        return hosts
    if kind == "bus":
        return max(hosts, loads["medium"] / rate)
    if kind in ("racks", "fattree"):
        uplink = float(topology["uplink"])
        busiest = max([*loads["up"].values(), *loads["down"].values(), 0.0])
        racks = max(hosts, busiest / uplink)
        if kind == "racks":
            return racks
        pods = max([*loads.get("pod_up", {}).values(), *loads.get("pod_down", {}).values(), 0.0])
        return max(racks, pods / float(topology["pod_uplink"]))
    raise ValueError(f"topology {kind!r} is not known: choose one of {TOPOLOGIES}")
