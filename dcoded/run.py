"""``run(cfg) -> summary``: one training run from a config, with or without Hydra.

The config is checked before any cluster starts (:func:`dcoded.config.build_spec`); the run
writes ``summary.json``, ``history.csv`` and ``theta.npy`` (:mod:`dcoded.summary`) into its
output directory. ``python -m dcoded.run CONFIG OUT_DIR`` runs a saved config (JSON or YAML,
such as a run's ``.hydra/config.yaml``) without Hydra; the emulated network starts its driver
that way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import inspect
import json
import os
import signal
import sys
import tempfile
import time
import types
from collections.abc import Mapping
from pathlib import Path

from dcoded import files, loggers, netem, scale
from dcoded.cluster import (
    attach_cluster,
    close_kept_cluster,
    dask_logs_into,
    kept_cluster,
    open_cluster,
)
from dcoded.config import build_spec, plain
from dcoded.engine import straggle, trainer
from dcoded.engine.direct import multicast_groups
from dcoded.engine.driver import Context, Progress
from dcoded.engine.record import TrainingLog
from dcoded.errors import ConfigError, DcodedError, RunError, WorkerLost
from dcoded.interrupt import Interrupted, signal_name, sigterm_as_interrupt
from dcoded.preflight import check_workers, cores_warning, crowding, thread_warning
from dcoded.recovery import (
    earlier_history,
    recover,
    replicas_dropped,
    resume_changes,
    resume_hint,
)
from dcoded.results import ERROR_FILE
from dcoded.summary import make_summary, write_outputs, write_summary


def run(
    cfg: Mapping,
    out_dir: str | Path | None = None,
    progress: bool | None = None,
    reuse_cluster: bool = False,
    client=None,
    reuse_network: bool = False,
) -> dict:
    """Train as ``cfg`` says; write ``summary.json``, ``history.csv`` and ``theta.npy`` to
    ``out_dir`` (if given; checkpoints go there too) and return the summary.

    ``client``: a ``distributed.Client`` to run on, instead of the cluster ``cfg.cluster``
    describes; it stays open, so a notebook can run many configs on one cluster (the first
    ``cluster.n_workers`` workers, in address order, are the run's).

    ``reuse_cluster``: keep the cluster this run starts (``cluster=local``, or the emulated
    one of ``cluster=netem``) for the next run in this process with the same cluster settings
    (the jobs of a multirun) instead of starting one per run; a run that fails closes it.
    ``reuse_network``: its older name.

    A run that fails after training started keeps what it had: ``history.csv`` up to the
    failure and the last checkpoint, which the error message names. Stopped by Ctrl-C or
    SIGTERM, it also writes ``summary.json`` (``"status": "interrupted"``) and raises
    :class:`~dcoded.interrupt.Interrupted`, a ``KeyboardInterrupt`` saying what it kept.

    >>> from dcoded.config import compose_config
    >>> summary = run(compose_config(["algorithm=serial", "train.steps=3"]), progress=False)
    >>> summary["steps_done"], summary["algorithm"]
    (3, 'serial')
    """
    with sigterm_as_interrupt():
        return _run(cfg, out_dir, progress, reuse_cluster or reuse_network, client)


def _say_if_replacing(run_dir: Path, resume: str | None) -> None:
    """One line where ``run_dir`` holds a finished or failed run that this one replaces (not
    when it continues that run with ``train.resume``)."""
    earlier = [n for n in ("summary.json", "error.txt") if (run_dir / n).is_file()]
    continued = False
    if resume is not None:
        at = Path(resume).resolve()
        continued = run_dir.resolve() in (at, at.parent)  # its folder, or a checkpoint in it
    if earlier and not continued:
        print(
            f"note: {run_dir} holds an earlier run ({earlier[0]}): this run replaces its files",
            file=sys.stderr,
        )


def _run(cfg: Mapping, out_dir, progress: bool | None, reuse: bool, client) -> dict:
    """One run: checked, its cluster opened (or joined), its attempts trained, its outputs
    written. Every way it can end (finished, a loss recovered or not, a failure, Ctrl-C) is
    handled here and in :func:`_train_on_cluster`, in the order the cluster, the replicas and
    the log must be let go: a refactor that changed that order made a frozen worker's run hang
    for minutes."""
    cfg = netem.or_loopback(cfg)  # cluster.fallback=local where no namespaces can be made
    spec, reference, resume = build_spec(cfg)
    c = plain(cfg)
    if out_dir is not None and "given" not in c["cluster"]:  # the emulated driver's parent said it
        _say_if_replacing(Path(out_dir), c["train"].get("resume"))
    if c["cluster"]["kind"] == "netem":
        return _in_emulated_network(c, spec, out_dir, reuse, client)
    run_dir = Path(out_dir) if out_dir is not None else None
    logger = loggers.make(c, run_dir)  # a missing library: one line, before any cluster
    bar = _progress_bar(c, spec, resume, progress)
    started, began = dt.datetime.now(dt.timezone.utc), time.perf_counter()
    train_fn = trainer(spec.algorithm, spec.transport)
    history, log = _history_and_log(c, spec, resume, run_dir, logger)
    training = _Training(Context(spec, None, [], log, reference, bar, resume, run_dir))
    failed = False
    logger.start(loggers.flat_params(spec.extra.get("config") or c))
    try:
        if spec.algorithm == "serial":
            theta = train_fn(training.ctx)
        else:
            theta = _train_on_cluster(training, c, train_fn, reuse, client)
    except BaseException as e:
        failed = True
        ctx, rows = training.ctx, []
        with contextlib.suppress(Exception):  # the error to report is e, whatever happens here
            rows = ctx.log.rows(ctx.start_step)  # every step's row is in history.csv now
        history.close()  # a temporary one, without a run folder
        with contextlib.closing(logger):  # what it logged stays; without a summary, failed
            if isinstance(e, KeyboardInterrupt):
                cluster_info = training.cluster_info
                raise _interrupted(e, ctx, rows, cluster_info, started, began, logger) from None
        if isinstance(e, RunError):
            raise type(e)(f"{e}; {resume_hint(ctx)}") from None
        raise
    finally:
        ctx, spec = training.ctx, training.ctx.spec  # the newest attempt's
        _let_go(ctx, bar, failed and reuse)
    with contextlib.closing(logger):  # however the end goes
        try:
            rows = ctx.log.rows(ctx.start_step)
        finally:
            history.close()
        summary = make_summary(
            spec, ctx.reference, ctx.log, rows, theta, training.cluster_info, started, began=began
        )
        if run_dir is not None:
            write_outputs(run_dir, summary, theta)
        logger.finish(summary)
    return summary


def _let_go(ctx: Context, bar: Progress | None, close_cluster: bool) -> None:
    """However a run ended: its progress bar closed, the cgroups a dead slow worker left
    removed, and with ``close_cluster`` (a failed run on a kept cluster: the next run gets a
    new one, not what this one left) the kept cluster closed; its teardown (a comm closed under
    a pending task) logs as the run did, into the run's dcoded.log, not through Dask's own
    handler onto the console."""
    if bar is not None:
        bar.close()
    if ctx.spec.straggle.get("model") == "slow":  # a worker that died left its cgroup here
        straggle.remove_stale(f"dcoded-{ctx.spec.run_id}-")
    if close_cluster:
        with dask_logs_into(ctx.run_dir):
            close_kept_cluster()


@dataclasses.dataclass
class _Training:
    """What the end of a run reads of its training, however it ends: the newest attempt's
    context (the speed probe and each recovery replace it) and what the summary records of the
    cluster."""

    ctx: Context
    cluster_info: dict = dataclasses.field(default_factory=lambda: {"kind": "none", "workers": []})


def _progress_bar(c: dict, spec, resume, progress: bool | None) -> Progress | None:
    """The progress bar (from a resumed run's step on), unless ``progress`` (or else the
    config's ``progress``) says none."""
    show = c.get("progress", True) if progress is None else progress
    start = resume.step if resume else 0
    return Progress(spec.steps, spec.algorithm, initial=start) if show else None


def _train_on_cluster(training: _Training, c: dict, train_fn, reuse: bool, client):
    """Train on the run's cluster (``client``'s, the one kept for reuse, or one opened for the
    run) and return the parameters; ``training`` holds the newest attempt's context and the
    cluster's facts, however it ends. On the way out a failed run's records are collected
    first, then its replicas dropped, then the cluster let go."""
    spec = training.ctx.spec
    if client is not None:
        session_cm = attach_cluster(client, c["cluster"], spec.n_workers)
    elif reuse and c["cluster"]["kind"] == "local":
        session_cm = contextlib.nullcontext(kept_cluster(c["cluster"], spec.n_workers))
    else:
        session_cm = open_cluster(c["cluster"], spec.n_workers)
    run_ids = [spec.run_id]  # one more for each recovery
    with (
        dask_logs_into(training.ctx.run_dir),
        session_cm as session,
        replicas_dropped(session.client, run_ids),
    ):
        ctx = training.ctx
        if session.dashboard:
            print(f"dashboard: {session.dashboard}")
        if spec.algorithm == "cdc":  # only worker-to-worker transfers are the exchange
            ctx.log.peers = set(session.workers)
        ctx.client, ctx.workers = session.client, list(session.workers)
        training.cluster_info = _ask_workers(ctx, session, c["cluster"])
        try:
            theta, wire0, wire1 = _attempts(training, c, train_fn, run_ids)
        except BaseException:
            _last_collect(training.ctx)  # while the cluster is still there
            raise
        if wire0 is not None:
            training.ctx.log.wire = [b - a for a, b in zip(wire0, wire1, strict=True)]
    return theta


def _attempts(training: _Training, c: dict, train_fn, run_ids: list[str]):
    """Train under the scale model's quotas until an attempt ends the run, going on after each
    lost worker where ``train.on_worker_loss=continue`` (each recovery's run id added to
    ``run_ids``); the parameters, and the wire's counters at the last attempt's start and at
    the end."""
    spec = training.ctx.spec
    # the scale model's quotas hold while the loop runs (start-up is not timed),
    # corrected for how much slower this machine computes under them
    given = c["cluster"].get("scale")
    training.ctx, quota_us = scale.speed_probe(training.ctx, given)
    cluster = c["cluster"]
    probe, losses, links = _wire_probe(cluster), _loss_probe(cluster), _link_probe(cluster)
    wire0, losses0, links0 = probe(), losses(), links()
    with scale.quotas_in_force(given, quota_us):
        while True:
            _route_multicast(c["cluster"], training.ctx)
            try:
                theta = train_fn(training.ctx)
                break
            except WorkerLost as e:
                if spec.on_worker_loss != "continue":
                    raise
                training.ctx = recover(training.ctx, c, e)  # or the one line why it cannot
                run_ids.append(training.ctx.spec.run_id)
                training.cluster_info["workers"] = list(training.ctx.workers)
                wire0, links0 = probe(), links()  # per step of this attempt, as every mean is
    wire1 = probe()
    if losses0 is not None:
        training.ctx.log.kernel_losses = netem.loss_delta(losses0, losses())
    if links0 is not None:
        training.ctx.log.link_bytes = {k: v - links0.get(k, 0) for k, v in links().items()}
    return theta, wire0, wire1


def _route_multicast(cluster: Mapping, ctx: Context) -> None:
    """On the emulated network, the bridges forward each multicast group of this attempt only
    toward its members, as switches that snoop IGMP do (without it, they flood every group to
    every link)."""
    if ctx.spec.transport == "multicast" and cluster.get("worker_ips"):
        netem.route_run(cluster, multicast_groups(ctx.spec, ctx.workers))


def _in_emulated_network(c: dict, spec, out_dir, reuse: bool, client) -> dict:
    """``cluster=netem``: the run's driver re-runs inside the emulated network, its summary
    comes back from there."""
    if spec.algorithm == "serial":
        raise ConfigError("algorithm=serial runs in one process: use cluster=local")
    if client is not None:
        raise ConfigError("cluster=netem builds its own cluster: do not pass a client")
    netem.check_available()
    run_dir = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="dcn-"))
    loggers.make(c, run_dir)  # its library, before the network: the driver there logs
    return netem.run_netem(c, run_dir, reuse=reuse)


