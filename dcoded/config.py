"""The run's configuration: composing it (the Hydra configs ship in the package, as the
module ``dcoded.conf``) and checking it, all before any cluster starts.

:func:`build_spec` turns a composed config into the run's :class:`~dcoded.engine.spec.RunSpec`
and the driver's replica. It checks the algorithm, the layout ``(K, r, g)``, the batch against
``C(g, r)`` sub-batches, the transport, the optimizer, the dataset files, the model against the
data, and a checkpoint to resume from; every refusal is a :class:`~dcoded.errors.ConfigError`
(or ``DatasetError``, ``CheckpointError``) naming the setting as the config spells it.
"""

from __future__ import annotations

import difflib
import math
import os
import uuid
from collections.abc import Mapping, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dcoded.checkpoint import Checkpoint, slice_state
from dcoded.checkpoint import load as load_checkpoint
from dcoded.cluster import check_cluster_config
from dcoded.coding import HybridPlan, Placement, best_m, check_layout, check_m, hybrid_plan
from dcoded.coding.messages import step_messages
from dcoded.coding.shuffles import SHUFFLES, scheme
from dcoded.coding.stragglers import check_stragglers
from dcoded.data import absolute_path, check_dataset
from dcoded.engine import ALGORITHMS, straggle
from dcoded.engine.driver import steps_per_epoch
from dcoded.engine.replica import Replica, cached_dataset
from dcoded.engine.spec import TRANSPORTS, RunSpec
from dcoded.errors import ConfigError, DatasetError
from dcoded.models import MODELS
from dcoded.optim import SegmentOptimizer, check_optimizer
from dcoded.predict.best import register_resolver
from dcoded.settings import (
    CONFIG_MODULE,
    GROUPS,
    OPTION_KEYS,
    SETTINGS,
    check_settings,
    chosen_settings,
    config_groups,
    ignored_warning,
    is_overlay,
    unknown_setting,
)
from dcoded.topology import PACE_SHARE, TCP_PACE_SHARE, Shape

__all__ = ["CONFIG_MODULE", "build_spec", "check_overrides", "compose_config", "plain"]

#: How the config spells the settings that ``dcoded.coding`` checks.
CONFIG_NAMES = {
    "n_workers": "cluster.n_workers",
    "redundancy": "coding.redundancy",
    "group_size": "coding.group_size",
    "batch_size": "train.batch_size",
    "hybrid_m": "coding.hybrid_m",
    "stragglers": "coding.stragglers",
}


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """The run config with Hydra overrides applied, as ``python -m dcoded`` would see it.
    An override Hydra cannot apply is a :class:`~dcoded.errors.ConfigError` naming the
    nearest valid names (:func:`check_overrides`).

    >>> cfg = compose_config(["coding.redundancy=3", "model=cnn"])
    >>> cfg.coding.redundancy, cfg.model.name
    (3, 'cnn')
    >>> compose_config(["coding.redundency=2"])
    Traceback (most recent call last):
    ...
    dcoded.errors.ConfigError: coding.redundency is not a setting of dcoded: did you mean coding.redundancy?
    """  # noqa: E501
    overrides = list(overrides or [])
    try:
        cfg = _compose(overrides)
    except _HYDRA_ERRORS as e:
        failed = e
    else:
        if any(o.lstrip().startswith("+") for o in overrides):  # a key added: is it a setting?
            check_overrides(overrides, composed=cfg)
        return cfg
    check_overrides(overrides)  # the one line naming the nearest names, where it finds one
    raise ConfigError(f"the overrides cannot be applied: {_first_line(failed)}") from None


