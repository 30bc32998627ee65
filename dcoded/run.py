"""``run(cfg) -> summary``: one training run from a config, usable with or without Hydra.

Everything that can be checked is checked before any cluster starts: the algorithm, the
layout ``(K, r, g)``, the batch against ``C(g, r)`` sub-batches, the dataset files, the model
against the data, the optimizer. The run writes ``summary.json`` and ``history.csv`` into its
output directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import math
import platform
import re
import signal
import sys
import tempfile
import types
import uuid
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import dask
import distributed
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dcoded.checkpoint import Checkpoint, slice_state
from dcoded.checkpoint import load as load_checkpoint
from dcoded.cluster import available_cores, check_cluster_config, open_cluster
from dcoded.coding import best_m, check_m, loads
from dcoded.data import DatasetError, absolute_path, check_dataset
from dcoded.engine.cdc import train_cdc
from dcoded.engine.ddp import train_ddp
from dcoded.engine.driving import Context, Progress
from dcoded.engine.ps import train_asgd, train_ssgd
from dcoded.engine.record import TrainingLog, write_history
from dcoded.engine.replica import Replica, param_sha256
from dcoded.engine.serial import train_serial
from dcoded.engine.spec import ALGORITHMS, SHUFFLES, TRANSPORTS, RunSpec
from dcoded.engine.tasks import step_messages
from dcoded.errors import ConfigError, RunError
from dcoded.interrupt import Interrupted, signal_name, sigterm_as_interrupt
from dcoded.models import MODELS
from dcoded.optim import SegmentOptimizer, check_optimizer
from dcoded.preflight import check_workers, thread_warning

TRAINERS = {
    "cdc": train_cdc,
    "serial": train_serial,
    "ssgd": train_ssgd,
    "asgd": train_asgd,
    "ddp": train_ddp,
}


_CONFIG_PREFIX = {
    "redundancy": "coding.",
    "hybrid_m": "coding.",
    "group_size": "coding.",
    "batch_size": "train.",
    "n_workers": "cluster.",
}


def config_names(message: str) -> str:
    """Name settings in ``dcoded.coding`` errors as the config does (``coding.redundancy=``)."""
    return re.sub(
        r"(?<![.\w])(redundancy|hybrid_m|group_size|batch_size|n_workers)=",
        lambda m: f"{_CONFIG_PREFIX[m[1]]}{m[1]}=",
        message,
    )


def _plain(cfg) -> dict:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)


def build_spec(cfg: Mapping) -> tuple[RunSpec, Replica, Checkpoint | None]:
    """Validate ``cfg`` and build the run's :class:`RunSpec` and the driver's own replica (the
    evaluator, and the serial/parameter-server model), and the checkpoint to resume from.
    Raises :class:`ConfigError`, :class:`~dcoded.data.DatasetError` or
    :class:`~dcoded.checkpoint.CheckpointError`; starts nothing."""
    c = _plain(cfg)
    algorithm = c.get("algorithm", {}).get("name")
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r} is not known: choose one of {ALGORITHMS}")
    train, coding, cluster = c.get("train", {}), c.get("coding", {}), c.get("cluster", {})
    n_workers = cluster.get("n_workers")
    try:
        check_cluster_config(cluster, n_workers)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    model = c.get("model", {})
    if model.get("name") not in MODELS:
        raise ConfigError(f"model={model.get('name')!r} is not known: choose one of {MODELS}")
    shuffle = coding.get("shuffle", "coded")
    if shuffle not in SHUFFLES:
        raise ConfigError(f"coding.shuffle={shuffle!r} is not allowed: choose one of {SHUFFLES}")
    transport_cfg = c.get("transport") or {}
    transport = transport_cfg.get("name", "dask")
    if transport not in TRANSPORTS:
        raise ConfigError(f"transport={transport!r} is not known: choose one of {TRANSPORTS}")
    notes = []
    if transport == "multicast" and algorithm == "cdc":
        transport, note = _multicast_or_fallback(cluster, transport_cfg)
        notes += [note] if note else []
    steps_per_task = transport_cfg.get("steps_per_task", 0)
    if not isinstance(steps_per_task, int) or steps_per_task < 0:
        raise ConfigError(
            f"transport.steps_per_task={steps_per_task!r} is not allowed: it must be an integer "
            ">= 0 (0: one task per worker until the next evaluation, checkpoint or record pull)"
        )
    batch = train.get("batch_size")
    if not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"train.batch_size={batch!r} is not allowed: it must be an integer >= 1")
    uses_placement = algorithm in ("cdc", "serial")
    r = coding.get("redundancy", 1) if uses_placement else 1
    g = coding.get("group_size") if uses_placement else None
    spec = RunSpec(
        algorithm=algorithm,
        n_workers=n_workers,
        batch_size=batch,
        steps=1,
        dataset=absolute_path(c.get("dataset", {})),  # the workers may run in other folders
        model=model,
        optimizer=c.get("optimizer", {}),
        redundancy=r,
        group_size=g,
        shuffle=shuffle,
        seed=int(train.get("seed", 0)),
        eval_every=int(train.get("eval_every", 50) or 0),
        torch_threads=int(cluster.get("torch_threads", 1)),
        run_id="dc" + uuid.uuid4().hex[:10],
        step_timeout_s=float(train.get("step_timeout_s", 300)),
        checkpoint_every=int(train.get("checkpoint_every") or 0),
        pipeline=bool(train.get("pipeline", True)),
        transport=transport,
        steps_per_task=steps_per_task,
        overlap=bool(transport_cfg.get("overlap", True)),
        test_drop=float(transport_cfg.get("test_drop") or 0.0),
        extra={"notes": notes},
    )
    try:
        placement = spec.placement
        if uses_placement:
            placement.check_batch(batch)
        if uses_placement and shuffle == "hybrid":
            m = coding.get("hybrid_m")
            if m is None:  # the least load for this (g, r), chosen by dcoded.coding
                m = best_m(placement.g, r)
            check_m(placement.g, r, m)
            spec = RunSpec(**{**spec.to_dict(), "hybrid_m": m})
            spec.hybrid  # noqa: B018  (the family is read or solved now, before any cluster)
    except ValueError as e:
        raise ConfigError(config_names(str(e))) from None
    if spec.transport == "multicast":
        paces = _paces(cluster, transport_cfg, spec)
        spec = dataclasses.replace(spec, pace_mbit=paces)
    if algorithm == "ddp" and cluster.get("kind") == "local" and not cluster.get("processes", 1):
        raise ConfigError(
            "algorithm=ddp needs worker processes (one torch process group each): "
            "set cluster.processes=true"
        )
    if algorithm == "ddp" and train.get("resume"):
        raise ConfigError("train.resume is not supported for algorithm=ddp yet")
    if not uses_placement and batch < n_workers:
        raise ConfigError(
            f"train.batch_size={batch} is too small for {algorithm} with {n_workers} workers: "
            f"it must be >= {n_workers} (B/K samples per worker)"
        )
    try:
        check_optimizer(spec.optimizer)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_dataset(spec.dataset)
    try:
        reference = Replica(spec)  # loads the data and builds the model on the driver
    except DatasetError:
        raise
    except (ValueError, RuntimeError) as e:  # a model that does not fit the data's shape
        msg = str(e).splitlines()[0]
        raise ConfigError(
            f"model={model['name']} does not fit dataset={spec.dataset.get('name')}: {msg}"
        ) from None
    n_train = len(reference.data.y_train)
    if batch > n_train:
        raise ConfigError(f"train.batch_size={batch} exceeds the {n_train} training samples")
    steps, epochs = train.get("steps"), train.get("epochs")
    if epochs is not None:
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ConfigError(
                f"train.epochs={epochs!r} is not allowed: it must be an integer >= 1 "
                "(or null: train.steps counts the steps)"
            )
        steps = epochs * (n_train // batch)
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"train.steps={steps!r} is not allowed: it must be an integer >= 1")
    spec = RunSpec(**{**spec.to_dict(), "steps": steps})
    reference.spec = spec
    resume = None
    if train.get("resume"):
        resume = load_checkpoint(train["resume"])
        if len(resume.theta) != reference.n_params:
            raise ConfigError(
                f"train.resume={train['resume']}: the checkpoint has {len(resume.theta)} "
                f"parameters, model={model['name']} here has {reference.n_params}"
            )
        _check_resume(resume, spec, train["resume"])
        if resume.step >= steps:
            raise ConfigError(
                f"train.resume={train['resume']}: the checkpoint is at step {resume.step}, "
                f"train.steps={steps}: nothing left to run (raise train.steps)"
            )
    return spec, reference, resume


def _multicast_or_fallback(cluster: Mapping, transport: Mapping) -> tuple[str, str | None]:
    """``transport=multicast`` where the network has IP multicast: the emulated one, or a LAN
    the user vouches for (``transport.lan=true``); elsewhere refused in one line, or
    ``direct`` when ``transport.fallback=direct`` says so."""
    if cluster.get("kind") == "netem" or cluster.get("netem") or transport.get("lan"):
        return "multicast", None
    where = f"cluster={cluster.get('kind')}"
    if transport.get("fallback") == "direct":
        return "direct", f"transport=multicast fell back to direct: no IP multicast on {where}"
    raise ConfigError(
        f"transport=multicast needs a network with IP multicast: cluster=netem, or "
        f"transport.lan=true on a LAN that has it; {where} has none (use transport=direct, or "
        "transport.fallback=direct to fall back to it)"
    )


def _paces(cluster: Mapping, transport: Mapping, spec: RunSpec) -> dict[str, float]:
    """Each multicast sender's pace in Mbit/s, per phase (``shuffle``, ``seg``):
    ``transport.pace_mbit``, or the most every sender can use at once without overrunning a
    link. A sender that spreads its phase's bytes evenly at pace ``p`` puts
    ``p · b(s→x) / B(s)`` on a link ``x`` that carries ``b(s→x)`` of its ``B(s)`` bytes (a
    multicast once per link), so ``p`` is the link's rate over ``max_x Σ_s b(s→x) / B(s)``:
    on a bus the one medium (every sender's bytes cross it), elsewhere each receiver's link
    (and on racks each uplink, both ways), and never above a sender's own link."""
    if transport.get("pace_mbit"):
        pace = transport["pace_mbit"]
        if not isinstance(pace, int | float) or pace <= 0:
            raise ConfigError(f"transport.pace_mbit={pace!r} is not allowed: it must be > 0")
        return {"shuffle": float(pace), "seg": float(pace)}
    links = cluster.get("netem") or cluster
    rate = links.get("bandwidth_mbit")
    if not rate:
        raise ConfigError(
            "transport=multicast on a LAN needs transport.pace_mbit (each sender's rate, Mbit/s)"
        )
    topology, rack = links.get("topology", "switch"), links.get("rack_size")
    uplink = links.get("uplink_mbit") or rate
    paces = {}
    for phase, messages in step_messages(spec.placement, spec.shuffle, spec.hybrid).items():
        sent = defaultdict(float)  # B(s)
        for sender, _, size in messages:
            sent[sender] += size
        use = defaultdict(float)  # link -> Σ_s b(s→link) / B(s), in units of its rate
        for sender, receivers, size in messages:
            share = size / sent[sender]
            if topology == "bus":
                use["bus"] += share
                continue
            for r in receivers:
                use[("in", r)] += share
            if topology == "racks":
                home, away = sender // rack, {r // rack for r in receivers} - {sender // rack}
                if away:
                    use[("up", home)] += share * rate / uplink
                for q in away:
                    use[("down", q)] += share * rate / uplink
        paces["seg" if phase == "params" else phase] = 0.95 * rate / max([1.0, *use.values()])
    return paces


def _check_resume(resume: Checkpoint, spec: RunSpec, where) -> None:
    """A resumed run continues the same sample order with state its optimizer can take."""
    meta = resume.meta
    for name, mine, key in [
        ("train.seed", spec.seed, "seed"),
        ("train.batch_size", spec.batch_size, "batch_size"),
        ("dataset", spec.dataset.get("name"), "dataset"),
        ("optimizer", spec.optimizer.get("_target_"), "optimizer"),
    ]:
        if key in meta and meta[key] != mine:
            raise ConfigError(
                f"train.resume={where}: the checkpoint has {name}={meta[key]}, this run "
                f"{mine}; a resumed run must keep it (the sample order and state depend on it)"
            )
    try:
        probe = SegmentOptimizer(resume.theta[:1].copy(), spec.optimizer)
        probe.load_state_arrays(slice_state(resume.optimizer, slice(0, 1)))
    except Exception as e:  # torch says why the state does not fit, in its own words
        raise ConfigError(
            f"train.resume={where}: the checkpoint's optimizer state "
            f"({', '.join(sorted(resume.optimizer)) or 'empty'}) does not fit this optimizer: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None


def run(
    cfg: Mapping,
    out_dir: str | Path | None = None,
    progress: bool | None = None,
    reuse_network: bool = False,
) -> dict:
    """Train as ``cfg`` says; write ``summary.json``, ``history.csv`` and ``theta.npy`` to
    ``out_dir`` (if given; checkpoints go there too) and return the summary.

    ``reuse_network``: on ``cluster=netem``, keep the emulated cluster for the next run in
    this process (the jobs of a multirun) instead of building one per run.

    A run that fails after training started keeps what it had: ``history.csv`` up to the
    failure and the last checkpoint, which the error message names. Stopped by Ctrl-C or
    SIGTERM, it also writes ``summary.json`` (``"status": "interrupted"``) and raises
    :class:`~dcoded.interrupt.Interrupted`, a ``KeyboardInterrupt`` saying what it kept.

    >>> from dcoded.config import compose_config  # doctest: +SKIP
    >>> summary = run(compose_config(["train.steps=20"]))  # doctest: +SKIP
    """
    with sigterm_as_interrupt():
        return _run(cfg, out_dir, progress, reuse_network)


def _run(cfg: Mapping, out_dir, progress: bool | None, reuse_network: bool) -> dict:
    spec, reference, resume = build_spec(cfg)
    c = _plain(cfg)
    if c["cluster"]["kind"] == "netem":
        if spec.algorithm == "serial":
            raise ConfigError("algorithm=serial runs in one process: use cluster=local")
        from dcoded import netem  # the driver re-runs inside the emulated network

        netem.check_available()
        run_dir = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="dcn-"))
        return netem.run_netem(c, run_dir, reuse=reuse_network)
    show = c.get("progress", True) if progress is None else progress
    run_dir = Path(out_dir) if out_dir is not None else None
    start = resume.step if resume else 0
    bar = Progress(spec.steps, spec.algorithm, initial=start) if show else None
    started = dt.datetime.now(dt.timezone.utc)
    train_fn = TRAINERS[spec.algorithm]
    log = TrainingLog(spec.run_id, spec.n_workers, spec.batch_size, peers=None)
    ctx = Context(spec, None, [], log, reference, bar, resume, run_dir)
    if resume:
        log.note(f"resumed from {c['train']['resume']} at step {resume.step}")
    for note in spec.extra.get("notes", []):
        log.note(note)
    cluster_info: dict = {"kind": "none", "workers": []}
    try:
        if spec.algorithm == "serial":
            theta = train_fn(ctx)
        else:
            with open_cluster(c["cluster"], spec.n_workers, spec.run_id) as session:
                if session.dashboard:
                    print(f"dashboard: {session.dashboard}")
                if spec.algorithm == "cdc":  # only worker-to-worker transfers are the exchange
                    log.peers = set(session.workers)
                ctx.client, ctx.workers = session.client, list(session.workers)
                cluster_info = _ask_workers(ctx, session, c["cluster"])
                try:
                    probe = _wire_probe(c["cluster"])
                    wire0 = probe()
                    theta = train_fn(ctx)
                    wire1 = probe()
                except BaseException:
                    _last_pull(ctx)  # while the cluster is still there
                    raise
                if wire0 is not None:
                    log.wire = [b - a for a, b in zip(wire0, wire1, strict=True)]
    except BaseException as e:
        rows = log.history()
        if run_dir is not None and rows:
            write_history(run_dir / "history.csv", rows)
        if isinstance(e, KeyboardInterrupt):
            raise _interrupted(e, ctx, rows, cluster_info, started) from None
        if isinstance(e, RunError):
            raise type(e)(f"{e}; {_resume_hint(ctx)}") from None
        raise
    finally:
        if bar is not None:
            bar.close()
    rows = log.history()
    summary = make_summary(spec, reference, log, rows, theta, cluster_info, started)
    if run_dir is not None:
        write_outputs(run_dir, summary, rows, theta)
    return summary


