"""Every setting of a run, with its type and range, checked leaf by leaf before anything else
reads the config (and so before any cluster starts).

:data:`SETTINGS` maps each setting, spelled as the config spells it, to what it accepts;
:func:`check_settings` walks the composed config and refuses the first leaf that does not fit
with one :class:`~dcoded.errors.ConfigError` line naming the setting and what it accepts. What
depends on several settings (``coding.redundancy`` against ``cluster.n_workers``, a batch
against ``C(g, r)`` sub-batches, the dataset's files) is checked after this, by
:func:`dcoded.config.build_spec`.

Inside dcoded's own groups a key that is not a setting is refused too (a typo such as
``+train.lerning_rate=0.1`` would otherwise do nothing). The settings of a group's option are
the keys of its file in ``conf/``: an override that adds one of another option
(``+cluster.bandwidth_mbit=100`` on ``cluster=local``, whose links nobody shapes) is refused by
:func:`dcoded.config.check_overrides`; one an experiment sets for another option (run with
``cluster=local``) is named in the warning below. Keys of ``optimizer`` beyond those listed go
to the torch optimizer, which says whether it takes them. Keys at the top level that are not
groups of dcoded (``+tag=baseline``) are the user's own: kept, and recorded in ``summary.json``
with the rest.

:data:`READ_BY` says, for every setting, which algorithms read it and under which other
setting (``train.replace_within_s`` only with ``train.on_worker_loss=continue``);
:func:`ignored_warning` names, in one line, those a run sets but does not read.

>>> check_settings({"train": {"seed": "abc"}})
Traceback (most recent call last):
...
dcoded.errors.ConfigError: train.seed='abc' is not allowed: it must be an integer in 0..4294967295
>>> check_settings({"train": {"lerning_rate": 0.1}})
Traceback (most recent call last):
...
dcoded.errors.ConfigError: train.lerning_rate is not a setting of dcoded (the settings of train: batch_size, checkpoint_every, epochs, eval_every, lr, on_worker_loss, pipeline, replace_within_s, resume, seed, setup_timeout_s, step_timeout_s, steps)
"""  # noqa: E501

from __future__ import annotations

import difflib
import functools
import importlib.resources
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dcoded.coding.shuffles import SHUFFLES, scheme
from dcoded.data.dataset import DATASET_NAMES
from dcoded.engine import ALGORITHMS
from dcoded.engine.spec import TRANSPORTS
from dcoded.engine.straggle import MODELS as STRAGGLE_MODELS
from dcoded.errors import ConfigError
from dcoded.models import MODELS
from dcoded.topology import EMULATED, RACKED

#: What a config leaves unset (Hydra's ``???``): refused where the setting is read.
MISSING = "???"


