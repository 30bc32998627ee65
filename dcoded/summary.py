"""The run's summary: ``summary.json`` (what a run measured beside the closed forms, and
where it ran), ``history.csv`` and ``theta.npy``, and the short table printed at the end.

``docs/measurement.md`` defines the numbers of ``summary.json`` (``docs/running.md`` lists what
else it holds); :mod:`dcoded.results` reads them back for sweeps.
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Mapping
from pathlib import Path

import dask
import distributed
import numpy as np
import torch

from dcoded import files
from dcoded.cluster import available_cores
from dcoded.coding import loads
from dcoded.coding.stragglers import backup_bound
from dcoded.engine.replica import param_sha256
from dcoded.engine.spec import RunSpec
from dcoded.provenance import code_version
from dcoded.results import PHASES, run_name, times
from dcoded.topology import link_report


def theory(spec: RunSpec, d: int) -> dict:
    """Closed-form bytes per worker per step (:mod:`dcoded.coding.loads`) for the gradient
    exchange and the parameter distribution."""
    K = spec.n_workers
    if spec.algorithm in ("cdc", "serial"):
        exchange = loads.shuffle(
            K, spec.redundancy, spec.group_size, spec.shuffle, hybrid_m=spec.hybrid_m
        )
        params = 0.0 if spec.replicated else loads.allgather(spec.placement.g).unicast
    elif spec.algorithm == "ddp":
        exchange, params = loads.ring_allreduce(K), 0.0
    else:
        exchange, down = loads.parameter_server(K)
        params = down.unicast
    b = exchange.bytes(d)
    return {"multicast": b.multicast, "unicast": b.unicast, "params": params * d * 4}


def step_spread(rows: list[dict]) -> dict[str, float | None]:
    """The mean and the 25th, 75th and 95th percentiles of the step time over the steps
    (linear interpolation, numpy's default), beside the median: a tail a median hides.

    >>> step_spread([{"step": s, "step_s": s / 10} for s in range(11)])["step_p95"]
    0.95
    """
    steps = [r["step_s"] for r in rows if r.get("step_s") is not None and r.get("step", 0) >= 0]
    if not steps:
        return dict.fromkeys(("step_mean", "step_p25", "step_p75", "step_p95"))
    q = np.percentile(steps, [25, 75, 95])
    return {
        "step_mean": float(np.mean(steps)),
        "step_p25": float(q[0]),
        "step_p75": float(q[1]),
        "step_p95": float(q[2]),
    }


def _theory_backup(spec: RunSpec, log, d: int, n_steps: int) -> float:
    """Bytes per worker per step of plain values the closed form allows for the steps that
    did not wait (each late worker having computed and sent nothing), mean over steps."""
    p = spec.placement
    total = 0.0
    for late, steps in log.late_sets.items():
        for c in range(p.n_clusters):
            here = {p.local(r) for r in late if p.cluster_of(r) == c}
            if here:
                total += steps * float(backup_bound(p, spec.shuffle, spec.hybrid, here))
    return total * d * 4 / spec.n_workers / max(n_steps, 1)


def make_summary(
    spec,
    reference,
    log,
    rows,
    theta,
    cluster_info,
    started,
    status: str = "finished",
    began: float | None = None,
) -> dict:
    """The run's ``summary.json``; ``status`` is ``finished`` or ``interrupted`` (then
    ``theta`` is ``None``: the parameters stayed on the workers, the checkpoint has them).
    ``began``: :func:`time.perf_counter` when the run began, for ``time_s.process`` (the
    run's whole time: start-up, setup, evaluation, checkpoints and the end included)."""
    d = reference.n_params
    last = rows[-1] if rows else {}
    placed = spec.algorithm in ("cdc", "serial")
    stale = [r["staleness_mean"] for r in rows if r.get("staleness_mean") is not None]
    summary = {
        "status": status,
        **_layout(spec),
        "batch_size": spec.batch_size,
        "steps": spec.steps,
        "steps_done": last["step"] + 1 if rows else 0,
        "seed": spec.seed,
        "n_params": d,
        "final": {
            "test_accuracy": last.get("test_accuracy"),
            "test_loss": last.get("test_loss"),
            "train_loss": last.get("train_loss"),
        },
        "time_s": _time_s(log, rows, began),
        "bytes_per_worker": _bytes(spec, log, rows, d),
        "param_sha256": param_sha256(theta) if theta is not None else None,
        "staleness_mean": float(np.mean(stale)) if stale else None,
        "repaired_datagrams": log.repairs["sent_again"] if spec.transport == "multicast" else None,
        "repairs": dict(log.repairs) if spec.transport == "multicast" else None,
        "kernel_losses": log.kernel_losses,
        "pace_mbit": dict(spec.pace_mbit) if spec.pace_mbit else None,
        "stragglers": spec.stragglers if spec.algorithm == "cdc" else None,
        "straggler_grace": spec.straggler_grace if spec.stragglers else None,
        "straggle": {**dict(spec.straggle), **log.straggle_summary()},
        "start_step": rows[0]["step"] if rows else 0,
        "events": list(log.events) + _late(log),
        "recoveries": list(log.recoveries),
        "peak_memory": _peak_memory(log, cluster_info),
        "environment": _environment(spec, cluster_info),
        "started": started.isoformat(timespec="seconds"),
        "loop_unix_s": getattr(log, "loop_unix_s", None),
        "dcoded": code_version(),
        # the whole composed config, resolved: what the run was, however it was started
        "config": spec.extra.get("config"),
        "n_sub_batches": math.comb(spec.placement.g, spec.redundancy) if placed else None,
    }
    # the emulated network: each link's bytes a step beside the bound's, the busiest
    summary["links"] = link_report(summary, log.link_bytes, len(rows))
    if log.compute_speed:  # the scale model's: the emulated network completes the block
        summary["scale_model"] = {"compute": log.compute_speed}
    return summary


def _time_s(log, rows: list[dict], began: float | None) -> dict:
    """``time_s``: the training loop's time and the run's whole time (from ``began`` on), the
    step's median and spread, each phase's median."""
    last = rows[-1] if rows else {}
    times = log.time_medians(rows)
    return {
        "total": last.get("wall_s", 0.0),
        "process": round(time.perf_counter() - began, 3) if began is not None else None,
        "step_median": times["step"],
        **step_spread(rows),
        **{p: times[p] for p in PHASES},
    }


def _layout(spec: RunSpec) -> dict:
    """What ran: the algorithm and its layout (``None`` where it has none), model and data."""
    placed = spec.algorithm in ("cdc", "serial")
    return {
        "algorithm": spec.algorithm,
        "n_workers": spec.n_workers,
        "redundancy": spec.redundancy if placed else None,
        "group_size": spec.placement.g if placed else None,
        "shuffle": spec.shuffle if placed else None,
        "hybrid_m": spec.hybrid_m if placed else None,
        "hybrid": spec.hybrid.summary() if placed and spec.hybrid else None,
        "transport": spec.transport if spec.algorithm == "cdc" else None,
        "bucket_cap_mb": spec.bucket_cap_mb if spec.algorithm == "ddp" else None,
        "model": spec.model["name"],
        "dataset": spec.dataset["name"],
        "evaluated_on": "validation" if spec.dataset.get("validation") else "test",
    }


def _bytes(spec: RunSpec, log, rows: list[dict], d: int) -> dict:
    """``bytes_per_worker``: what moved per worker per step, beside the closed forms."""
    means = log.bytes_means(rows, exchanged=spec.algorithm != "serial")
    if spec.algorithm == "ddp":  # gloo's packets are not visible: the buckets are (and wire)
        means.update(multicast=None, unicast=None, params=None)
    if spec.algorithm != "cdc":  # only cdc has a choice of transport
        means.update(direct=None)
    th = theory(spec, d)
    cdc = spec.algorithm == "cdc"
    return {
        "multicast": means["multicast"],
        "unicast": means["unicast"],
        "theory_multicast": th["multicast"],
        "theory_unicast": th["unicast"],
        "params": means["params"],
        "theory_params": th["params"],
        "dask_transfer": means["dask"],
        "allreduced": (log.allreduced / spec.n_workers / max(len(rows), 1))
        if spec.algorithm == "ddp"
        else None,
        "dask_transfer_by_kind": log.by_kind_means(len(rows)) if rows else {},
        # what the run's transport moved: Dask transfers, or the direct links' messages
        "transport": means["dask" if spec.transport == "dask" else "direct"] if cdc else None,
        "transport_by_kind": log.by_kind_means(len(rows), spec.transport) if rows and cdc else {},
        # coding.stragglers: the plain values sent in place of what late workers did not
        # send, and the closed form's most for the steps that did not wait (per worker)
        "backup": log.by_kind_means(len(rows), "direct").get("backup", 0.0)
        if rows and spec.stragglers
        else None,
        "theory_backup": _theory_backup(spec, log, d, len(rows)) if spec.stragglers else None,
        "wire": (sum(log.wire) / len(log.wire) / max(len(rows), 1)) if log.wire else None,
        "wire_note": "all bytes the worker interfaces sent in the training loop, Dask "
        "control traffic and evaluation included (after a recovery: its last attempt's)"
        if log.wire
        else None,
    }


def _peak_memory(log, cluster_info: dict) -> dict | None:
    """Each worker's peak resident memory in this run, in bytes (its process's ``VmHWM``,
    started afresh at the run's first replica there), by rank (a worker that joined later: by
    address), and the largest; ``None`` where no worker said (``serial``, a system without
    ``/proc``). Workers that are threads of one process (``processes=false``) share its peak."""
    if not log.peak_rss:
        return None
    workers = list(cluster_info.get("workers") or [])
    per_worker = {
        str(workers.index(w)) if w in workers else str(w): b for w, b in log.peak_rss.items()
    }
    return {"per_worker": per_worker, "max_bytes": max(log.peak_rss.values())}


def _environment(spec: RunSpec, cluster_info: dict) -> dict:
    """Where it ran: the cores, the cluster (and its emulated network), its workers, the
    versions."""
    return {
        "cores": available_cores(),
        "torch_threads": spec.torch_threads,
        "cluster": cluster_info["kind"],
        **({"netem": cluster_info["netem"]} if "netem" in cluster_info else {}),
        # the emulated network's worker hosts' addresses, w0's first (a rank's host by its IP)
        **({"worker_ips": cluster_info["worker_ips"]} if "worker_ips" in cluster_info else {}),
        "workers": cluster_info["workers"],
        "per_worker": cluster_info.get("per_worker", {}),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "numpy": np.__version__,
    }


def _links_line(links: Mapping | None) -> list[str]:
    """The busiest link's bytes a step beside the bound's busiest, and all links' total.

    >>> _links_line({"busiest": {"measured": {"link": "rack0 up", "bytes": 1.2e6},
    ...                          "bound": {"link": "rack1 up", "bytes": 1.1e6}},
    ...              "total": {"measured": 9.8e6, "bound": 8.7e6}})
    ['  busiest link: rack0 up, 1,200,000 B a step (bound: rack1 up, 1,100,000 B); all links sent 9,800,000 B (bound 8,700,000 B)']
    """  # noqa: E501
    if not links:
        return []
    seen, bound = links["busiest"]["measured"], links["busiest"]["bound"]
    total = links["total"]
    return [
        f"  busiest link: {seen['link']}, {seen['bytes']:,.0f} B a step (bound: {bound['link']}, "
        f"{bound['bytes']:,.0f} B); all links sent {total['measured']:,.0f} B "
        f"(bound {total['bound']:,.0f} B)"
    ]


def _late(log) -> list[str]:
    """The event that some records came after their step's row was written, if any did."""
    if not log.late_records:
        return []
    return [
        f"{log.late_records} worker record(s) came after their step's row was written to "
        "history.csv and are not in it"
    ]


def write_outputs(out_dir: Path, summary: dict, theta: np.ndarray) -> None:
    """``summary.json`` and the final parameters ``theta.npy`` (float32), each written to a
    temporary name then renamed (``history.csv`` is written as the run goes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files.replace(out_dir / "theta.npy", lambda f: np.save(f, np.asarray(theta, "<f4")), "wb")
    write_summary(out_dir, summary)


def write_summary(out_dir: Path, summary: dict) -> None:
    """``summary.json``, written to a temporary name then renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(summary, indent=2, default=str) + "\n"  # a user's own values too
    files.replace(out_dir / "summary.json", lambda f: f.write(text))


def _resources(env: Mapping) -> str:
    """What the workers ran on, as they reported it (the driver's cores where they did not).

    >>> _resources({"cores": 2, "torch_threads": 1, "per_worker": {}})
    '2 cores, 1 torch thread'
    >>> _resources({"cores": 2, "torch_threads": 1, "per_worker": {
    ...     "a": {"host": "n1", "cores": 2, "threads": 1}}})
    '2 cores, per worker: 1 Dask thread, 1 torch thread'
    >>> _resources({"cores": 2, "torch_threads": 1, "per_worker": {
    ...     "a": {"host": "n1", "cores": 8, "threads": 1},
    ...     "b": {"host": "n2", "cores": 16, "threads": 4}}})
    '2 hosts of 8/16 cores, per worker: 1/4 Dask threads, 1 torch thread'
    """
    torch_threads = f"{env['torch_threads']} torch thread{'s' * (env['torch_threads'] > 1)}"
    per = list(env.get("per_worker", {}).values())
    if not per:  # serial: no workers
        return f"{env['cores']} cores, {torch_threads}"
    cores = {f["host"]: f["cores"] for f in per}
    where = "/".join(str(n) for n in sorted(set(cores.values())))
    if len(cores) > 1:
        where = f"{len(cores)} hosts of {where}"
    threads = sorted({f["threads"] for f in per})
    dask_threads = f"{'/'.join(map(str, threads))} Dask thread{'s' * (threads[-1] > 1)}"
    return f"{where} cores, per worker: {dask_threads}, {torch_threads}"


def _times(t: Mapping) -> str:
    """The training loop's time beside the run's whole time, each named.

    >>> _times({"total": 35.93, "process": 61.2})
    'training loop 35.93 s of 61.20 s in all'
    >>> _times({"total": 1.5})
    'training loop 1.50 s'
    """
    whole = t.get("process")
    return f"training loop {t['total']:.2f} s" + (f" of {whole:.2f} s in all" if whole else "")


#: The phases of a step each algorithm has, as the console shows them (``summary.json`` keeps
#: every phase, 0 where an algorithm has none): the parameter server's no coding, DDP's no
#: encode, decode nor parameters (its all-reduce leaves every rank with the update), serial's
#: no exchange.
ALGORITHM_PHASES = {
    "cdc": PHASES,
    "ssgd": ("map", "shuffle", "update", "params"),
    "asgd": ("map", "shuffle", "update", "params"),
    "ddp": ("map", "shuffle", "update"),
    "serial": ("map", "update"),
}


def format_results(summary: dict) -> str:
    """The short results table printed at the end of a run: the phases and the byte rows of
    its algorithm (:data:`ALGORITHM_PHASES`)."""
    t, f = times(summary), summary["final"]
    head = run_name(summary, sep="  ")
    head += (
        f"  {summary['model']} on {summary['dataset']} (d={summary['n_params']:,})"
        f"  {summary['steps']} steps x B={summary['batch_size']}"
        f"  [{_resources(summary['environment'])}]"
    )

    def ms(x):
        return f"{1e3 * x:8.2f}"

    sha = summary["param_sha256"]

    def x4(x):  # an interrupted run may not have evaluated
        return "-" if x is None else f"{x:.4f}"

    if summary.get("status", "finished") != "finished":
        head += f"  ({summary['status']} after step {summary['steps_done']})"
    ddp = summary["algorithm"] == "ddp"
    lines = [
        head,
        f"  test accuracy {x4(f['test_accuracy'])}   test loss {x4(f['test_loss'])}   "
        f"train loss {x4(f['train_loss'])}   {_times(t)}",
        *_happened(summary),
        "  time per step, median ms"
        + (" (shuffle: the all-reduce, inside map's backward):" if ddp else ":"),
        "    "
        + "  ".join(
            f"{k} {ms(t[k]).strip()}"
            for k in ("step_median", *ALGORITHM_PHASES.get(summary["algorithm"], PHASES))
        ),
        *_bytes_lines(summary),
        f"  param_sha256 {sha[:16] + '…' if sha else '- (the run did not finish)'}",
    ]
    return "\n".join(lines)


def _bytes_lines(summary: dict) -> list[str]:
    """The results table's bytes per worker per step, measured beside the closed forms: the
    rows of what the algorithm moves (a multicast only where cdc's coded packets could go as
    one; none for serial, which exchanges nothing)."""
    b = summary["bytes_per_worker"]

    def nb(x):
        return f"{'-':>12}" if x is None else f"{x:12,.0f}"

    if summary["algorithm"] == "serial":
        return ["  bytes per worker per step: none (algorithm=serial: one process, no exchange)"]
    if summary["algorithm"] == "ddp":
        # gloo's ring is not seen packet by packet: the buckets handed to it are
        exchange = [
            f"    all-reduce buckets (gloo)    {nb(b.get('allreduced'))} "
            f"{nb(4.0 * summary['n_params'])}",
            f"    ring all-reduce, sent        {nb(None)} {nb(b['theory_unicast'])}",
        ]
    else:
        exchange = [
            f"    gradient exchange, unicast   {nb(b['unicast'])} {nb(b['theory_unicast'])}",
            f"    parameters                   {nb(b['params'])} {nb(b['theory_params'])}",
        ]
        if summary["algorithm"] == "cdc":  # a parameter server's gradients go to one server
            multicast = f"{nb(b['multicast'])} {nb(b['theory_multicast'])}"
            exchange.insert(0, f"    gradient exchange, multicast {multicast}")
    return [
        "  bytes per worker per step:      measured       theory",
        *exchange,
        f"    Dask transfers (all)         {nb(b['dask_transfer'])}",
        *(
            [f"    moved by the transport       {nb(b['transport'])}"]
            if summary.get("transport") in ("direct", "multicast")
            else []
        ),
        *(
            [f"    on the wire (every packet)   {nb(b['wire'])}"]
            if b.get("wire") is not None
            else []
        ),
        *(
            [f"    plain values for stragglers  {nb(b['backup'])} {nb(b['theory_backup'])} (most)"]
            if b.get("backup") is not None
            else []
        ),
    ]


def _scale_line(summary: Mapping) -> list[str]:
    """The scale model's lines: its hosts, quotas and TDF, whether the run kept fidelity, and
    the compute-speed probe's raise of the quotas.

    >>> _scale_line({"scale_model": {"hosts": 6, "host_cores": 1.0, "quota_cores": 0.2,
    ...     "tdf": 5.0}, "fidelity": {"ok": True}})  # doctest: +NORMALIZE_WHITESPACE
    ['  scale model: 6 hosts of 1 core, each 0.200 of a core here, dilated 5.00x (times
      undilated); fidelity held']
    >>> probe = {"samples": 40, "speed": 0.8, "quota_us_in_force": 2500}
    >>> _scale_line({"scale_model": {"hosts": 6, "host_cores": 1.0, "quota_cores": 0.2,
    ...     "tdf": 5.0, "quota_us": 2000, "compute": probe}, "fidelity": {"ok": True}})[1]
    '    throttled, a gradient of 40 samples ran at 0.80 of its speed: each quota raised to 0.250 of a core'
    """  # noqa: E501
    m = summary.get("scale_model")
    if not m:
        return []
    fid = summary.get("fidelity") or {}
    held = (
        "fidelity held"
        if fid.get("ok")
        else "OUTSIDE fidelity: " + "; ".join(fid.get("problems") or ["not checked"])
    )
    lines = [
        f"  scale model: {m['hosts']} hosts of {m['host_cores']:g} core"
        f"{'s' * (m['host_cores'] != 1)}, each {m['quota_cores']:.3f} of a core here, dilated "
        f"{m['tdf']:.2f}x (times undilated); {held}"
    ]
    compute = m.get("compute")
    if compute and m.get("quota_us"):
        force = m["quota_cores"] * compute["quota_us_in_force"] / m["quota_us"]
        lines.append(
            f"    throttled, a gradient of {compute['samples']} samples ran at "
            f"{compute['speed']:.2f} of its speed: each quota raised to {force:.3f} of a core"
        )
    return lines


def _stragglers_line(summary: Mapping) -> list[str]:
    """The line of the stragglers, where the run injected some or did not wait for some:
    how many of the steps it ran each slowed, and the steps that did not wait, by rank."""
    st = summary.get("straggle") or {}
    said = []
    ran = summary.get("steps_done", summary["steps"]) - summary.get("start_step", 0)
    if st.get("model") == "slow" and st.get("throttles"):
        said.append(_slow_phrase(st["throttles"], ran))
    elif st.get("model") not in (None, "none"):
        said.append(f"straggle={st['model']} on {st.get('steps_with_injection', 0)} of "
                    f"{ran} steps")  # fmt: skip
    if st.get("steps_not_waiting"):
        ranks = ", ".join(f"rank {k}: {v}" for k, v in (st.get("not_waited") or {}).items())
        n = st["steps_not_waiting"]
        said.append(f"{n} step{'s' * (n != 1)} did not wait ({ranks})")
    return [f"  stragglers: {'; '.join(said)}"] if said else []


def _slow_phrase(throttles: Mapping, ran: int) -> str:
    """``straggle=slow``: each slow rank, how it was slowed, and on how many of the ``ran``
    steps (a CPU quota holds on every step; the fallback's delay, where it was slept).

    >>> _slow_phrase({"1": {"how": "cgroup", "speed": 0.33, "quota_us": 1650,
    ...     "period_us": 10000, "steps": 20}}, 20)
    'straggle=slow: rank 1 at 0.33 of its share of the cores, a CPU quota of 1650 us per 10000 us (0.165 of a core), on every step'
    >>> _slow_phrase({"2": {"how": "delay", "speed": 0.5, "steps": 7}}, 8)
    'straggle=slow: rank 2 at 0.5 of its share of the cores, a delay after each computation, on 7 of 8 steps'
    >>> t = {"how": "cgroup", "speed": 0.5, "quota_us": 2500, "period_us": 10000, "steps": 9}
    >>> _slow_phrase({"0": t, "3": t}, 9)
    'straggle=slow: ranks 0, 3 at 0.5 of their share of the cores, a CPU quota of 2500 us per 10000 us (0.250 of a core) each, on every step'
    """  # noqa: E501
    alike: dict[tuple, list[str]] = {}  # the same slowdown: one phrase for its ranks
    for rank, t in throttles.items():
        if t["how"] == "cgroup" and t.get("period_us"):
            how = (
                f"a CPU quota of {t['quota_us']} us per {t['period_us']} us "
                f"({t['quota_us'] / t['period_us']:.3f} of a core)"
            )
        else:
            how = "a delay after each computation"
        steps = t.get("steps", 0)
        when = "every step" if ran and steps >= ran else f"{steps} of {ran} steps"
        alike.setdefault((f"{t['speed']:g}", how, when), []).append(str(rank))
    said = []
    for (speed, how, when), ranks in alike.items():
        many = len(ranks) > 1
        said.append(
            f"rank{'s' * many} {', '.join(ranks)} at {speed} of {'their' if many else 'its'} "
            f"share of the cores, {how}{' each' * many}, on {when}"
        )
    return "straggle=slow: " + "; ".join(said)


#: How a run's cluster is named on the console (``environment.cluster``).
CLUSTER_NAMES = {
    "local": "cluster=local",
    "address": "cluster=address",
    "client": "run(client=...)",
}


def _network_line(env: Mapping | None) -> list[str]:
    """The line that says what carried the workers' messages where no network was emulated,
    from their addresses: memory (in-process workers), this machine's loopback, or a real
    network between hosts, which dcoded neither shapes nor knows the rate of.

    >>> _network_line({"cluster": "local", "workers": ["tcp://127.0.0.1:4000"]})
    ['  network: loopback (cluster=local: every worker on this machine; no link emulated)']
    >>> _network_line({"cluster": "address", "workers": ["tcp://10.0.0.5:40", "tcp://10.0.0.6:40"],
    ...     "per_worker": {"tcp://10.0.0.5:40": {"host": "a"}, "tcp://10.0.0.6:40": {"host": "b"}}})
    ['  network: real, 2 hosts (cluster=address: not emulated; its rate is not known here)']
    >>> _network_line({"cluster": "none", "workers": []})  # serial: no workers
    []
    """
    from urllib.parse import urlsplit

    workers = list((env or {}).get("workers") or [])
    if not workers:
        return []
    cluster = CLUSTER_NAMES.get(env.get("cluster"), f"cluster={env.get('cluster')}")
    if all(w.startswith("inproc://") for w in workers):
        return [f"  network: none, in-process workers ({cluster}, processes=false: in memory)"]
    hosts = [urlsplit(w).hostname or "" for w in workers]
    if all(h == "localhost" or h == "::1" or h.startswith("127.") for h in hosts):
        return [f"  network: loopback ({cluster}: every worker on this machine; no link emulated)"]
    per = (env.get("per_worker") or {}).values()
    machines = len({f.get("host") for f in per}) or len(set(hosts))
    hosts_n = f"{machines} host{'s' * (machines != 1)}"
    return [f"  network: real, {hosts_n} ({cluster}: not emulated; its rate is not known here)"]


def _happened(summary: Mapping) -> list[str]:
    """A line each for what shaped the run, where it happened: the emulated network, the
    stragglers (injected, and the steps that did not wait), recoveries, multicast repairs.

    >>> _happened({"environment": {"netem": {"topology": "bus", "bandwidth_mbit": 100.0,
    ...     "driver_bandwidth_mbit": 100.0, "queue_ms": 20.0}}, "steps": 100,
    ...     "straggle": {"model": "stall", "steps_with_injection": 9, "steps_not_waiting": 22,
    ...                  "not_waited": {"1": 12, "3": 10}},
    ...     "recoveries": [{"lost": [{"worker": "tcp://w2", "rank": 2}], "at_step": 55,
    ...                     "resumed_from": 40, "steps_replayed": 15, "replaced": 1}],
    ...     "repairs": {"sent": 5120, "sent_again": 31, "asks": 12}})  # doctest: +NORMALIZE_WHITESPACE
    ['  network: emulated, bus at 100 Mbit/s, queues of 20 ms',
     '  stragglers: straggle=stall on 9 of 100 steps; 22 steps did not wait (rank 1: 12, rank 3: 10)',
     '  recovery: rank 2 lost at step 55, went on from step 40 (15 steps again, 1 new worker)',
     '  repairs: 31 datagrams sent again of 5120, 12 asks']
    """  # noqa: E501
    out = []
    net = (summary.get("environment") or {}).get("netem")
    if net:
        where = f"{net['topology']} at {net['bandwidth_mbit']:g} Mbit/s"
        if net.get("driver_bandwidth_mbit") not in (None, net["bandwidth_mbit"]):
            where += f" (driver {net['driver_bandwidth_mbit']:g})"
        if net.get("rack_size"):
            where += f", racks of {net['rack_size']}, uplinks {net['uplink_mbit']:g} Mbit/s"
        if net.get("pod_racks"):
            where += (
                f", pods of {net['pod_racks']} racks, uplinks {net['pod_uplink_mbit']:g} Mbit/s"
            )
        out.append(f"  network: emulated, {where}, queues of {net['queue_ms']:g} ms")
        out += _links_line(summary.get("links"))
    else:
        out += _network_line(summary.get("environment"))
    out += _scale_line(summary)
    out += _stragglers_line(summary)
    for ev in summary.get("recoveries") or []:
        lost = ", ".join(f"rank {w['rank']}" for w in ev.get("lost", []))
        out.append(
            f"  recovery: {lost} lost at step {ev['at_step']}, went on from step "
            f"{ev['resumed_from']} ({ev['steps_replayed']} steps again, {ev['replaced']} new "
            f"worker{'s' * (ev['replaced'] != 1)})"
        )
    repairs = summary.get("repairs") or {}
    if any(v for k, v in repairs.items() if k != "sent"):
        of = f" of {repairs['sent']}" if repairs.get("sent") else ""
        out.append(
            f"  repairs: {repairs.get('sent_again', 0)} datagrams sent again{of}, "
            f"{repairs.get('asks', 0)} asks"
        )
    return out