def _ask_workers(ctx: Context, session, cluster: Mapping) -> dict:
    """What the summary records of the cluster, with what every worker has; stops before
    training if a worker cannot read the data, and warns of workers with several threads."""
    facts = ctx.bounded(
        "asking the workers", check_workers, session.client, session.workers, ctx.spec.dataset
    )
    warning = thread_warning(facts)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
        ctx.log.note(warning)
    kind = "netem" if cluster.get("netem") else session.kind
    return {
        "kind": kind,
        "workers": session.workers,
        "per_worker": facts,
        **({"netem": cluster["netem"]} if kind == "netem" else {}),
    }


def _interrupted(
    e: KeyboardInterrupt, ctx: Context, rows: list[dict], cluster_info: dict, started
) -> Interrupted:
    """Write the summary of what ran before the interruption; the one line to end on."""
    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    line = f"stopped by {signal_name(signum)} before the first step"
    if rows:
        line = f"stopped by {signal_name(signum)} after step {rows[-1]['step'] + 1}"
    line += f" of {ctx.spec.steps}"
    if ctx.run_dir is not None and rows:
        summary = make_summary(
            ctx.spec, ctx.reference, ctx.log, rows, None, cluster_info, started, "interrupted"
        )
        write_summary(ctx.run_dir, summary)
        line += f"; history.csv and summary.json are in {ctx.run_dir}"
    return Interrupted(f"{line}; {_resume_hint(ctx)}", signum)