def _compose(overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _hydra_errors() -> tuple[type[BaseException], ...]:
    from hydra.errors import HydraException

    return (HydraException, OmegaConfBaseException)


def check_overrides(overrides: list[str], composed: DictConfig | None = None) -> None:
    """Refuse, before Hydra composes anything, an override that names a group option that
    does not exist (``algorithm=cdcc``, also inside a sweep ``algorithm=cdcc,ssgd``) or a key
    that is not a setting of the config it changes (``coding.redundency=2``;
    ``cluster.bandwidth_mbit=100`` on ``cluster=local``, with or without a ``+``; ``++`` forces
    it in, to be warned of as not read): one
    :class:`~dcoded.errors.ConfigError` line naming the nearest valid names. Hydra's own
    (``hydra.*``, ``hydra/...``) are left to Hydra; a ``+key`` of the user's own at the top
    level (``+tag=baseline``) and of ``optimizer`` (a keyword of the torch optimizer) is kept.
    ``composed``: the config these overrides made, whose added keys are checked.

    >>> check_overrides(["algorithm=cdcc,ssgd"])
    Traceback (most recent call last):
    ...
    dcoded.errors.ConfigError: algorithm=cdcc is not an option of algorithm: did you mean cdc? (the options: asgd, cdc, ddp, serial, ssgd)
    """  # noqa: E501
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except _HYDRA_ERRORS as e:
        raise ConfigError(f"an override cannot be read: {_first_line(e)}") from None
    chosen, keys = _check_options(parsed)
    if not keys:
        return
    try:  # the config of the first job: the groups its overrides choose
        c = OmegaConf.to_container(composed if composed is not None else _compose(chosen))
    except _HYDRA_ERRORS:
        return  # Hydra says why, when it composes the run
    for o in keys:
        name, added = o.key_or_group, o.is_add() or o.is_force_add()
        there = _find(c, name)
        if composed is None and o.is_add() and there is not _ABSENT:
            raise ConfigError(
                f"+{name}: {name} is a setting already; set it without the + ({name}=...)"
            )
        unset = o.value() in (None, "")  # what leaving it out means
        foreign = o.is_add() and not unset and not _a_setting(name, c)  # ++ forces it in
        if (there is _ABSENT and not added) or foreign:
            raise ConfigError(unknown_setting(name, c))


def _check_options(parsed: list) -> tuple[list[str], list]:
    """Refuse an option of a group that ``conf/`` does not have, in the parsed overrides; return
    the group choices as overrides of the first job's config, and the overrides of keys."""
    from hydra.core.override_parser.types import ChoiceSweep

    groups = config_groups()
    chosen, keys = [], []
    for o in parsed:
        key = o.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if key not in groups:
            keys.append(o)
            continue
        value = o.value()
        values = value.list if isinstance(value, ChoiceSweep) else [value]
        if o.is_delete() or (o.is_sweep_override() and not isinstance(value, ChoiceSweep)):
            continue  # glob(...), range(...): Hydra expands them from the options
        for v in values:
            if v is not None and str(v) not in groups[key]:
                raise ConfigError(_unknown_option(key, str(v)))
        prefix = "++" if o.is_force_add() else "+" if o.is_add() else ""
        package = f"@{o.package}" if o.package else ""
        first = "null" if values[0] is None else values[0]
        chosen.append(f"{prefix}{key}{package}={first}")
    return chosen, keys


def _a_setting(name: str, c: Mapping) -> bool:
    """Whether a key added to the plain config ``c`` may be there: a setting of the option its
    group chose (of the group, for ``train`` and ``coding``), a keyword of the optimizer, or a
    key of the user's own outside dcoded's groups."""
    group, _, key = name.partition(".")
    if group not in GROUPS:
        return True
    own = chosen_settings(c, group)
    if own is not None:
        return key in own
    return name in SETTINGS


_ABSENT = object()


def _find(c, name: str):
    """The value at the dotted ``name`` of the plain config ``c`` (``???`` where it is
    missing), or ``_ABSENT`` where there is no such key."""
    for part in name.split("."):
        if not isinstance(c, Mapping) or part not in c:
            return _ABSENT
        c = c[part]
    return c


_HYDRA_ERRORS = _hydra_errors()


def _unknown_option(group: str, option: str) -> str:
    options = [o for o in config_groups()[group] if group in OPTION_KEYS or is_overlay(group, o)]
    options = options or list(config_groups()[group])
    near = difflib.get_close_matches(option, options, 3, 0.6)
    if near and len(options) > 8:
        return f"{group}={option} is not an option of {group}: did you mean {' or '.join(near)}?"
    guess = f": did you mean {' or '.join(near)}?" if near else ""
    listed = ", ".join(options)
    return f"{group}={option} is not an option of {group}{guess} (the options: {listed})"


def config_defaults() -> dict:
    """``conf/config.yaml``'s own values (no group chosen, nothing overridden)."""
    import importlib.resources

    if not _DEFAULTS:
        text = importlib.resources.files(CONFIG_MODULE).joinpath("config.yaml").read_text()
        loaded = OmegaConf.to_container(OmegaConf.create(text))
        _DEFAULTS.update({k: v for k, v in loaded.items() if k not in ("defaults", "hydra")})
    return _DEFAULTS


_DEFAULTS: dict = {}


def multirun_master(overrides: Sequence[str]) -> DictConfig:
    """The config ``python -m dcoded -m OVERRIDES`` composes before its jobs (its ``hydra``
    node included), which :func:`sweep_jobs` expands. Needs Hydra initialised."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    return GlobalHydra.instance().hydra.compose_config(
        "config", list(overrides), run_mode=RunMode.MULTIRUN
    )


def sweep_jobs(master: DictConfig) -> list[tuple[list[str], DictConfig]]:
    """Every job of the multirun whose composed config is ``master`` (with its ``hydra``
    node): its overrides and its config, without ``hydra``, as Hydra's basic sweeper and
    launcher make them: the config's ``hydra.sweeper.params`` first, then the command line's
    overrides (a key given in both takes the command line's value, in the params' place).
    Needs Hydra initialised (inside ``@hydra.main`` or an ``initialize_*`` block)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict

    sweeper = master.hydra.sweeper
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        raise ValueError(f"the sweep runs with {sweeper._target_}, not BasicSweeper")
    loader = GlobalHydra.instance().hydra.config_loader
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    task = OmegaConf.to_container(master.hydra.overrides.task)
    parser = OverridesParser.create(config_loader=loader)
    (batch,) = BasicSweeper.split_arguments(parser.parse_overrides(params + task), None)
    jobs = []
    for job in batch:
        cfg = loader.load_sweep_config(master, list(job))
        with open_dict(cfg):
            del cfg["hydra"]
        jobs.append((list(job), cfg))
    return jobs


def plain(cfg: Mapping) -> dict:
    """``cfg`` as plain dicts, interpolations resolved.

    >>> plain(OmegaConf.create({"a": 1, "b": "${a}"}))
    {'a': 1, 'b': 1}
    >>> plain(OmegaConf.create({"a": "${nope}"}))
    Traceback (most recent call last):
    ...
    dcoded.errors.ConfigError: the config cannot be resolved: Interpolation key 'nope' not found
    """
    if isinstance(cfg, DictConfig):
        register_resolver()  # ${dcoded_best_redundancy:} (experiment=compare), outside the app too
        try:
            out = OmegaConf.to_container(cfg, resolve=True)
        except OmegaConfBaseException as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"the config cannot be resolved: {first}") from None
    else:
        out = dict(cfg)
    return _no_paths(out)  # type: ignore[return-value]


