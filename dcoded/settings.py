"""Every setting of a run, with its type and range, checked leaf by leaf before anything else
reads the config (and so before any cluster starts).

:data:`SETTINGS` maps each setting, spelled as the config spells it, to what it accepts;
:func:`check_settings` walks the composed config and refuses the first leaf that does not fit
with one :class:`~dcoded.errors.ConfigError` line naming the setting and what it accepts. What
depends on several settings (``coding.redundancy`` against ``cluster.n_workers``, a batch
against ``C(g, r)`` sub-batches, the dataset's files) is checked after this, by
:func:`dcoded.config.build_spec`.

Inside dcoded's own groups a key that is not a setting is refused too (a typo such as
``+train.lerning_rate=0.1`` would otherwise do nothing). Keys of ``optimizer`` beyond those
listed go to the torch optimizer, which says whether it takes them. Keys at the top level that
are not groups of dcoded (``+tag=baseline``) are the user's own: kept, and recorded in
``summary.json`` with the rest.

>>> check_settings({"train": {"seed": "abc"}})
Traceback (most recent call last):
...
dcoded.errors.ConfigError: train.seed='abc' is not allowed: it must be an integer in 0..4294967295
>>> check_settings({"train": {"lerning_rate": 0.1}})
Traceback (most recent call last):
...
dcoded.errors.ConfigError: train.lerning_rate is not a setting of dcoded (the settings of train: batch_size, checkpoint_every, epochs, eval_every, lr, on_worker_loss, pipeline, replace_within_s, resume, seed, step_timeout_s, steps)
"""  # noqa: E501

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dcoded.coding.shuffles import SHUFFLES
from dcoded.data.dataset import DATASET_NAMES
from dcoded.engine import ALGORITHMS
from dcoded.engine.spec import TRANSPORTS
from dcoded.engine.straggle import MODELS as STRAGGLE_MODELS
from dcoded.errors import ConfigError
from dcoded.models import MODELS
from dcoded.topology import EMULATED

#: What a config leaves unset (Hydra's ``???``): refused where the setting is read.
MISSING = "???"


@dataclass(frozen=True)
class Setting:
    """What one setting accepts: ``test`` on its value, and ``accepts`` in words."""

    accepts: str
    test: Callable[[Any], bool]

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
    s = Setting(f"one of {', '.join(map(str, options))}", lambda v: v in options)
    return _or_null(s, null) if null else s


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
        group = name.split(".")[0]
        near = difflib.get_close_matches(group, [*GROUPS, "optimizer", "progress"], 1, 0.8)
        if near and near[0] != group:  # +trian.lr=0.1: not the user's own key, a typo
            raise ConfigError(f"{name} is not a setting of dcoded: did you mean {near[0]}?")
        setting = BY_MODEL.get(model) if name == "model.hidden" else SETTINGS.get(name)
        if group == "optimizer" and name.count(".") > 1:  # a config inside: instantiate runs it
            raise ConfigError(
                f"{name} is not allowed: the optimizer's settings are plain values (no config "
                "with a _target_ inside)"
            )
        if setting is None and group in GROUPS:
            raise ConfigError(
                f"{name} is not a setting of dcoded (the settings of {group}: "
                f"{', '.join(names(group))})"
            )
        if setting is None:  # the optimizer's own keywords, and the user's top-level keys
            continue
        if value == MISSING:
            raise ConfigError(f"{name} is not set: it must be {setting.accepts}")
        if name in GROUP_CHOICES and not setting.test(value):  # a group's option
            raise ConfigError(
                f"{GROUP_CHOICES[name]}={value!r} is not known: choose {setting.accepts}"
            )
        setting.check(name, value)
    _check_data_size(c.get("dataset") or {})
    _check_model_size(c.get("model") or {}, c.get("dataset") or {})


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
