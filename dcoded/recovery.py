"""Going on from a checkpoint: when a worker is lost (``train.on_worker_loss=continue``), on a
worker that took the lost one's place or on the workers left; when a run is resumed by hand
(``train.resume``), with the history before it and what it changed; and whatever ends a run
or an attempt, the workers drop what they held of it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.resources
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from dcoded import checkpoint, health
from dcoded.config import CONFIG_MODULE, build_spec, compose_config, plain
from dcoded.engine import registry
from dcoded.engine.driver import SCHEDULER_TIMEOUT_S, Context
from dcoded.engine.record import TrainingLog
from dcoded.errors import CheckpointError, ConfigError, WorkerLost
from dcoded.results import read_history
from dcoded.settings import OPTION_KEYS, chosen_settings, leaves

#: How long the end of a run (or of an attempt) waits for its workers to drop what they hold.
TEARDOWN_WAIT_S = 10.0
#: A recovery: how long the scheduler may take to notice a worker gone.
LOSS_SEEN_S = 10.0


def teardown(client, run_ids, workers: list[str] | None = None) -> None:
    """Drop the replicas, links and records of ``run_ids`` from ``workers`` (all) that answer
    within :data:`TEARDOWN_WAIT_S` (a frozen worker never does); a step waiting on a link
    wakes and ends."""

    def teardown():
        with contextlib.suppress(Exception):
            for run_id in run_ids:
                client.run(registry.teardown, run_id, workers=workers, on_error="ignore")

    health.in_thread("dcoded teardown", teardown, watch=health.deadline(TEARDOWN_WAIT_S))


@contextlib.contextmanager
def replicas_dropped(client, run_ids: list[str]):
    """On the way out, drop the run's replicas and records from the workers (they may serve
    other runs), if the scheduler is still there: a dead one would hold ``client.run`` for its
    whole connect timeout."""
    lost: list[str] = []
    try:
        yield
    except WorkerLost as e:
        lost = e.workers  # a frozen one would hold the teardown for all its wait
        raise
    finally:
        if client.status == "running":
            others = None
            if lost:
                with contextlib.suppress(Exception):
                    known = health.known_workers(client, SCHEDULER_TIMEOUT_S)
                    others = [w for w in known if w not in lost]
            teardown(client, run_ids, others)


def recover(ctx: Context, cfg: Mapping, error: WorkerLost) -> Context:
    """``train.on_worker_loss=continue``: the context of the same run resumed by hand from its
    newest checkpoint (``train.resume``; from the start if it has none), on a worker that took
    the lost one's place within ``train.replace_within_s`` or else on the workers left; or
    the one line why it cannot go on (:class:`WorkerLost`)."""
    began, began_unix, spec, client = time.monotonic(), time.time(), ctx.spec, ctx.client
    lost = _the_lost(ctx, error)
    survivors = [w for w in ctx.workers if w not in lost]
    failed_at = _end_attempt(ctx, survivors)
    replaced, known = replace_lost(ctx, lost)
    # a second loss while this one is mended: counted with it, not found by the next attempt
    lost += [w for w in survivors if w not in known]
    survivors = [w for w in survivors if w in known]
    workers = survivors + replaced[: spec.n_workers - len(survivors)]
    names = ", ".join(f"{w} (rank {ctx.workers.index(w)})" for w in lost)
    spec2, reference, resume = _spec_going_on(ctx, cfg, error, workers, names)
    start = resume.step if resume else 0
    log = _log_going_on(ctx, spec2, workers, start, began)
    event = {
        "lost": [{"worker": w, "rank": ctx.workers.index(w)} for w in lost],
        "why": str(error),
        "at_step": failed_at,
        "resumed_from": start,
        "steps_replayed": failed_at - start,
        "replaced": len(workers) - len(survivors),
        "layout": {
            "n_workers": spec2.n_workers,
            "redundancy": spec2.redundancy,
            "group_size": spec2.placement.g,
        },
        "recovery_s": round(time.monotonic() - began, 3),  # until the new attempt starts
        "to_next_step_s": None,  # until its first step is done (its first task's end)
        "detected_unix": began_unix,
    }
    line = (
        f"worker {names} lost at step {failed_at}; went on from "
        f"{'the checkpoint at step ' + str(start) if resume else 'the start'} "
        f"({failed_at - start} step(s) again) on {len(workers)} workers "
        f"({event['replaced']} new), after {event['recovery_s']:.1f}s"
    )
    print(f"recovered: {line}", file=sys.stderr)
    log.note(f"recovered: {line}")
    log.recoveries.append(event)
    log.recovering = (event, began)
    if ctx.progress is not None:
        ctx.progress.rewind(start)
    out = Context(spec2, client, workers, log, reference, ctx.progress, resume, ctx.run_dir)
    out.last_checkpoint, out.crowding = ctx.last_checkpoint, ctx.crowding
    return out


def _end_attempt(ctx: Context, survivors: list[str]) -> int:
    """End the attempt that lost a worker: the records ``survivors`` hold collected, every row
    written, its tasks woken and dropped; the step it failed at."""
    with contextlib.suppress(Exception):  # the steps done before the loss stay in history.csv
        ctx.bounded(
            "collecting", ctx.collect, "after the loss", survivors, check=ctx.check_connection
        )
    ctx.log.write_rows()  # every row of this attempt, before it is marked done again
    last = ctx.log.last_written
    failed_at = last + 1 if last is not None else ctx.start_step
    teardown(ctx.client, [ctx.spec.run_id], survivors)  # the attempt's tasks wake on their links
    return failed_at


def _spec_going_on(ctx: Context, cfg: Mapping, error: WorkerLost, workers: list[str], names: str):
    """``build_spec`` of the run's config resumed from its newest checkpoint on ``workers``
    (the lost ones: ``names``), under the quotas the speed probe raised; or the one line why it
    cannot go on (:class:`WorkerLost`)."""
    spec = ctx.spec
    where = ctx.last_checkpoint.parent if ctx.last_checkpoint else cfg["train"].get("resume")
    again = copy.deepcopy(dict(cfg))
    again["train"] = {**cfg["train"], "resume": str(where) if where else None}
    again["cluster"] = {**cfg["cluster"], "n_workers": len(workers)}
    try:
        spec2, reference, resume = build_spec(again)
    except ConfigError as e:
        raise WorkerLost(
            f"{error}; could not go on with the {len(workers)} worker(s) left (no worker took "
            f"the place of {names} within train.replace_within_s={spec.replace_within_s:g}s): "
            f"{e}"
        ) from None
    # the scale model's quotas stay raised as the probe found: the run goes on under them
    spec2 = dataclasses.replace(spec2, host_quota_scale=spec.host_quota_scale)
    return spec2, reference, resume


def _the_lost(ctx: Context, error: WorkerLost) -> list[str]:
    """The workers ``error`` lost, or those the scheduler finds gone within
    :data:`LOSS_SEEN_S`; ``error`` itself when it finds none (the scheduler, or nothing known:
    nothing to go on with)."""
    lost = list(error.workers)
    if not lost:

        def find() -> list[str] | None:
            with contextlib.suppress(Exception):  # the scheduler may not have seen it go yet
                return ctx.bounded("finding the lost worker", ctx.lost_workers)
            return None

        going = lambda: ctx.client.status == "running"  # noqa: E731
        lost = health.until(find, LOSS_SEEN_S, going=going) or []
    if not lost:
        raise error
    return lost


def _log_going_on(ctx: Context, spec2, workers: list[str], start: int, began: float):
    """The next attempt's log: the same ``history.csv`` (its rows from ``start`` marked to be
    replayed), the events and recoveries so far, the compute speed the probe found, and its
    wall clock going on from where the last attempt's reached."""
    history = ctx.log.history_file
    history.mark_replayed(start)
    log = TrainingLog(spec2.run_id, spec2.n_workers, spec2.batch_size, None, history)
    log.compute_speed = ctx.log.compute_speed
    if spec2.algorithm == "cdc":
        log.peers = set(workers)
    log.events, log.recoveries = list(ctx.log.events), list(ctx.log.recoveries)
    reached = max(ctx.log.last_wall, ctx.log.wall_offset)  # offset included
    log.wall_offset = reached + (time.monotonic() - began)
    return log