def _no_paths(value):
    """``pathlib`` values (a notebook's ``cfg.dataset.path = Path(...)``) as strings."""
    if isinstance(value, Mapping):
        return {k: _no_paths(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_paths(v) for v in value]
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def build_spec(cfg: Mapping) -> tuple[RunSpec, Replica, Checkpoint | None]:
    """Check ``cfg`` and build the run's :class:`RunSpec`, the driver's own replica (the
    evaluator, and the serial/parameter-server model) and the checkpoint to resume from.

    The data is loaded first (the number of steps of ``train.epochs`` depends on it). Raises
    :class:`~dcoded.errors.ConfigError`, :class:`~dcoded.errors.DatasetError` or
    :class:`~dcoded.errors.CheckpointError`; starts nothing.

    >>> spec, replica, _ = build_spec(compose_config(["coding.redundancy=3", "train.epochs=2"]))
    >>> spec.steps == 2 * (len(replica.data.y_train) // spec.batch_size), spec.redundancy
    (True, 3)
    >>> build_spec(compose_config(["coding.redundancy=5"]))
    Traceback (most recent call last):
    ...
    dcoded.errors.ConfigError: coding.redundancy=5 is not allowed with cluster.n_workers=4: it must be an integer in 1..4
    """  # noqa: E501
    c = plain(cfg)
    check_settings(c)  # each leaf's type and range; what follows checks them together
    algorithm, shuffle, transport, notes, warnings = _choices(c)
    train, coding, cluster = c.get("train", {}), c.get("coding", {}), c.get("cluster", {})
    n_workers = cluster.get("n_workers")
    batch = train.get("batch_size")
    if batch is None:
        raise ConfigError("train.batch_size is not set: it must be an integer >= 1")
    uses_placement = algorithm in ("cdc", "serial")
    placement, m, plan = _layout(coding, n_workers, batch, shuffle, uses_placement)
    r, g = placement.redundancy, coding.get("group_size") if uses_placement else None
    straggle_cfg, stragglers = _stragglers(c, algorithm, placement, shuffle, transport)
    # the scale model (on the emulated network, its driver is told the TDF): every timer that
    # stands for a network or compute time is multiplied by it, every rate divided
    tdf = float((cluster.get("scale") or {}).get("tdf", 1.0))
    by_transport = _transport_fields(c, transport, placement, shuffle, plan, tdf)
    dataset, n_train = _workers_and_data(c, algorithm, batch, uses_placement)
    bucket_cap = c["algorithm"].get("bucket_cap_mb")  # DDP's
    spec = RunSpec(
        algorithm=algorithm,
        n_workers=n_workers,
        batch_size=batch,
        steps=_steps(train, n_train, batch),
        dataset=dataset,
        model=c.get("model", {}),
        optimizer=c.get("optimizer", {}),
        redundancy=r,
        group_size=g,
        shuffle=shuffle,
        hybrid_m=m,
        torch_threads=int(cluster.get("torch_threads", 1)),
        run_id="dc" + uuid.uuid4().hex[:10],
        **_train_fields(train, tdf),
        **by_transport,
        stragglers=stragglers,
        straggler_grace=float(coding.get("straggler_grace", 1.0)),
        straggle=straggle_cfg,
        bucket_cap_mb=float(bucket_cap) if bucket_cap is not None else None,
        dilation=tdf,
        extra={"notes": notes, "warnings": warnings, "config": _as_given(c)},
    )
    reference = _reference(spec)
    return spec, reference, _resume(train.get("resume"), spec, reference)


def _train_fields(train: Mapping, tdf: float) -> dict:
    """The :class:`RunSpec` fields ``train.*`` sets as given (its timers multiplied by the
    scale model's ``tdf``)."""
    return {
        "seed": int(train.get("seed", 0)),
        "eval_every": int(train.get("eval_every", 50) or 0),
        "step_timeout_s": float(train.get("step_timeout_s", 300)) * tdf,
        "setup_timeout_s": float(train.get("setup_timeout_s", 300)) * tdf,
        "checkpoint_every": int(train.get("checkpoint_every") or 0),
        "on_worker_loss": str(train.get("on_worker_loss") or "stop"),
        "replace_within_s": float(train.get("replace_within_s", 30)) * tdf,
        "pipeline": bool(train.get("pipeline", True)),
    }


def _transport_fields(
    c: Mapping, transport: str, placement: Placement, shuffle: str, plan, tdf: float
) -> dict:
    """The :class:`RunSpec` fields of the transport: ``transport.*``, each sender's pace
    (multicast; direct where the links are known) and the wait before a repair (a pace
    divided by the scale model's ``tdf``, the wait multiplied)."""
    cluster, transport_cfg = c.get("cluster", {}), c.get("transport") or {}
    paces, repair_after = None, REPAIR_AFTER_MS
    if transport == "multicast":
        paces = _paces(cluster, transport_cfg, placement, shuffle, plan)
        repair_after = _repair_after_ms(cluster, transport_cfg)
    elif transport == "direct":
        paces = _paces(cluster, transport_cfg, placement, shuffle, plan, multicast=False)
    if paces:
        paces = {phase: pace / tdf for phase, pace in paces.items()}
    return {
        "transport": transport,
        "steps_per_task": transport_cfg.get("steps_per_task", 0),
        "overlap": bool(transport_cfg.get("overlap", True)),
        "pace_mbit": paces,
        "test_drop": float(transport_cfg.get("test_drop") or 0.0),
        "repair_after_s": repair_after / 1000 * tdf,
    }


def _choices(c: Mapping) -> tuple[str, str, str, list[str], list[str]]:
    """``(algorithm, shuffle, transport, notes, warnings)``: the run's named choices, each
    known, with the cluster and TLS they need; the transport is what the run will use
    (``dask`` for all but cdc; multicast where a LAN allows it, else a note why not)."""
    algorithm = c.get("algorithm", {}).get("name")
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r} is not known: choose one of {ALGORITHMS}")
    coding, cluster = c.get("coding", {}), c.get("cluster", {})
    try:
        check_cluster_config(cluster, cluster.get("n_workers"))
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
    _check_tls(cluster, algorithm, transport)
    if algorithm == "serial" and cluster.get("kind") == "netem":
        raise ConfigError("algorithm=serial runs in one process: use cluster=local")
    notes, warnings = [], []
    ignored = ignored_warning(c)  # one line: every setting the run sets and does not read
    if ignored:
        warnings.append(ignored)
    if algorithm != "cdc":  # only cdc's exchange has a choice; the others move through Dask
        transport = "dask"
    if transport == "multicast" and algorithm == "cdc":
        transport, note = _multicast_or_fallback(cluster, transport_cfg)
        notes += [note] if note else []
    return algorithm, shuffle, transport, notes, warnings


