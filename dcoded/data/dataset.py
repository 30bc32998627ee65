"""The dataset container and the deterministic sample order shared by every algorithm.

A :class:`Dataset` holds normalized, in-memory train and test arrays; the readers
(:mod:`dcoded.data.digits`, :mod:`~dcoded.data.idx`, :mod:`~dcoded.data.cifar`,
:mod:`~dcoded.data.synthetic`) build one and :mod:`dcoded.data.load` picks the reader by name.

Sample order: the order of the training samples is a pure function of ``(seed, epoch)``
(:func:`epoch_permutation`), an epoch has :func:`steps_per_epoch` steps, and global step ``s``
takes the next ``B`` samples of that order (:func:`step_indices`), so every algorithm and every
redundancy ``r`` sees exactly the same samples at every step (which the placement then cuts
into sub-batches).

Normalization (:func:`normalize`): pixels are first scaled to ``[0, 1]`` (digits ``/16``, the
others ``/255``) and then standardized with the fixed per-dataset, per-channel constants in
:data:`NORMALIZATION` (``x = (x01 - mean) / std``). The synthetic data are generated with zero
mean and unit variance per pixel and are not rescaled.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dcoded.errors import DatasetError

__all__ = [
    "DATASET_NAMES",
    "NORMALIZATION",
    "Dataset",
    "dataset_folder",
    "epoch_permutation",
    "nonneg_int",
    "normalize",
    "step_indices",
    "steps_per_epoch",
]

DATASET_NAMES = ("digits", "mnist", "fashion_mnist", "cifar10", "synthetic")
"""The names ``cfg.name`` may take."""

NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    # Mean and std of all 1797 digits after /16.
    "digits": ((0.3053,), (0.3760,)),
    # The customary training-set constants of each dataset after /255.
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
"""Per-channel ``(mean, std)`` applied to pixels already scaled to ``[0, 1]``."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """An in-memory, normalized dataset.

    Parameters
    ----------
    name : str
        One of :data:`DATASET_NAMES`.
    x_train, x_test : numpy.ndarray
        float32, C-contiguous, shape ``(N, C, H, W)``, normalized as described in the module
        docstring.
    y_train, y_test : numpy.ndarray
        int64, shape ``(N,)``, values in ``0 .. n_classes - 1``.
    n_classes : int
        Number of classes.

    Notes
    -----
    ``eq=False``: comparing arrays elementwise has no truth value, so datasets compare (and
    hash) by identity.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            # Catch construction bugs here rather than deep inside a worker.
            if x.dtype != np.float32 or x.ndim != 4 or not x.flags.c_contiguous:
                raise DatasetError(
                    f"{self.name}: x_{split} must be C-contiguous float32 (N, C, H, W), "
                    f"got {x.dtype} {x.shape}"
                )
            if y.dtype != np.int64 or y.shape != (x.shape[0],):
                raise DatasetError(
                    f"{self.name}: y_{split} must be int64 of shape ({x.shape[0]},), "
                    f"got {y.dtype} {y.shape}"
                )
            if y.size and (int(y.min()) < 0 or int(y.max()) >= self.n_classes):
                raise DatasetError(
                    f"{self.name}: y_{split} must lie in 0..{self.n_classes - 1}, "
                    f"found {int(y.min())}..{int(y.max())}"
                )
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise DatasetError(
                f"{self.name}: train and test sample shapes differ: "
                f"{self.x_train.shape[1:]} vs {self.x_test.shape[1:]}"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        """The shape ``(C, H, W)`` of one sample."""
        c, h, w = self.x_train.shape[1:]
        return int(c), int(h), int(w)

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, shape={self.shape}, n_classes={self.n_classes}, "
            f"n_train={len(self.y_train)}, n_test={len(self.y_test)})"
        )