def _last_pull(ctx: Context) -> None:
    """Drain the records of the steps since the last pull, if the cluster still answers (a
    failed run's history should reach the failure); never blocks for long."""
    client = ctx.client
    if client is None or getattr(client, "status", None) != "running":
        return
    with contextlib.suppress(Exception):
        ctx.bounded("final pull", ctx.log.pull, client, check=ctx.check_connection)


def _wire_probe(cluster: Mapping):
    """Reads each worker interface's sent-bytes counter (emulated network only)."""
    if not cluster.get("wire"):
        return lambda: None
    from dcoded.netem import wire_probe

    return wire_probe(cluster["wire"])


def _resume_hint(ctx: Context) -> str:
    if ctx.last_checkpoint is None:
        if ctx.spec.checkpoint_every and ctx.run_dir is not None:
            return "no checkpoint was written yet"
        return "no checkpoint (set train.checkpoint_every to keep some)"
    return f"last checkpoint {ctx.last_checkpoint}: continue with train.resume={ctx.run_dir}"


def theory(spec: RunSpec, d: int) -> dict:
    """Closed-form bytes per worker per step (DESIGN §3) for the gradient exchange and the
    parameter distribution."""
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


def make_summary(
    spec, reference, log, rows, theta, cluster_info, started, status: str = "finished"
) -> dict:
    """The run's ``summary.json``; ``status`` is ``finished`` or ``interrupted`` (then
    ``theta`` is ``None``: the parameters stayed on the workers, the checkpoint has them)."""
    d = reference.n_params
    last = rows[-1] if rows else {}
    times = log.time_medians(rows)
    means = log.bytes_means(rows, exchanged=spec.algorithm != "serial")
    if spec.algorithm == "ddp":  # gloo's packets are not visible: the buckets are (and wire)
        means.update(multicast=None, unicast=None, params=None)
    if spec.algorithm != "cdc":  # only cdc has a choice of transport
        means.update(direct=None)
    th = theory(spec, d)
    placed = spec.algorithm in ("cdc", "serial")
    stale = [r["staleness_mean"] for r in rows if r.get("staleness_mean") is not None]
    summary = {
        "status": status,
        "algorithm": spec.algorithm,
        "n_workers": spec.n_workers,
        "redundancy": spec.redundancy if placed else None,
        "group_size": spec.placement.g if placed else None,
        "shuffle": spec.shuffle if placed else None,
        "hybrid_m": spec.hybrid_m if placed else None,
        "hybrid": spec.hybrid.summary() if placed and spec.hybrid else None,
        "transport": spec.transport if spec.algorithm == "cdc" else None,
        "model": spec.model["name"],
        "dataset": spec.dataset["name"],
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
        "time_s": {
            "total": last.get("wall_s", 0.0),
            "step_median": times["step"],
            **{p: times[p] for p in ("map", "encode", "shuffle", "decode", "update")},
            "params": times["params"],
        },
        "bytes_per_worker": {
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
            "transport": means["dask" if spec.transport == "dask" else "direct"],
            "transport_by_kind": log.by_kind_means(len(rows), spec.transport) if rows else {},
            "wire": (sum(log.wire) / len(log.wire) / max(len(rows), 1)) if log.wire else None,
            "wire_note": "all bytes the worker interfaces sent in the training loop, Dask "
            "control traffic and evaluation included"
            if log.wire
            else None,
        },
        "param_sha256": param_sha256(theta) if theta is not None else None,
        "staleness_mean": float(np.mean(stale)) if stale else None,
        "repaired_datagrams": log.repaired if spec.transport == "multicast" else None,
        "pace_mbit": dict(spec.pace_mbit) if spec.pace_mbit else None,
        "start_step": rows[0]["step"] if rows else 0,
        "events": list(log.events),
        "environment": {
            "cores": available_cores(),
            "torch_threads": spec.torch_threads,
            "cluster": cluster_info["kind"],
            **({"netem": cluster_info["netem"]} if "netem" in cluster_info else {}),
            "workers": cluster_info["workers"],
            "per_worker": cluster_info.get("per_worker", {}),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "dask": dask.__version__,
            "distributed": distributed.__version__,
            "numpy": np.__version__,
        },
        "started": started.isoformat(timespec="seconds"),
        "n_sub_batches": math.comb(spec.placement.g, spec.redundancy) if placed else None,
    }
    return summary