def _history_and_log(c: dict, spec, resume, run_dir: Path | None, logger):
    """The run's ``history.csv`` (a resumed run's starts with the rows before it) and its
    log, with what the run should say first: resumed from where, with which changes; the
    config's notes and warnings."""
    earlier = earlier_history(c["train"]["resume"], resume.step) if resume else []
    history = loggers.LoggedHistory(run_dir / "history.csv" if run_dir else None, earlier, logger)
    log = TrainingLog(spec.run_id, spec.n_workers, spec.batch_size, peers=None, history=history)
    if resume:
        log.note(f"resumed from {c['train']['resume']} at step {resume.step}")
        changed = resume_changes(resume, spec)
        if changed:
            line = f"resumed with other settings than the checkpoint's run: {changed}"
            print(f"note: {line}", file=sys.stderr)
            log.note(line)
    for note in spec.extra.get("notes", []):
        log.note(note)
    for warning in spec.extra.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
        log.note(warning)
    return history, log


#: The warnings about a cluster's workers this process printed, with the workers: the jobs of
#: a sweep share one cluster, and say them once (each run's log notes them still).
_SAID: set[tuple[str, tuple[str, ...]]] = set()


#: a file of the warnings said, one JSON line each, shared by the processes that set it: the
#: driver of each job of a sweep on the emulated network is a process of its own
SAID_FILE = "DCODED_SAID_FILE"


