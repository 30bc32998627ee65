"""The entry points by dataset name: check, list the files of, and load a dataset.

Each reader module (:mod:`~dcoded.data.digits`, :mod:`~dcoded.data.idx`,
:mod:`~dcoded.data.cifar`, :mod:`~dcoded.data.synthetic`) offers the same three functions
``check(cfg)``, ``files(cfg)`` and ``load(cfg)``; :data:`READERS` maps each of
:data:`~dcoded.data.dataset.DATASET_NAMES` to its reader. Every worker loads the dataset itself
from local files; nothing is ever downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from dcoded.data import cifar, digits, idx, synthetic
from dcoded.data.dataset import DATASET_NAMES, Dataset
from dcoded.errors import DatasetError

__all__ = [
    "READERS",
    "absolute_path",
    "check_dataset",
    "dataset_files",
    "hold_out",
    "load_dataset",
]

#: The seed of the permutation that picks the held-out samples (``dataset.validation``): one
#: split for every ``train.seed``, so that a tuning sweep over seeds sees the same samples.
VALIDATION_SEED = 20210401

READERS: dict[str, ModuleType] = {
    "digits": digits,
    "mnist": idx,
    "fashion_mnist": idx,
    "cifar10": cifar,
    "synthetic": synthetic,
}
"""The reader module of each dataset name."""


def check_dataset(cfg: Mapping[str, Any]) -> None:
    """Validate the dataset settings and files cheaply, before any cluster starts.

    Checks that the name is known, the settings are well-formed and the required files exist
    with readable, mutually consistent headers. IDX files are checked by header and exact
    length (gzipped ones are decompressed as a stream, not held in memory); CIFAR batches are
    unpickled one at a time with the restricted unpickler and their keys, shapes and labels
    checked, without converting them to float. Label files are read whole (they are small)
    and their range checked.

    Parameters
    ----------
    cfg : Mapping
        The ``dataset`` config (keys ``name``, ``path``, and for ``synthetic`` ``shape``,
        ``n_classes``, ``n_samples``, ``n_test``, ``seed``).

    Raises
    ------
    DatasetError
        On the first problem found.
    """
    READERS[_name(cfg)].check(cfg)


def absolute_path(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset config with ``path`` made absolute against this process's folder.

    The driver resolves it before sending it: workers may run in other folders (or on other
    machines, where the data must then be at that same absolute path).

    >>> absolute_path({"name": "mnist", "path": "/data/./mnist"})
    {'name': 'mnist', 'path': '/data/mnist'}
    >>> absolute_path({"name": "digits", "path": None})["path"] is None
    True
    """
    out = dict(cfg)
    raw = out.get("path")
    if raw is not None and str(raw) != "":
        out["path"] = os.path.abspath(os.path.expanduser(str(raw)))
    return out


def dataset_files(cfg: Mapping[str, Any]) -> list[Path]:
    """The files a load of this dataset reads (none for ``digits`` and ``synthetic``).

    Raises
    ------
    DatasetError
        If the folder or a file is missing.
    """
    return READERS[_name(cfg)].files(cfg)


def load_dataset(cfg: Mapping[str, Any]) -> Dataset:
    """Load and normalize the dataset named by ``cfg.name``.

    Parameters
    ----------
    cfg : Mapping
        The ``dataset`` config; see :func:`check_dataset`.

    Returns
    -------
    Dataset
        The normalized train and test arrays.

    Raises
    ------
    DatasetError
        If a setting is wrong or a file is missing or malformed.
    """
    data = READERS[_name(cfg)].load(cfg)
    fraction = cfg.get("validation") or 0
    return hold_out(data, float(fraction)) if fraction else data


def hold_out(data: Dataset, fraction: float) -> Dataset:
    """The training samples split in two: ``fraction`` of them (picked by a permutation of
    :data:`VALIDATION_SEED`) take the test set's place, the rest are trained on. The test
    samples are left out altogether, so a learning rate tuned on this split never saw them
    (``dataset.validation``; the summary's ``evaluated_on`` says which set was evaluated).

    >>> from dcoded.data.dataset import Dataset
    >>> x = np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1)
    >>> d = Dataset("toy", x, np.arange(10) % 2, x[:2].copy(), np.zeros(2, np.int64), 2)
    >>> held = hold_out(d, 0.3)
    >>> len(held.y_train), len(held.y_test)
    (7, 3)
    >>> sorted(np.concatenate([held.x_train, held.x_test]).ravel().tolist()) == list(range(10))
    True
    """
    n = len(data.y_train)
    k = round(fraction * n)
    if not 0 < k < n:
        raise DatasetError(
            f"dataset.validation={fraction:g} of {n} training samples holds out {k}: it must "
            "leave at least one sample on each side"
        )
    order = np.random.default_rng(VALIDATION_SEED).permutation(n)
    keep, held = np.sort(order[k:]), np.sort(order[:k])
    return replace(
        data,
        x_train=np.ascontiguousarray(data.x_train[keep]),
        y_train=data.y_train[keep],
        x_test=np.ascontiguousarray(data.x_train[held]),
        y_test=data.y_train[held],
    )


def _name(cfg: Mapping[str, Any]) -> str:
    name = cfg.get("name")
    if name not in DATASET_NAMES:
        raise DatasetError(f"dataset.name={name!r} is unknown; expected one of {DATASET_NAMES}")
    return str(name)