def _layout(
    coding: Mapping, n_workers: int, batch: int, shuffle: str, uses_placement: bool
) -> tuple[Placement, int | None, HybridPlan | None]:
    """The placement (``r = 1`` for an algorithm without one), checked against the batch, and
    for a shuffle on a hybrid plan its ``m`` (the least load where not given) and plan."""
    r = coding.get("redundancy", 1) if uses_placement else 1
    g = coding.get("group_size") if uses_placement else None
    m, plan = None, None
    try:
        check_layout(n_workers, r, g, names=CONFIG_NAMES)
        placement = Placement(n_workers, r, g)
        if uses_placement:
            _check_size(placement)
            placement.check_batch(batch, names=CONFIG_NAMES)
        if uses_placement and scheme(shuffle).needs_plan:
            m = coding.get("hybrid_m")
            if m is None:  # the least load for this (g, r), chosen by dcoded.coding
                m = best_m(placement.g, r)
            check_m(placement.g, r, m, names=CONFIG_NAMES)
            plan = hybrid_plan(placement.g, r, m)  # the family is read or solved now
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return placement, m, plan


def _stragglers(
    c: Mapping, algorithm: str, placement: Placement, shuffle: str, transport: str
) -> tuple[dict, int]:
    """``(straggle, stragglers)``: the injected stragglers (``straggle.*``) and how many
    workers cdc does not wait for (``coding.stragglers``; ``max``: the most the layout and
    transport allow), each checked."""
    coding, cluster = c.get("coding", {}), c.get("cluster", {})
    r, n_workers = placement.redundancy, placement.n_workers
    try:
        straggle_cfg = straggle.check(c.get("straggle"), n_workers)
        stragglers = coding.get("stragglers", 0) if algorithm == "cdc" else 0
        if stragglers == "max":  # for sweeps: the most this layout and transport allow
            stragglers = r - 1 if r < n_workers and transport != "dask" else 0
        check_stragglers(stragglers, placement, shuffle, transport)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if straggle_cfg.get("model") == "slow" and cluster.get("kind") == "local":
        straggle_cfg["cgroup"] = bool(cluster.get("processes", 1))
    return straggle_cfg, stragglers