def replace_lost(ctx: Context, lost: list[str]) -> tuple[list[str], set[str]]:
    """Workers that took the place of ``lost`` within ``train.replace_within_s`` (a local
    cluster's nanny restarts a dead one; on ``cluster=address`` new ones may join), and every
    worker the scheduler knows by then. A lost worker the scheduler still lists (frozen) is
    killed by its nanny, which starts another in its place as after any death (asked to
    restart it, the nanny would first wait 4 s for the stopped process to close itself)."""
    client, spec = ctx.client, ctx.spec
    known = lambda: ctx.bounded(  # noqa: E731
        "asking the scheduler",
        health.known_workers,
        client,
        stale_ok=True,
        check=ctx.check_connection,  # the lost ones are known to be gone
    )
    listed = known()
    for w in [w for w in lost if w in listed]:
        with contextlib.suppress(Exception):
            ctx.bounded(
                "killing a frozen worker",
                client.run,
                registry.kill_worker_process,
                w,
                workers=[w],
                nanny=True,  # a worker without one is left out
                on_error="ignore",
                check=ctx.check_connection,
            )
    deadline = time.monotonic() + spec.replace_within_s
    while True:
        now = known()
        fresh = sorted((w for w in now if w not in ctx.workers), key=health.address_order)
        if len(fresh) >= len(lost) or time.monotonic() >= deadline:
            return fresh, set(now)
        time.sleep(0.5)