def write_outputs(out_dir: Path, summary: dict, rows: list[dict], theta: np.ndarray) -> None:
    """``summary.json``, ``history.csv`` and the final parameters ``theta.npy`` (float32), each
    written to a temporary name then renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "theta.npy.tmp", "wb") as f:
        np.save(f, np.asarray(theta, dtype="<f4"))
    (out_dir / "theta.npy.tmp").replace(out_dir / "theta.npy")
    write_summary(out_dir, summary)
    write_history(out_dir / "history.csv", rows)


def write_summary(out_dir: Path, summary: dict) -> None:
    """``summary.json``, written to a temporary name then renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(out_dir / "summary.json")


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


def format_results(summary: dict) -> str:
    """The short results table printed at the end of a run."""
    t, b, f = summary["time_s"], summary["bytes_per_worker"], summary["final"]
    head = f"{summary['algorithm']}  K={summary['n_workers']}"
    if summary["redundancy"] is not None:
        head += f" r={summary['redundancy']} g={summary['group_size']} {summary['shuffle']}"
        if summary.get("hybrid_m"):
            head += f" m={summary['hybrid_m']}"
    if summary.get("transport"):
        head += f" via {summary['transport']}"
    head += (
        f"  {summary['model']} on {summary['dataset']} (d={summary['n_params']:,})"
        f"  {summary['steps']} steps x B={summary['batch_size']}"
        f"  [{_resources(summary['environment'])}]"
    )

    def ms(x):
        return f"{1e3 * x:8.2f}"

    def nb(x):
        return "       -" if x is None else f"{x:12,.0f}"

    sha = summary["param_sha256"]

    def x4(x):  # an interrupted run may not have evaluated
        return "-" if x is None else f"{x:.4f}"

    if summary.get("status", "finished") != "finished":
        head += f"  ({summary['status']} after step {summary['steps_done']})"
    lines = [
        head,
        f"  test accuracy {x4(f['test_accuracy'])}   test loss {x4(f['test_loss'])}   "
        f"train loss {x4(f['train_loss'])}   wall {t['total']:.2f} s",
        "  time per step, median ms:",
        "    "
        + "  ".join(
            f"{k} {ms(t[k]).strip()}"
            for k in ("step_median", "map", "encode", "shuffle", "decode", "update", "params")
        ),
        "  bytes per worker per step:      measured       theory",
        f"    gradient exchange, multicast {nb(b['multicast'])} {nb(b['theory_multicast'])}",
        f"    gradient exchange, unicast   {nb(b['unicast'])} {nb(b['theory_unicast'])}",
        f"    parameters                   {nb(b['params'])} {nb(b['theory_params'])}",
        f"    Dask transfers (all)         {nb(b['dask_transfer'])}",
        *(
            [f"    moved by the transport       {nb(b['transport'])}"]
            if summary.get("transport") in ("direct", "multicast")
            else []
        ),
        f"  param_sha256 {sha[:16] + '…' if sha else '- (the run did not finish)'}",
    ]
    return "\n".join(lines)


class _CallableModule(types.ModuleType):
    """``from dcoded import run`` finds this module (a package's submodule takes the package
    attribute of its name), so calling the module calls :func:`run`."""

    def __call__(self, *args, **kwargs) -> dict:
        return run(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