def _workers_and_data(
    c: Mapping, algorithm: str, batch: int, uses_placement: bool
) -> tuple[dict, int]:
    """``(dataset, n_train)``: the dataset with absolute paths (the workers may run in other
    folders), loaded once in this process, after the checks that need no data: DDP's worker
    processes, a batch of at least one sample a worker, the optimizer."""
    cluster, n_workers = c.get("cluster", {}), c.get("cluster", {}).get("n_workers")
    if algorithm == "ddp" and cluster.get("kind") == "local" and not cluster.get("processes", 1):
        raise ConfigError(
            "algorithm=ddp needs worker processes (one torch process group each): "
            "set cluster.processes=true"
        )
    if not uses_placement and batch < n_workers:
        raise ConfigError(
            f"train.batch_size={batch} is too small for {algorithm} with {n_workers} workers: "
            f"it must be >= {n_workers} (B/K samples per worker)"
        )
    try:
        check_optimizer(c.get("optimizer", {}))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    dataset = absolute_path(c.get("dataset", {}))
    check_dataset(dataset)
    n_train = len(cached_dataset(dataset).y_train)  # loads the data, once per process
    if batch > n_train:
        raise ConfigError(f"train.batch_size={batch} exceeds the {n_train} training samples")
    return dataset, n_train