def _warn_once(warning: str, workers) -> None:
    """Print ``warning`` about ``workers`` unless this process already did, or another that
    shares its file of warnings said (``$DCODED_SAID_FILE``) did."""
    said = (warning, tuple(workers))
    if said in _SAID:
        return
    _SAID.add(said)
    shared = os.environ.get(SAID_FILE)
    if shared:
        line = json.dumps([warning, list(workers)])
        with contextlib.suppress(OSError):
            if line in Path(shared).read_text().splitlines():
                return
        with contextlib.suppress(OSError), files.append(shared) as f:
            f.write(line + "\n")
    print(f"warning: {warning}", file=sys.stderr)


def _ask_workers(ctx: Context, session, cluster: Mapping) -> dict:
    """What the summary records of the cluster, with what every worker has; stops before
    training if a worker cannot read the data, and warns of workers with several threads."""
    facts = ctx.bounded(
        "asking the workers",
        check_workers,
        session.client,
        session.workers,
        ctx.spec.dataset,
        setup=True,
    )
    # under the scale model the workers share the cores by hard quotas, as machines of their own
    crowded = None if ctx.spec.dilation != 1.0 else cores_warning(facts)
    if crowded:  # the health checks wait as many times longer for an answer
        ctx.crowding = crowding(facts)
    for warning in (thread_warning(facts), crowded):
        if warning:
            _warn_once(warning, session.workers)
            ctx.log.note(warning)
    kind = "netem" if cluster.get("netem") else session.kind
    return {
        "kind": kind,
        "workers": session.workers,
        "per_worker": facts,
        **(
            {"netem": cluster["netem"], "worker_ips": list(cluster.get("worker_ips") or [])}
            if kind == "netem"
            else {}
        ),
    }


