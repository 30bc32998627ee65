"""The best coded r of a run's configuration, predicted before anything runs.

Of the coded layouts ``1 < r < g`` (``g`` the group size, or K; at ``r = K`` nothing is sent and
every worker computes the whole batch), the r whose step :func:`dcoded.predict.predict` predicts
least for cdc's coded shuffle on the run's network: its emulated links (``cluster=netem``), or
loopback where there are none, its model's size, its batch and transport, the workers sharing
this machine's cores. ``experiment=compare`` runs cdc there and its XOR-free control
(``coding.redundancy: ${dcoded_best_redundancy:}`` in ``conf/compare/``); :mod:`dcoded.compare`
says how it was chosen. The resolver is registered when this module is imported (by
:mod:`dcoded.config`, so wherever a config is composed or checked).

>>> best_of({2: 0.14, 3: 0.094, 4: "too many sub-batches"})
3
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping

from omegaconf import OmegaConf

from dcoded.cluster import available_cores
from dcoded.data import absolute_path
from dcoded.engine.replica import cached_dataset
from dcoded.errors import ConfigError
from dcoded.models import build_model
from dcoded.netem import loopback_reason
from dcoded.predict import ImpossibleLayout, Scenario, predict
from dcoded.topology import bucket_seconds

#: The resolver's name in a config: ``${dcoded_best_redundancy:}``.
RESOLVER = "dcoded_best_redundancy"


def scenario(c: Mapping, n_params: int, redundancy: int, emulated: bool, cores: int | None):
    """The :class:`dcoded.predict.Scenario` of cdc's coded shuffle at ``redundancy`` in the
    run that config ``c`` describes: its links where ``emulated`` (else loopback: no link to
    wait for, multicast as TCP), ``n_params`` values, the workers sharing ``cores``."""
    cluster = c["cluster"]
    K = int(cluster["n_workers"])
    transport = (c.get("transport") or {}).get("name") or "direct"
    if transport == "multicast" and not emulated:  # loopback has no IP multicast: TCP
        transport = "direct"
    rate = float(cluster["bandwidth_mbit"]) if emulated else math.inf
    group = (c.get("coding") or {}).get("group_size")
    net = {}
    if emulated:
        net = {
            k: cluster.get(k)
            for k in ("topology", "rack_size", "uplink_mbit", "pod_racks", "pod_uplink_mbit")
        }
        net["driver_rate_mbit"] = cluster.get("driver_bandwidth_mbit")
        net["bucket_s"] = bucket_seconds(rate)
    return Scenario(
        algorithm="cdc",
        n_workers=K,
        n_params=int(n_params),
        batch_size=int(c["train"]["batch_size"]),
        rate_mbit=rate,
        redundancy=redundancy,
        group_size=group if group not in (None, K) else None,
        shuffle="coded",
        transport=transport,
        model=c["model"]["name"],
        cores=None if cluster.get("scale_model") else cores,
        **{k: v for k, v in net.items() if v is not None},
    )


def coded_steps(
    c: Mapping, n_params: int, emulated: bool, cores: int | None
) -> dict[int, float | str]:
    """Per coded r (``1 < r < g``), the step (seconds) predicted for cdc's coded shuffle in
    the run ``c`` describes, or why the engine would refuse that layout."""
    K = int(c["cluster"]["n_workers"])
    g = (c.get("coding") or {}).get("group_size") or K
    out: dict[int, float | str] = {}
    for r in range(2, g):
        try:
            out[r] = predict(scenario(c, n_params, r, emulated, cores)).step_s
        except ImpossibleLayout as e:
            out[r] = str(e)
    return out


def best_of(steps: Mapping[int, float | str]) -> int | None:
    """The r of least predicted step (the least r on a tie); ``None`` where none is possible."""
    possible = {r: t for r, t in steps.items() if not isinstance(t, str)}
    return min(possible, key=lambda r: (possible[r], r)) if possible else None


def best_redundancy(*, _root_) -> int:
    """``${dcoded_best_redundancy:}``: the best coded r of the config it is in, for its
    network as this machine will run it (loopback where ``cluster.fallback=local`` falls
    back)."""

    def plain(key):
        node = _root_.get(key)
        return OmegaConf.to_container(node, resolve=True) if node is not None else {}

    c = {k: plain(k) for k in ("cluster", "transport", "model", "dataset")}
    c["train"] = {"batch_size": _root_.train.batch_size}
    c["coding"] = {"group_size": _root_.coding.get("group_size")}
    cluster = c["cluster"]
    emulated = cluster.get("kind") == "netem" and loopback_reason(cluster) is None
    return _best(json.dumps(c, sort_keys=True), emulated, available_cores())


@functools.lru_cache(maxsize=64)
def _best(config: str, emulated: bool, cores: int) -> int:
    c = json.loads(config)
    steps = coded_steps(c, model_size(c), emulated, cores)
    best = best_of(steps)
    if best is None:
        K, g = c["cluster"]["n_workers"], c["coding"]["group_size"] or c["cluster"]["n_workers"]
        why = "; ".join(f"r={r}: {t}" for r, t in steps.items()) or f"no r with 1 < r < {g}"
        raise ConfigError(
            f"no coded layout to compare with K={K}, g={g} ({why}): experiment=compare needs "
            "a group of at least 3 workers (cluster.n_workers, coding.group_size)"
        )
    return best


def model_size(c: Mapping) -> int:
    """The number of parameters of ``c``'s model on ``c``'s dataset (loaded once a process)."""
    data = cached_dataset(absolute_path(c["dataset"]))
    model = build_model(c["model"], data.shape, data.n_classes, seed=0)
    return sum(p.numel() for p in model.parameters())


def register_resolver() -> None:
    """``${dcoded_best_redundancy:}`` (:func:`best_redundancy`), once a process."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, best_redundancy)


register_resolver()