def _reference(spec: RunSpec) -> Replica:
    """The driver's own replica (the evaluator), on the data already loaded: a model that
    does not fit the data's shape is a one-line error."""
    try:
        return Replica(spec)
    except DatasetError:
        raise
    except (ValueError, RuntimeError) as e:
        msg = str(e).splitlines()[0]
        raise ConfigError(
            f"model={spec.model['name']} does not fit dataset={spec.dataset.get('name')}: {msg}"
        ) from None


def _resume(where, spec: RunSpec, reference: Replica) -> Checkpoint | None:
    """The checkpoint of ``train.resume`` (``None`` without one), checked against the run."""
    if not where:
        return None
    resume = load_checkpoint(where)
    if len(resume.theta) != reference.n_params:
        raise ConfigError(
            f"train.resume={where}: the checkpoint has {len(resume.theta)} "
            f"parameters, model={spec.model['name']} here has {reference.n_params}"
        )
    _check_resume(resume, spec, where)
    if resume.step >= spec.steps:
        raise ConfigError(
            f"train.resume={where}: the checkpoint is at step {resume.step}, "
            f"train.steps={spec.steps}: nothing left to run (raise train.steps)"
        )
    return resume


#: The most sub-batches (``C(g, r)``) and groups (``C(g, r + 1)``) a layout may have: every
#: step enumerates them, and the hybrid shuffle's plan more (a layout past this would fill the
#: memory before the first step; the paper's largest, K = 16, has 12,870).
MAX_SETS = 1_000_000


def _check_size(placement: Placement) -> None:
    g, r = placement.g, placement.redundancy
    most = max(math.comb(g, r), math.comb(g, min(r + 1, g)))
    if most > MAX_SETS:
        raise ConfigError(
            f"coding.redundancy={r} with a group of {g} workers makes {most:,} sub-batches or "
            f"groups a step; at most {MAX_SETS:,} are supported (a smaller r, r near g, or "
            "coding.group_size)"
        )


def _check_tls(cluster: Mapping, algorithm: str, transport: str) -> None:
    """With ``cluster.tls.*``, refuse what would send the run's data outside Dask's TLS comms,
    in clear and unauthenticated: DDP's gloo, and multicast datagrams."""
    tls = cluster.get("tls") or (cluster.get("given") or {}).get("tls") or {}
    if not any(tls.get(k) for k in ("ca_file", "cert", "key")):
        return
    if algorithm == "ddp":
        raise ConfigError(
            "algorithm=ddp with cluster.tls.* is refused: DDP's gloo rendezvous and all-reduce "
            "run outside Dask's comms, in clear and unauthenticated (cdc, ssgd and asgd go over "
            "the TLS comms)"
        )
    if transport == "multicast" and algorithm == "cdc":
        raise ConfigError(
            "transport=multicast with cluster.tls.* is refused: its UDP datagrams are neither "
            "encrypted nor authenticated; transport=direct goes over the TLS comms"
        )