def _interrupted(
    e: KeyboardInterrupt,
    ctx: Context,
    rows: list[dict],
    cluster_info: dict,
    started,
    began,
    logger: loggers.Logger | None = None,
) -> Interrupted:
    """Write the summary of what ran before the interruption (and hand it to ``logger``); the
    one line to end on."""
    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    line = f"stopped by {signal_name(signum)} before the first step"
    if rows:
        line = f"stopped by {signal_name(signum)} after step {rows[-1]['step'] + 1}"
    line += f" of {ctx.spec.steps}"
    if ctx.run_dir is not None and rows:
        summary = make_summary(
            ctx.spec,
            ctx.reference,
            ctx.log,
            rows,
            None,
            cluster_info,
            started,
            "interrupted",
            began=began,
        )
        write_summary(ctx.run_dir, summary)
        if logger is not None:
            logger.finish(summary)
        line += f"; history.csv and summary.json are in {ctx.run_dir}"
    return Interrupted(f"{line}; {resume_hint(ctx)}", signum)


def _last_collect(ctx: Context) -> None:
    """Collect the records of the steps since the last collection, if the cluster still answers (a
    failed run's history should reach the failure); never blocks for long."""
    client = ctx.client
    if client is None or getattr(client, "status", None) != "running":
        return
    with contextlib.suppress(Exception):
        ctx.bounded("final collection", ctx.collect, "final collection", check=ctx.check_connection)


