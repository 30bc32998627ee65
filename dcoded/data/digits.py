"""Reader for ``digits``: scikit-learn's bundled 8×8 digits (1797 images, shape ``(1, 8, 8)``).

Split: a fixed permutation ``np.random.default_rng(0).permutation(1797)``; its first 1500
entries are the training set and its last 297 (about 1/6) the test set, each kept in
permutation order. Pixels are scaled by ``/16`` before normalization.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dcoded.data.dataset import Dataset, normalize
from dcoded.errors import DatasetError

DIGITS_N_TEST = 297
"""Size of the digits test split (the last 297 entries of the seed-0 permutation)."""


def check(cfg: Mapping[str, Any]) -> None:
    """Nothing to check cheaply: the data ship with scikit-learn."""


def files(cfg: Mapping[str, Any]) -> list[Path]:
    """No files of the user's: the data ship with scikit-learn."""
    return []


def _digits_file() -> Path:
    """scikit-learn's bundled ``digits.csv.gz``, found without importing scikit-learn (whose
    import costs every worker process seconds)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("dataset=digits needs scikit-learn installed (it bundles the data)")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise DatasetError(f"dataset=digits: scikit-learn's bundled file {path} is missing")
    return path


def load(cfg: Mapping[str, Any]) -> Dataset:
    """The digits dataset (``cfg`` is not read: the data and split are fixed).

    >>> load({"name": "digits"})
    Dataset(name='digits', shape=(1, 8, 8), n_classes=10, n_train=1500, n_test=297)
    """
    # the same values as sklearn.datasets.load_digits(): 64 pixel columns (0..16), then the label
    table = np.loadtxt(_digits_file(), delimiter=",", dtype=np.float64)
    images = table[:, :64].reshape(-1, 1, 8, 8)
    labels = table[:, 64].astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(labels))
    train, test = perm[:-DIGITS_N_TEST], perm[-DIGITS_N_TEST:]
    return Dataset(
        name="digits",
        x_train=normalize(images[train], 16.0, "digits"),
        y_train=labels[train],
        x_test=normalize(images[test], 16.0, "digits"),
        y_test=labels[test],
        n_classes=10,
    )