def _as_given(c: Mapping) -> dict:
    """The config as the user gave it, for ``summary.json``: the driver of an emulated network
    runs with a cluster of its own (``kind=address``), and records the one it was given."""
    out = dict(c)
    cluster = out.get("cluster") or {}
    if "given" in cluster:
        out["cluster"] = cluster["given"]
    return out


def _steps(train: Mapping, n_train: int, batch: int) -> int:
    """``train.steps``, or ``train.epochs`` whole epochs of the data."""
    steps, epochs = train.get("steps"), train.get("epochs")
    default = config_defaults()["train"]["steps"]
    if epochs is not None and steps is not None and steps != default:
        raise ConfigError(
            f"train.epochs={epochs} and train.steps={steps} are both set: epochs count the "
            f"steps ({epochs} x {steps_per_epoch(n_train, batch)} here); give one of them "
            "(train.steps=null with train.epochs)"
        )
    if epochs is not None:
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ConfigError(
                f"train.epochs={epochs!r} is not allowed: it must be an integer >= 1 "
                "(or null: train.steps counts the steps)"
            )
        steps = epochs * steps_per_epoch(n_train, batch)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(f"train.steps={steps!r} is not allowed: it must be an integer >= 1")
    return steps


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


#: ``transport.repair_after_ms`` where no emulated network says how deep its queues are.
REPAIR_AFTER_MS = 50.0


def _repair_after_ms(cluster: Mapping, transport: Mapping) -> float:
    """How long a datagram may still be on its way after it left its sender:
    ``transport.repair_after_ms``, or on the emulated network every queue of its longest path
    full, plus 5 ms for the processes to be scheduled. A receiver asks again only after
    hearing nothing of a message for that long: sooner, the ask is likely for data still on
    its way (which costs an ask and a marker, not a re-send)."""
    after = transport.get("repair_after_ms")
    if after is not None:
        return float(after)
    links = cluster.get("netem") or (cluster if cluster.get("kind") == "netem" else None)
    if not links:
        return REPAIR_AFTER_MS
    from dcoded.netem import Links

    return Links.from_config(links).queueing_ms() + 5.0


def _paces(
    cluster: Mapping,
    transport: Mapping,
    placement: Placement,
    shuffle: str,
    plan,
    multicast: bool = True,
) -> dict[str, float] | None:
    """Each sender's pace in Mbit/s, per phase (``shuffle``, ``seg``): ``transport.pace_mbit``,
    or the most every sender can use at once without overrunning a link of the emulated
    network (:meth:`dcoded.topology.Shape.paces`): a multicast message leaves once, at
    :data:`~dcoded.topology.PACE_SHARE` of the links; over TCP (``multicast=False``:
    ``transport=direct``) once for each receiver, at :data:`~dcoded.topology.TCP_PACE_SHARE`,
    and ``None`` where the links are not known (nothing is paced).

    Unpaced on the emulated network, a TCP sender's ``K - 1`` connections each put a whole
    message in its link's queue at once (BBR takes the token bucket's burst for the path's
    rate), the queue overflows and the retransmissions double the exchange's time from
    ``K = 6`` up."""
    if transport.get("pace_mbit"):
        pace = float(transport["pace_mbit"])
        return {"shuffle": pace, "seg": pace}
    links = cluster.get("netem") or (cluster if multicast or cluster.get("kind") == "netem" else {})
    if not links.get("bandwidth_mbit"):
        if not multicast:
            return None
        raise ConfigError(
            "transport=multicast on a LAN needs transport.pace_mbit (each sender's rate, Mbit/s)"
        )
    share = PACE_SHARE if multicast else TCP_PACE_SHARE
    phases = step_messages(placement, shuffle, plan)
    paces = Shape.of(links).paces(phases, multicast=multicast, share=share)
    return {"seg" if phase == "params" else phase: pace for phase, pace in paces.items()}


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