def _wire_probe(cluster: Mapping):
    """Reads each worker interface's sent-bytes counter (emulated network only)."""
    if not cluster.get("wire"):
        return lambda: None
    return netem.wire_probe(cluster["wire"])


def _loss_probe(cluster: Mapping):
    """Reads the kernel's loss counters in every namespace (emulated network only)."""
    if not cluster.get("namespaces"):
        return lambda: None
    return lambda: netem.loss_counters(cluster["namespaces"])


def _link_probe(cluster: Mapping):
    """Reads the bytes each emulated link has passed (emulated network only)."""
    if not cluster.get("queues"):
        return lambda: None
    return lambda: netem.link_counters(cluster["namespaces"], cluster["queues"])


def main(argv: list[str] | None = None) -> int:
    """``python -m dcoded.run CONFIG OUT_DIR``: run a saved config (a run's
    ``.hydra/config.yaml``, or JSON; ``-``: YAML or JSON from standard input) into ``OUT_DIR``;
    print the results table. Exits 2 with
    one line on a :class:`~dcoded.errors.DcodedError`."""
    from dcoded.summary import format_results

    args = sys.argv[1:] if argv is None else argv
    table = "--no-table" not in args  # the emulated network's driver: its parent prints it
    args = [a for a in args if a != "--no-table"]
    if len(args) != 2:
        print("usage: python -m dcoded.run CONFIG OUT_DIR [--no-table]", file=sys.stderr)
        return 2
    Path(args[1], ERROR_FILE).unlink(missing_ok=True)  # an earlier run's, in the same folder
    try:
        cfg = _read_config(Path(args[0]))
        summary = run(cfg, out_dir=args[1])
    except DcodedError as e:
        print(f"error: {e}", file=sys.stderr)
        with contextlib.suppress(OSError):  # error.txt, as a job of a sweep leaves it
            Path(args[1]).mkdir(parents=True, exist_ok=True)
            files.write_text(Path(args[1], ERROR_FILE), f"{e}\n")
        return 2
    except Interrupted as e:  # what was measured is written; one line, as outside
        print(f"stopped: {e}", file=sys.stderr)
        return e.exit_code
    if table:
        print(format_results(summary))
    return 0


def _read_config(path: Path):
    """A saved config (JSON, or YAML such as a run's ``.hydra/config.yaml``), or a
    :class:`ConfigError` saying why it cannot be read."""
    from omegaconf import OmegaConf

    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
        if path.suffix == ".json" or (str(path) == "-" and text.lstrip().startswith("{")):
            data = json.loads(text)  # as JSON: YAML 1.1 would read 1e-05 as a string
        else:
            data = OmegaConf.create(text)
    except OSError as e:
        raise ConfigError(f"cannot read the config {path}: {e.strerror or e}") from None
    except Exception as e:  # JSON or YAML that does not parse: its parser's first line
        raise ConfigError(
            f"the config {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    if not isinstance(data, dict) and not OmegaConf.is_dict(data):
        raise ConfigError(f"the config {path} holds no mapping of settings")
    return OmegaConf.create(data) if isinstance(data, dict) else data


class _CallableModule(types.ModuleType):
    """``from dcoded import run`` finds this module (a package's submodule takes the package
    attribute of its name), so calling the module calls :func:`run`."""

    def __call__(self, *args, **kwargs) -> dict:
        return run(*args, **kwargs)


# so that inspect.signature(dcoded.run), and a notebook's hints, show run's own parameters
_CallableModule.__call__.__signature__ = inspect.signature(run).replace(  # type: ignore[attr-defined]
    parameters=[
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
        *inspect.signature(run).parameters.values(),
    ]
)
sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