# --------------------------------------------------------------------------- sample order


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the ``n`` training samples in epoch ``epoch``.

    Parameters
    ----------
    n : int
        Number of training samples.
    seed : int
        Non-negative run seed.
    epoch : int
        Non-negative epoch number.

    Returns
    -------
    numpy.ndarray
        ``np.random.default_rng([seed, epoch]).permutation(n)`` as int64.

    Examples
    --------
    >>> epoch_permutation(6, seed=0, epoch=0)
    array([3, 2, 5, 4, 0, 1])
    """
    n, seed, epoch = (
        nonneg_int(v, label) for v, label in ((n, "n"), (seed, "seed"), (epoch, "epoch"))
    )
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64, copy=False)


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    """The number of steps in one epoch: ``n_train // batch_size``.

    The partial tail of ``n_train % batch_size`` samples is dropped from every epoch; this is
    the one definition of an epoch's length that :func:`step_indices` and the training loops
    share.

    Parameters
    ----------
    n_train : int
        Number of training samples.
    batch_size : int
        Samples per step, ``1 <= batch_size <= n_train``.

    Raises
    ------
    DatasetError
        If ``batch_size`` is outside ``1 .. n_train`` or an argument is negative.

    Examples
    --------
    >>> steps_per_epoch(103, 10)
    10
    >>> steps_per_epoch(100, 100)
    1
    """
    n_train = nonneg_int(n_train, "n_train")
    batch_size = nonneg_int(batch_size, "batch_size")
    if not 1 <= batch_size <= n_train:
        raise DatasetError(f"batch_size must be in 1..n_train={n_train}, got {batch_size}")
    return n_train // batch_size


def step_indices(n_train: int, batch_size: int, seed: int, step: int) -> tuple[int, np.ndarray]:
    """The epoch and the sample indices of global step ``step``.

    Parameters
    ----------
    n_train : int
        Number of training samples.
    batch_size : int
        Samples per step, ``1 <= batch_size <= n_train``.
    seed : int
        Non-negative run seed.
    step : int
        Non-negative, 0-based global step.

    Returns
    -------
    epoch : int
        ``step // S`` with ``S = steps_per_epoch(n_train, batch_size)``; the partial tail of
        every epoch is dropped.
    indices : numpy.ndarray
        int64, the ``batch_size`` entries ``i * B .. (i + 1) * B`` of
        ``epoch_permutation(n_train, seed, epoch)``, with ``i = step % S``.

    Raises
    ------
    DatasetError
        If ``batch_size`` is outside ``1 .. n_train`` or an argument is negative.

    Examples
    --------
    Step 4 with 3 steps per epoch is the second batch of epoch 1:

    >>> epoch, indices = step_indices(10, batch_size=3, seed=7, step=4)
    >>> epoch, bool((indices == epoch_permutation(10, seed=7, epoch=1)[3:6]).all())
    (1, True)
    """
    n_train = nonneg_int(n_train, "n_train")
    batch_size = nonneg_int(batch_size, "batch_size")
    step = nonneg_int(step, "step")
    epoch, i = divmod(step, steps_per_epoch(n_train, batch_size))
    perm = epoch_permutation(n_train, seed, epoch)
    # Copy so callers never hold a view that pins the whole permutation.
    return epoch, perm[i * batch_size : (i + 1) * batch_size].copy()


# --------------------------------------------------------------------------- reader helpers


def nonneg_int(value: Any, label: str) -> int:
    """``value`` as a non-negative int; :class:`DatasetError` naming ``label`` otherwise."""
    # Reject bools and floats: a 1.0 batch size is almost certainly a config slip.
    if isinstance(value, bool):
        raise DatasetError(f"{label} must be a non-negative integer, got {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        raise DatasetError(f"{label} must be a non-negative integer, got {value!r}") from None
    if out < 0:
        raise DatasetError(f"{label} must be a non-negative integer, got {value!r}")
    return out


def dataset_folder(cfg: Mapping[str, Any], name: str, expected: Sequence[str]) -> Path:
    """The existing folder ``cfg.path`` (``~`` expanded) that should hold ``expected``."""
    # Mapping.get works for dicts and DictConfig alike (struct mode included).
    raw = cfg.get("path")
    if raw is None or str(raw) == "":
        raise DatasetError(
            f"dataset.path is not set for {name}; it must be a folder holding {list(expected)} "
            "(nothing is downloaded)"
        )
    folder = Path(str(raw)).expanduser()
    if not folder.is_dir():
        raise DatasetError(
            f"dataset.path {str(folder)!r} for {name} is not a folder; expected a folder "
            f"holding {list(expected)} (nothing is downloaded)"
        )
    return folder


def normalize(raw: np.ndarray, scale: float, name: str) -> np.ndarray:
    """uint8/float ``(N, C, H, W)`` -> C-contiguous float32 ``(raw / scale - mean) / std``."""
    x = np.ascontiguousarray(raw, dtype=np.float32)
    if x is raw:
        x = x.copy()
    mean, std = NORMALIZATION[name]
    # Fold the scale into per-channel constants so the work is one multiply-add in place.
    a = (1.0 / (scale * np.asarray(std, dtype=np.float64))).astype(np.float32)
    b = (-np.asarray(mean, dtype=np.float64) / np.asarray(std, dtype=np.float64)).astype(np.float32)
    x *= a[None, :, None, None]
    x += b[None, :, None, None]
    return x