@dataclass(frozen=True)
class Setting:
    """What one setting accepts: ``test`` on its value, and ``accepts`` in words (and its
    ``options``, where it is a choice among them)."""

    accepts: str
    test: Callable[[Any], bool]
    options: tuple = ()

    def check(self, name: str, value: Any) -> None:
        if not self.test(value):
            raise ConfigError(f"{name}={value!r} is not allowed: it must be {self.accepts}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _or_null(setting: Setting, meaning: str) -> Setting:
    return Setting(
        f"{setting.accepts}, or null ({meaning})", lambda v: v is None or setting.test(v)
    )


def integer(low: int | None = 0, high: int | None = None, null: str | None = None) -> Setting:
    """An integer in ``low..high`` (no upper bound when ``high`` is None; any integer when
    ``low`` is None too: its range depends on other settings, checked with them later)."""
    words = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
    if low is None:
        words, low = "an integer", -math.inf
    s = Setting(words, lambda v: _is_int(v) and v >= low and (high is None or v <= high))
    return _or_null(s, null) if null else s


def number(
    low: float = 0,
    *,
    above: bool = False,
    below: float | None = None,
    unit: str = "",
    null: str | None = None,
) -> Setting:
    """A finite number ``>= low`` (``> low`` with ``above``), ``< below`` if given."""
    words = f"a number {'>' if above else '>='} {low:g}"
    if below is not None:
        words = f"a number in [{low:g}, {below:g})"
    words += f" ({unit})" if unit else ""

    def test(v) -> bool:
        if not _is_number(v):
            return False
        return (v > low if above else v >= low) and (below is None or v < below)

    s = Setting(words, test)
    return _or_null(s, null) if null else s


def flag() -> Setting:
    return Setting("true or false", lambda v: isinstance(v, bool))


def choice(*options, null: str | None = None) -> Setting:
    s = Setting(f"one of {', '.join(map(str, options))}", lambda v: v in options, options)
    return Setting(_or_null(s, null).accepts, _or_null(s, null).test, options) if null else s


def text(null: str | None = None) -> Setting:
    """A non-empty string; with ``null``, also null or ``""`` (both mean unset)."""
    s = Setting("a non-empty string", lambda v: isinstance(v, str) and v not in (MISSING, ""))
    if null:
        return Setting(f"a string, or null ({null})", lambda v: v in (None, "") or s.test(v))
    return s


def integers(low: int = 1, nonempty: bool = False, high: int | None = None) -> Setting:
    """A list of at most 64 integers ``>= low`` (``<= high`` if given)."""
    within = f">= {low}" if high is None else f"in {low}..{high}"
    words = f"a {'non-empty ' if nonempty else ''}list of at most 64 integers {within}"
    return Setting(
        words,
        lambda v: (
            isinstance(v, list | tuple)
            and (bool(v) or not nonempty)
            and len(v) <= 64
            and all(_is_int(x) and x >= low and (high is None or x <= high) for x in v)
        ),
    )


def _betas(v) -> bool:
    return (
        isinstance(v, list | tuple) and len(v) == 2 and all(_is_number(b) and 0 <= b < 1 for b in v)
    )


def _local_store(v) -> bool:
    """A local folder or a ``file:`` URI on this machine (no host): a store on the local disk.

    >>> [_local_store(v) for v in ("mlruns", "/tmp/m", "file:///tmp/m", "http://h:5000")]
    [True, True, True, False]
    """
    if not isinstance(v, str) or v in (MISSING, ""):
        return False
    parts = urlsplit(v)
    if parts.scheme == "file":
        return parts.netloc in ("", "localhost")
    return parts.scheme == "" and "://" not in v


#: The settings that select a config group's option, spelled as the group in messages.
GROUP_CHOICES = {
    "algorithm.name": "algorithm",
    "model.name": "model",
    "dataset.name": "dataset",
    "transport.name": "transport",
    "straggle.model": "straggle",
    "logger.name": "logger",
}

#: The bounds of the sizes a config sets, so that none fills the memory before an error: the
#: workers of one run, a layer's width (and an image side, and the classes), the samples of a
#: synthetic dataset, and the bytes every process would generate of it.
MAX_WORKERS = 1024
MAX_WIDTH = 65_536
MAX_SAMPLES = 100_000_000
MAX_DATA_BYTES = 1 << 33
#: The most parameters a model may have (a gigabyte of float32 in every process, before its
#: optimizer state): ``model.hidden=[65536, 65536]`` would be 4·10⁹.
MAX_MODEL_PARAMS = 1 << 28
#: The sample shape of each dataset with files, ``(C, H, W)``.
SHAPES = {
    "digits": (1, 8, 8),
    "mnist": (1, 28, 28),
    "fashion_mnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
}

#: Set by dcoded itself for the driver of an emulated network (never by hand): not checked.
INTERNAL = (
    "cluster.wire",
    "cluster.namespaces",
    "cluster.worker_ips",
    "cluster.queues",
    "cluster.netem",
    "cluster.given",
    "cluster.scale.",
)

#: Every setting, as the config spells it. ``model.hidden`` is per model (:data:`BY_MODEL`).
SETTINGS: dict[str, Setting] = {
    "algorithm.name": choice(*ALGORITHMS),
    "algorithm.bucket_cap_mb": number(
        0, above=True, unit="MiB", null="torch's default: 25 MiB, its first bucket 1 MiB"
    ),
    "progress": flag(),
    # train
    "train.steps": integer(1, null="train.epochs counts them"),
    "train.epochs": integer(1, null="train.steps counts the steps"),
    "train.batch_size": integer(1),
    "train.lr": number(0, unit="the learning rate"),
    "train.seed": integer(0, 2**32 - 1),
    "train.eval_every": integer(0, null="at the end only"),
    "train.step_timeout_s": number(0, above=True, unit="seconds"),
    "train.setup_timeout_s": number(0, above=True, unit="seconds"),
    "train.on_worker_loss": choice("stop", "continue"),
    "train.replace_within_s": number(0, unit="seconds"),
    "train.checkpoint_every": integer(0, null="no checkpoints"),
    "train.resume": text(null="a new run"),
    "train.pipeline": flag(),
    # coding
    # coding: the ranges depend on cluster.n_workers and on each other, checked with them
    "coding.redundancy": integer(None),
    "coding.group_size": integer(None, null="one group of all n_workers"),
    "coding.shuffle": choice(*SHUFFLES),
    "coding.hybrid_m": integer(None, null="the m of least load"),
    "coding.stragglers": Setting("an integer, or max (r - 1)", lambda v: v == "max" or _is_int(v)),
    "coding.straggler_grace": number(0, unit="a fraction of the first g - s maps' time"),
    # model
    "model.name": choice(*MODELS),
    "model.channels": integers(1, nonempty=True, high=MAX_WIDTH),
    # dataset
    "dataset.name": choice(*DATASET_NAMES),
    "dataset.path": text(null="no files: digits, synthetic"),
    "dataset.shape": Setting(
        "three integers >= 1, [C, H, W]",
        lambda v: integers(1, high=MAX_WIDTH).test(v) and len(v) == 3,
    ),
    "dataset.n_classes": integer(2, MAX_WIDTH),
    "dataset.n_samples": integer(1, MAX_SAMPLES),
    "dataset.n_test": integer(0, MAX_SAMPLES),
    "dataset.seed": integer(0, 2**32 - 1),
    "dataset.validation": number(0, below=1, unit="a fraction of the training samples"),
    # cluster
    "cluster.kind": choice("local", "address", "netem"),
    "cluster.address": Setting("the scheduler's address, such as tcp://HOST:8786", text().test),
    "cluster.n_workers": integer(1, MAX_WORKERS),
    "cluster.processes": flag(),
    "cluster.torch_threads": integer(1),
    "cluster.dashboard": flag(),
    "cluster.log_level": Setting(
        "one of debug, info, warning, error, critical (any case)",
        lambda v: (
            isinstance(v, str) and v.lower() in ("debug", "info", "warning", "error", "critical")
        ),
    ),
    "cluster.start_method": choice("forkserver", "spawn", "fork"),
    "cluster.connect_timeout_s": number(0, above=True, unit="seconds"),
    "cluster.tls.ca_file": text(null="no TLS"),
    "cluster.tls.cert": text(null="no TLS"),
    "cluster.tls.key": text(null="no TLS"),
    "cluster.bandwidth_mbit": number(0, above=True, unit="Mbit/s"),
    "cluster.driver_bandwidth_mbit": number(
        0, above=True, unit="Mbit/s", null="cluster.bandwidth_mbit"
    ),
    "cluster.topology": choice(*EMULATED),
    "cluster.fallback": choice("local", null="refuse where the emulated network cannot be made"),
    "cluster.queue_ms": number(0, above=True, unit="ms"),
    "cluster.rack_size": integer(1, null="no racks"),
    "cluster.uplink_mbit": number(0, above=True, unit="Mbit/s", null="no racks"),
    "cluster.pod_racks": integer(1, null="no pods"),
    "cluster.pod_uplink_mbit": number(0, above=True, unit="Mbit/s", null="no pods"),
    "cluster.scale_model": flag(),
    "cluster.pin_workers": flag(),
    "cluster.host_cores": number(0, above=True, unit="cores"),
    "cluster.dilation": Setting(
        "auto, or a number > 0 (at least the least factor this machine allows)",
        lambda v: v == "auto" or (_is_number(v) and v > 0),
    ),
    # transport
    "transport.name": choice(*TRANSPORTS),
    "transport.steps_per_task": integer(0),
    "transport.overlap": flag(),
    "transport.pace_mbit": number(0, above=True, unit="Mbit/s", null="from the links"),
    "transport.lan": flag(),
    "transport.fallback": choice("direct", null="refuse where there is no multicast"),
    "transport.repair_after_ms": number(0, above=True, unit="ms", null="from the links"),
    "transport.test_drop": number(0, below=1),
    # straggle
    "straggle.model": choice(*STRAGGLE_MODELS),
    "straggle.workers": integers(0, nonempty=True),
    "straggle.speed": Setting(
        "a number in (0, 1] (a fraction of the worker's fair share)",
        lambda v: _is_number(v) and 0 < v <= 1,
    ),
    "straggle.p": Setting("a probability in [0, 1]", lambda v: _is_number(v) and 0 <= v <= 1),
    "straggle.stall_ms": number(0, unit="ms"),
    "straggle.mean_ms": number(0, above=True, unit="ms"),
    # logger: history.csv and summary.json always; tensorboard and mlflow write beside them
    "logger.name": choice("csv", "tensorboard", "mlflow"),
    "logger.log_dir": text(null="the run folder's tensorboard/"),
    "logger.tracking_uri": Setting(
        "a local folder or a file: URI (nothing beyond the local disk), or null (the run "
        "folder's mlruns/)",
        lambda v: v in (None, "") or _local_store(v),
    ),
    "logger.experiment_name": text(),
    # optimizer: these, and any other keyword the torch optimizer takes
    "optimizer._target_": text(),
    "optimizer._partial_": Setting(
        "true (the optimizer is built once per segment)", lambda v: v is True
    ),
    "optimizer.lr": number(0, unit="the learning rate"),
    "optimizer.momentum": number(0),
    "optimizer.dampening": number(0),
    "optimizer.weight_decay": number(0),
    "optimizer.eps": number(0),
    "optimizer.betas": Setting("two numbers in [0, 1)", _betas),
    "optimizer.nesterov": flag(),
    "optimizer.amsgrad": flag(),
    "optimizer.maximize": flag(),
}

#: ``model.hidden``: the dnn's widths, the cnn's one dense layer.
BY_MODEL = {"dnn": integers(1, high=MAX_WIDTH), "cnn": integer(1, MAX_WIDTH)}

#: The groups whose every key is a setting of dcoded (``optimizer``'s extra keys go to torch).
GROUPS = (
    "algorithm",
    "train",
    "coding",
    "model",
    "dataset",
    "cluster",
    "transport",
    "straggle",
    "logger",
)


def leaves(cfg: Mapping, prefix: str = "") -> list[tuple[str, Any]]:
    """The config's leaves as ``(dotted name, value)``; a list is one leaf.

    >>> leaves({"a": 1, "b": {"c": [1, 2], "d": {}}})
    [('a', 1), ('b.c', [1, 2])]
    """
    out = []
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += leaves(value, name + ".")
        else:
            out.append((name, value))
    return out


def check_settings(c: Mapping) -> None:
    """Refuse the first leaf of the plain config ``c`` whose type or range does not fit, and
    any key of dcoded's groups that is not a setting, with one :class:`ConfigError` line."""
    model = (c.get("model") or {}).get("name")
    internal = "given" in (c.get("cluster") or {})  # the emulated network's driver
    for name, value in leaves(c):
        if internal and name.startswith(INTERNAL):
            continue
        _check_leaf(name, value, c, model)
    _check_data_size(c.get("dataset") or {})
    _check_model_size(c.get("model") or {}, c.get("dataset") or {})


def _check_leaf(name: str, value, c: Mapping, model) -> None:
    """Refuse one leaf ``name = value`` of the plain config ``c`` (of model ``model``), as
    :func:`check_settings` says."""
    group = name.split(".")[0]
    known = (*GROUPS, "optimizer", "progress")
    near = [] if group in known else difflib.get_close_matches(group, known, 1, 0.8)
    if near:  # +trian.lr=0.1: not the user's own key, a typo
        raise ConfigError(f"{name} is not a setting of dcoded: did you mean {near[0]}?")
    setting = BY_MODEL.get(model) if name == "model.hidden" else SETTINGS.get(name)
    if group == "optimizer" and name.count(".") > 1:  # a config inside: instantiate runs it
        raise ConfigError(
            f"{name} is not allowed: the optimizer's settings are plain values (no config "
            "with a _target_ inside)"
        )
    if setting is None and group in GROUPS:
        raise ConfigError(unknown_setting(name, c))
    if setting is None:  # the optimizer's own keywords, and the user's top-level keys
        return
    if value in (None, "") and _of_another_option(name, c):  # as if left out (saved before)
        return
    if value == MISSING:
        raise ConfigError(f"{name} is not set: it must be {setting.accepts}")
    if name in GROUP_CHOICES and not setting.test(value):  # a group's option
        raise ConfigError(f"{GROUP_CHOICES[name]}={value!r} is not known: choose {setting.accepts}")
    setting.check(name, value)


def model_params(model: Mapping, shape) -> int:
    """The weights and biases of ``model`` on samples of ``shape`` (C, H, W), ten classes or
    fewer: what :mod:`dcoded.models` builds, counted without building it.

    >>> model_params({"name": "dnn", "hidden": [16]}, (1, 8, 8)) >= 1210
    True
    """
    c, h, w = shape
    if model.get("name") == "cnn":
        total = 0
        for out in model.get("channels") or []:
            total += out * c * 9 + out
            c, h, w = out, h // 2, w // 2
        hidden = model.get("hidden") or 0
        return total + c * h * w * hidden + hidden + (hidden + 1) * 10
    width, total = c * h * w, 0
    for layer in model.get("hidden") or []:
        total += width * layer + layer
        width = layer
    return total + (width + 1) * 10


def _check_model_size(model: Mapping, dataset: Mapping) -> None:
    shape = SHAPES.get(dataset.get("name")) or tuple(dataset.get("shape") or (1, 1, 1))
    n = model_params(model, shape)
    if n > MAX_MODEL_PARAMS:
        raise ConfigError(
            f"model={model.get('name')} with model.hidden={model.get('hidden')} has about "
            f"{n:,} parameters on {dataset.get('name')}; at most {MAX_MODEL_PARAMS:,}"
        )


def _check_data_size(dataset: Mapping) -> None:
    """A synthetic dataset, which every process generates whole: at most
    :data:`MAX_DATA_BYTES` of float32 samples."""
    if dataset.get("name") != "synthetic":
        return
    n = (dataset.get("n_samples") or 0) + (dataset.get("n_test") or 0)
    size = 4 * n * math.prod(dataset.get("shape") or [])
    if size > MAX_DATA_BYTES:
        raise ConfigError(
            f"dataset.n_samples + dataset.n_test = {n:,} samples of shape "
            f"{list(dataset['shape'])} make {size:,} bytes in every process; at most "
            f"{MAX_DATA_BYTES:,}"
        )


def names(group: str) -> list[str]:
    """The settings of one group, as its keys (``cluster.tls`` is one).

    >>> names("straggle")
    ['mean_ms', 'model', 'p', 'speed', 'stall_ms', 'workers']
    """
    keys = {k.split(".")[1] for k in [*SETTINGS, "model.hidden"] if k.startswith(group + ".")}
    return sorted(keys)


# -- the options of each group: the keys of its files in conf/ ---------------------------------

#: The Hydra configs: ``conf/`` at the top of the repository, installed as ``dcoded.conf``.
CONFIG_MODULE = "dcoded.conf"

#: The groups whose option a key of the group names (``cluster=netem`` is ``cluster.kind``):
#: a key of such a group is a setting only where the chosen option's file has it.
#: ``optimizer`` is not one: its keys beyond its file's go to the torch optimizer.
OPTION_KEYS = {
    "algorithm": "name",
    "cluster": "kind",
    "dataset": "name",
    "model": "name",
    "transport": "name",
    "straggle": "model",
    "logger": "name",
}


@functools.cache
def conf_values(path: str) -> dict | None:
    """The values a file of ``conf/`` sets (``"cluster/local.yaml"``), interpolations as
    written; ``None`` where there is no such file."""
    from omegaconf import OmegaConf

    f = importlib.resources.files(CONFIG_MODULE).joinpath(path)
    if not f.is_file():
        return None
    return OmegaConf.to_container(OmegaConf.create(f.read_text())) or {}


def is_overlay(group: str, option: str) -> bool:
    """Whether ``conf/<group>/<option>.yaml`` is an overlay (``# @package _global_``: it
    sets other groups' settings, as ``experiment`` does) rather than a group's settings."""
    f = importlib.resources.files(CONFIG_MODULE).joinpath(f"{group}/{option}.yaml")
    return f.is_file() and "@package _global_" in f.read_text().split("\n", 1)[0]


@functools.cache
def config_groups() -> dict[str, tuple[str, ...]]:
    """Every group of ``conf/`` with its options (the ``.yaml`` files of its folder), Hydra's
    own (``hydra/``) aside.

    >>> config_groups()["algorithm"]
    ('asgd', 'cdc', 'ddp', 'serial', 'ssgd')
    """
    root = importlib.resources.files(CONFIG_MODULE)
    out = {}
    for folder in root.iterdir():
        if not folder.is_dir() or folder.name in ("hydra", "__pycache__"):
            continue
        found = sorted(
            f.name.removesuffix(".yaml") for f in folder.iterdir() if f.name.endswith(".yaml")
        )
        if found:
            out[folder.name] = tuple(found)
    return dict(sorted(out.items()))


def option_settings(group: str, option) -> dict[str, Any] | None:
    """The settings of one option of a group and their values as its file sets them
    (``{"kind": "local", "n_workers": 4, ...}``; ``tls.ca_file`` for a nested one), or
    ``None`` where the group has no such option."""
    if not isinstance(option, str) or option not in config_groups().get(group, ()):
        return None
    return dict(leaves(conf_values(f"{group}/{option}.yaml") or {}))


def chosen_settings(c: Mapping, group: str) -> dict[str, Any] | None:
    """:func:`option_settings` of the option ``c`` chose for ``group`` (``None`` where it chose
    none that ``conf/`` has)."""
    node = c.get(group)
    if group not in OPTION_KEYS or not isinstance(node, Mapping):
        return None
    return option_settings(group, node.get(OPTION_KEYS[group]))


def unknown_setting(name: str, c: Mapping) -> str:
    """Why ``name`` is not a setting of the config ``c``, naming the nearest ones: the option
    of its group that has it, or the names closest to it, or the settings of its group.

    >>> unknown_setting("coding.redundency", {"coding": {"redundancy": 2, "shuffle": "coded"}})
    'coding.redundency is not a setting of dcoded: did you mean coding.redundancy?'
    >>> unknown_setting("cluster.bandwidth_mbit", {"cluster": {"kind": "local"}})[:79]
    'cluster.bandwidth_mbit is not a setting of cluster=local but of cluster=netem ('
    """
    group, _, key = name.partition(".")
    node = c.get(group) if isinstance(c.get(group), Mapping) else None
    own = chosen_settings(c, group) if node is not None else None
    if own is not None and key:
        option = node[OPTION_KEYS[group]]
        others = [
            o for o in config_groups()[group] if o != option and key in option_settings(group, o)
        ]
        if others:
            them = _listed(others)
            return (
                f"{name} is not a setting of {group}={option} but of {group}={them} (the "
                f"settings of {group}={option}: {', '.join(sorted(own))})"
            )
    known = [n for n, _ in leaves(c) if n != name] + [k for k in c if k != name]
    near = difflib.get_close_matches(name, known, 3, 0.75)
    if near:
        return f"{name} is not a setting of dcoded: did you mean {' or '.join(near)}?"
    if node is not None and key:
        mine = sorted(own) if own is not None else names(group) if group in GROUPS else []
        mine = mine or sorted({n for n, _ in leaves(node)} - {key})
        return f"{name} is not a setting of dcoded (the settings of {group}: {', '.join(mine)})"
    return (
        f"{name} is not a setting of dcoded; a key of your own takes a + (+{name}=...) and is "
        "recorded in summary.json"
    )


# -- who reads each setting: a setting a run does not read is named in one warning line -------

#: The algorithms that run on a cluster (``serial`` runs in one process, without one).
ON_A_CLUSTER = tuple(a for a in ALGORITHMS if a != "serial")


@dataclass(frozen=True)
class Read:
    """Who reads a setting: the algorithms ``by``, and, where ``when`` is given as
    ``(setting, test, words)``, only where that other setting passes ``test``; ``same``:
    values that mean what leaving it out means (never warned of)."""

    by: tuple[str, ...] = ALGORITHMS
    when: tuple = ()  # of (setting, test, words): all must hold
    same: tuple = ()

    def unread(self, c: Mapping) -> tuple[str, str] | None:
        """Why the run of the plain config ``c`` does not read this setting, as ``(what makes
        it so, who reads it)``; ``None`` where it does.

        >>> Read(("cdc",)).unread({"algorithm": {"name": "ddp"}})
        ('algorithm=ddp', 'cdc only')
        """
        algorithm = _at(c, "algorithm.name")
        if algorithm not in self.by:
            return f"algorithm={algorithm}", f"{_listed(self.by)} only"
        for other, test, words in self.when:
            if not test(_at(c, other)):
                return spelled(other, _at(c, other)), f"with {words} only"
        return None


_CDC_AND_SERIAL = ("cdc", "serial")
_RECOVERS = ("cdc", "ssgd", "ddp")  # train.on_worker_loss=continue
_RACKS = (("cluster.topology", lambda v: v in RACKED, f"cluster.topology={' or '.join(RACKED)}"),)
_PODS = (("cluster.topology", lambda v: v == "fattree", "cluster.topology=fattree"),)
_SCALED = (("cluster.scale_model", lambda v: v is True, "cluster.scale_model=true"),)
_NO_MULTICAST = (("cluster.kind", lambda v: v != "netem", "a cluster other than netem"),)
_NO_LAN = ("transport.lan", lambda v: v is not True, "transport.lan=false")

#: Every setting (:data:`SETTINGS`, and ``model.hidden``) and who reads it; what a run sets but
#: does not read (neither its default nor a value of ``same``) is named in one warning line.
#: A setting in a file of ``conf/`` that is missing here fails the tests.
READ_BY: dict[str, Read] = {
    "algorithm.name": Read(),
    "algorithm.bucket_cap_mb": Read(("ddp",)),
    "progress": Read(),
    **{f"train.{k}": Read() for k in ("steps", "epochs", "batch_size", "lr", "seed")},
    **{f"train.{k}": Read() for k in ("eval_every", "checkpoint_every", "resume")},
    "train.step_timeout_s": Read(ON_A_CLUSTER),
    "train.setup_timeout_s": Read(ON_A_CLUSTER),
    "train.on_worker_loss": Read(_RECOVERS),
    "train.replace_within_s": Read(
        _RECOVERS,
        (("train.on_worker_loss", lambda v: v == "continue", "train.on_worker_loss=continue"),),
    ),
    "train.pipeline": Read(("cdc",)),
    "coding.redundancy": Read(_CDC_AND_SERIAL, same=(1,)),
    "coding.group_size": Read(_CDC_AND_SERIAL, same=(None,)),
    "coding.shuffle": Read(_CDC_AND_SERIAL),
    "coding.hybrid_m": Read(
        _CDC_AND_SERIAL,
        (
            (
                "coding.shuffle",
                lambda v: v in SHUFFLES and scheme(v).needs_plan,
                "coding.shuffle=" + " or ".join(s for s in SHUFFLES if scheme(s).needs_plan),
            ),
        ),
        same=(None,),
    ),
    "coding.stragglers": Read(("cdc",), same=(0,)),
    "coding.straggler_grace": Read(
        ("cdc",), (("coding.stragglers", lambda v: v not in (0, None), "coding.stragglers > 0"),)
    ),
    **{f"model.{k}": Read() for k in ("name", "hidden", "channels")},
    **{
        f"dataset.{k}": Read()
        for k in ("name", "path", "shape", "n_classes", "n_samples", "n_test", "seed")
    },
    "dataset.validation": Read(),
    # the cluster: the workers and their threads are the layout's (serial computes as they
    # would); the rest is how a cluster is started or joined, which serial never does
    "cluster.n_workers": Read(),
    "cluster.torch_threads": Read(),
    **{
        f"cluster.{k}": Read(ON_A_CLUSTER)
        for k in (
            "kind address processes dashboard log_level start_method connect_timeout_s "
            "tls.ca_file tls.cert tls.key bandwidth_mbit driver_bandwidth_mbit topology "
            "queue_ms scale_model pin_workers fallback"
        ).split()
    },
    "cluster.rack_size": Read(ON_A_CLUSTER, _RACKS),
    "cluster.uplink_mbit": Read(ON_A_CLUSTER, _RACKS),
    "cluster.pod_racks": Read(ON_A_CLUSTER, _PODS),
    "cluster.pod_uplink_mbit": Read(ON_A_CLUSTER, _PODS),
    "cluster.host_cores": Read(ON_A_CLUSTER, _SCALED),
    "cluster.dilation": Read(ON_A_CLUSTER, _SCALED),
    # the transport: cdc's exchange only (the others move through Dask)
    "transport.name": Read(("cdc",), same=("dask",)),
    **{
        f"transport.{k}": Read(("cdc",))
        for k in ("steps_per_task", "overlap", "pace_mbit", "repair_after_ms", "test_drop")
    },
    "transport.lan": Read(("cdc",), _NO_MULTICAST),
    "transport.fallback": Read(("cdc",), (*_NO_MULTICAST, _NO_LAN)),
    **{
        f"straggle.{k}": Read(ON_A_CLUSTER)
        for k in ("model", "workers", "speed", "p", "stall_ms", "mean_ms")
    },
    **{f"logger.{k}": Read() for k in ("name", "log_dir", "tracking_uri", "experiment_name")},
    **{
        f"optimizer.{k}": Read()
        for k in (
            "_target_ _partial_ lr momentum dampening weight_decay eps betas nesterov amsgrad "
            "maximize"
        ).split()
    },
}


def _at(c: Mapping, name: str):
    """The value of the dotted ``name`` in ``c`` (``None`` where it is not there)."""
    for part in name.split("."):
        c = c.get(part) if isinstance(c, Mapping) else None
    return c


def spelled(name: str, value) -> str:
    """``name=value`` as the command line says it: an option by its group (``cluster=netem``)."""
    group, _, key = name.partition(".")
    return f"{group}={value}" if OPTION_KEYS.get(group) == key else f"{name}={value}"


def default_of(name: str, c: Mapping):
    """What ``name`` is where nobody set it: an option key's the option ``conf/config.yaml``
    chooses (``transport.name``: ``direct``), another key of a group its chosen option's file's
    value, a key of ``conf/config.yaml`` its value there."""
    group, _, key = name.partition(".")
    if OPTION_KEYS.get(group) == key:
        for entry in (conf_values("config.yaml") or {}).get("defaults", []):
            if isinstance(entry, Mapping) and group in entry:
                return entry[group]
        return None
    own = chosen_settings(c, group)
    if own is not None:
        return own.get(key)
    return _at(conf_values("config.yaml") or {}, name)


def ignored_settings(c: Mapping) -> list[tuple[str, str, str]]:
    """The settings of the plain config ``c`` that its run does not read, set to something
    that is neither their default nor what leaving them out means, as ``(what makes it so,
    name=value, who reads it)``.

    >>> ignored_settings({"algorithm": {"name": "ddp"}, "coding": {"stragglers": 1}})
    [('algorithm=ddp', 'coding.stragglers=1', 'cdc only')]
    >>> ignored_settings({"algorithm": {"name": "ssgd"}, "coding": {"redundancy": 1}})
    []
    """
    cluster = c.get("cluster") or {}
    if "given" in cluster:  # the emulated network's driver: the cluster the user gave
        c = {**c, "cluster": cluster["given"]}
    out = []
    for name, value in leaves(c):
        read = READ_BY.get(name)
        if read is None or value == default_of(name, c) or any(value == v for v in read.same):
            continue
        unread = _of_another_option(name, c) or read.unread(c)
        if unread:
            out.append((unread[0], spelled(name, value), unread[1]))
    return out


def _of_another_option(name: str, c: Mapping) -> tuple[str, str] | None:
    """Where ``name`` is a setting of other options of its group than the chosen one (an
    experiment written for ``cluster=netem`` run with ``cluster=local``): ``(the chosen
    option, the others)``."""
    group, _, key = name.partition(".")
    own = chosen_settings(c, group)
    if own is None or key in own:
        return None
    others = [o for o in config_groups()[group] if key in (option_settings(group, o) or {})]
    if not others:
        return None
    return f"{group}={c[group][OPTION_KEYS[group]]}", f"{group}={_listed(others)} only"


def _listed(names) -> str:
    """``a, b and c``.

    >>> _listed(["cdc", "ssgd", "ddp"])
    'cdc, ssgd and ddp'
    """
    names = list(names)
    return ", ".join(names[:-1]) + " and " * (len(names) > 1) + names[-1]


def ignored_warning(c: Mapping) -> str | None:
    """One line naming every setting :func:`ignored_settings` finds, by what makes it unread
    (``algorithm=asgd ignores train.on_worker_loss=continue (cdc, ssgd and ddp only)``), or
    ``None``.

    >>> ignored_warning({"algorithm": {"name": "ssgd"}, "coding": {"redundancy": 3,
    ...                  "shuffle": "summed", "stragglers": 1}})
    'algorithm=ssgd ignores coding.redundancy=3, coding.shuffle=summed (cdc and serial only), coding.stragglers=1 (cdc only)'
    """  # noqa: E501
    by: dict[str, list[list]] = {}
    for why, setting, who in ignored_settings(c):
        items = by.setdefault(why, [])
        if items and items[-1][1] == who:  # one "(who)" for a run of settings alike
            items[-1][0].append(setting)
        else:
            items.append([[setting], who])
    if not by:
        return None
    return "; ".join(
        f"{why} ignores " + ", ".join(f"{', '.join(names)} ({who})" for names, who in items)
        for why, items in by.items()
    )