def earlier_history(where: str | Path, step: int) -> list[dict]:
    """The rows of ``history.csv`` before ``step`` in the checkpoint's folder ``where`` (none
    if it has no history): a resumed run's history.csv starts with them, so it holds every
    step, also when it is written over the folder it resumed from."""
    folder = Path(where).expanduser()
    folder = folder if folder.is_dir() else folder.parent
    if not (folder / "history.csv").is_file():
        return []
    rows = read_history(folder)
    return [r for r in rows if r.get("step", "").isdigit() and int(r["step"]) < step]


def resumed_config(overrides: Sequence[str], cfg: Mapping | None = None) -> DictConfig:
    """The config a resume by hand runs with: the config of the run that wrote the checkpoint
    at ``train.resume`` (the checkpoint records it whole), with what the resume's own
    ``overrides`` set taken from ``cfg``, the config those overrides compose (composed here
    when not given). A setting given replaces the run's (``train.steps=800`` goes further); a
    group given replaces the whole group (``optimizer=adam``: Adam's defaults, then any of its
    settings given too); an experiment or size, the settings it sets. Without
    ``train.resume``, or from a checkpoint that recorded no config: ``cfg`` as it is.

    ``python -m dcoded train.resume=DIR ...`` runs with it; from Python,
    ``run(resumed_config(["train.resume=DIR"]))`` does the same.
    """
    overrides = list(overrides)
    cfg = _compose(overrides) if cfg is None else cfg
    c = plain(cfg)
    where = (c.get("train") or {}).get("resume")
    if not where:  # None or '': a new run
        return cfg
    _, meta = checkpoint.peek(where)
    if not meta.get("config"):  # an older dcoded's: what this resume composed
        return cfg
    before = meta["config"]
    # copied as written (``optimizer.lr: ${train.lr}``), to follow what they name in the end
    raw = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else c
    out = copy.deepcopy(before)
    parsed = OverridesParser.create().parse_overrides(overrides)
    given = [o for o in parsed if not o.is_hydra_override() and o.package is None]
    groups = [o for o in given if _group_package(o.key_or_group) is not None]
    for o in groups:  # as Hydra composes: the groups first, then the values given
        if _group_package(o.key_or_group) != "_global_":
            _set(out, raw, o.key_or_group)
            continue
        # an experiment (or size): what it sets, as the settings without it differ
        without = plain(_compose([x.input_line for x in parsed if x is not o]))
        for name in _set_by(without, c):
            _set(out, raw, name)
    for o in given:
        if o not in groups:
            _set(out, {} if o.is_delete() else raw, o.key_or_group)
    _follow(out, before, raw)
    _drop_retired(out, c)
    return OmegaConf.create(out)


def _drop_retired(out: dict, c: Mapping) -> None:
    """Drop from ``out`` the keys of a group that the option it chose no longer has in
    ``conf/`` and the resume's own config ``c`` does not set: a checkpoint of an older dcoded
    keeps them (``transport=dask``'s ``steps_per_task``), and a resume would warn of them as
    settings it does not read.

    >>> out = {"transport": {"name": "dask", "steps_per_task": 0}}
    >>> _drop_retired(out, {"transport": {"name": "dask"}}); out
    {'transport': {'name': 'dask'}}
    """
    for group in OPTION_KEYS:
        own, node = chosen_settings(out, group), out.get(group)
        if own is None or not isinstance(node, dict):
            continue
        mine = c.get(group) if isinstance(c.get(group), Mapping) else {}
        for key in [k for k in node if k not in own and k not in mine]:
            del node[key]


def _follow(out: dict, before: Mapping, raw: Mapping) -> None:
    """Where the config names another setting (``optimizer.lr: ${train.lr}``) and the run that
    wrote the checkpoint had them equal, ``out`` names it too: a resume with ``train.lr=0.01``
    changes the optimizer's rate, as the same override on a run does."""
    for name, value in leaves(raw):
        if not (isinstance(value, str) and "${" in value):
            continue
        *parents, last = name.split(".")
        node = out
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or "${" in str(node.get(last, "")):
            continue
        trial = copy.deepcopy(dict(before))
        _set(trial, raw, name)
        try:
            same = OmegaConf.select(OmegaConf.create(trial), name) == node.get(last, _ABSENT)
        except Exception:  # it names what this config does not have
            same = False
        if same:
            node[last] = value


_ABSENT = object()


def _compose(overrides: list[str]) -> DictConfig:
    """:func:`~dcoded.config.compose_config`, also inside the Hydra app (which holds Hydra's
    one global instance, with the same configs)."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose(config_name="config", overrides=overrides)
    return compose_config(overrides)


def _group_package(name: str) -> str | None:
    """Where the config group ``name`` of ``conf/`` puts its options: ``_global_``
    (``experiment``, ``size``) or its own name; ``None`` where ``name`` is no group."""
    if not name.isidentifier():
        return None
    folder = importlib.resources.files(CONFIG_MODULE).joinpath(name)
    if not folder.is_dir():
        return None
    for option in sorted(folder.iterdir(), key=lambda f: f.name):
        if option.name.endswith(".yaml"):
            first = option.read_text().lstrip().splitlines()[:1]
            return "_global_" if first == ["# @package _global_"] else name
    return name


#: What names a group's option in its settings (another option: the whole group is another).
_OPTION_NAMES = ("name", "kind", "model", "_target_")


def _set_by(without: Mapping, c: Mapping) -> list[str]:
    """The settings in which ``c`` differs from ``without``: a group whose option differs,
    whole (``algorithm``), else each leaf (``train.steps``)."""
    out = []
    for key, value in c.items():
        other = without.get(key)
        if value == other:
            continue
        if isinstance(value, Mapping) and isinstance(other, Mapping):
            if _group_package(key) is not None and any(
                value.get(n) != other.get(n) for n in _OPTION_NAMES
            ):
                out.append(key)
            else:
                out += [f"{key}.{name}" for name in _set_by(other, value)]
        else:
            out.append(key)
    return out


def _set(out: dict, c: Mapping, name: str) -> None:
    """Set the dotted setting ``name`` of ``out`` to its value in ``c``, or remove it from
    ``out`` where ``c`` has none."""
    *parents, last = name.split(".")
    node, source = out, c
    for key in parents:
        node = node.setdefault(key, {})
        source = source.get(key, {}) if isinstance(source, Mapping) else {}
    if isinstance(source, Mapping) and last in source:
        node[last] = copy.deepcopy(source[last])
    else:
        node.pop(last, None)


def resume_changes(resume, spec) -> str:
    """What this run sets otherwise than the run that wrote the checkpoint (``old -> new``),
    of the settings a resume may change; ``""`` if nothing."""
    before = resume.meta.get("config")
    if before is None:  # a checkpoint of an older dcoded: its few recorded settings
        placed = resume.meta.get("algorithm") in ("cdc", "serial")
        before = {
            "algorithm": {"name": resume.meta.get("algorithm")},
            "cluster": {"n_workers": resume.meta.get("n_workers")},
            "coding": {"redundancy": resume.meta.get("redundancy") if placed else None},
        }
    now = dict(leaves(spec.extra.get("config") or {}))
    skip = ("train.resume", "train.steps", "train.epochs", "progress", "cluster.", "logger.")
    diffs = [
        f"{name} {old!r} -> {now.get(name)!r}"
        for name, old in leaves(before)
        if not name.startswith(skip) or name == "cluster.n_workers"
        if old is not None and name in now and now[name] != old
    ]
    return ", ".join(diffs)


def resume_hint(ctx: Context) -> str:
    """Where a stopped run can go on from: its last checkpoint, at which step, and the steps
    done since that a resume does again; or why there is none."""
    if ctx.last_checkpoint is None:
        if ctx.spec.checkpoint_every and ctx.run_dir is not None:
            return "no checkpoint was written yet"
        return "no checkpoint (set train.checkpoint_every to keep some)"
    last = ctx.log.last_written
    return again_hint(ctx.last_checkpoint, ctx.run_dir, last + 1 if last is not None else None)


def again_hint(file: Path, run_dir: Path, done: int | None) -> str:
    """The checkpoint ``file``, its step, the resume that goes on from it, and which of the
    ``done`` steps it does again (steps count from 1, as "after step N" does).

    >>> import tempfile, numpy as np
    >>> with tempfile.TemporaryDirectory() as d:
    ...     f = checkpoint.save(Path(d), checkpoint.Checkpoint(100, np.zeros(3, "f4"), {}, {}))
    ...     for done in (130, 101, 100):
    ...         print(again_hint(f, Path("RUN"), done).replace(str(f), "CKPT"))
    last checkpoint CKPT is at step 100: continue with train.resume=RUN (it does steps 101-130 again)
    last checkpoint CKPT is at step 100: continue with train.resume=RUN (it does step 101 again)
    last checkpoint CKPT is at step 100: continue with train.resume=RUN (it does no step again)
    """  # noqa: E501
    try:
        step, _ = checkpoint.peek(file)
    except CheckpointError:  # it was there: the line still says where
        return f"last checkpoint {file}: continue with train.resume={run_dir}"
    line = f"last checkpoint {file} is at step {step}: continue with train.resume={run_dir}"
    if done is None:
        return line
    if done <= step:
        return f"{line} (it does no step again)"
    n = done - step
    return f"{line} (it does step{'s' * (n > 1)} {step + 1}{f'-{done}' * (n > 1)} again)"
