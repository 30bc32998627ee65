"""Reader for ``cifar10``: the python-pickle batches of CIFAR-10.

The batches ``data_batch_1`` … ``data_batch_5`` and ``test_batch`` lie in ``cfg.path`` or its
``cifar-10-batches-py`` subfolder. They are read with a restricted unpickler that only admits
numpy's array-reconstruction helpers, so a tampered batch cannot run code. Pixels are scaled by
``/255`` before normalization.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from dcoded.data.dataset import Dataset, dataset_folder, normalize
from dcoded.errors import DatasetError

CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch"
CIFAR_SUBFOLDER = "cifar-10-batches-py"
CIFAR_ROW = 3 * 32 * 32


def check(cfg: Mapping[str, Any]) -> None:
    """Unpickle the batches one at a time and check keys, shapes and labels, without
    converting them to float."""
    folder = _cifar_folder(cfg)
    for fname in (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE):
        _cifar_batch(folder / fname)


def files(cfg: Mapping[str, Any]) -> list[Path]:
    """The six batch files a load reads."""
    folder = _cifar_folder(cfg)
    return [folder / f for f in (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE)]


def load(cfg: Mapping[str, Any]) -> Dataset:
    """The dataset in the six batches, with every check of :func:`check` applied."""
    folder = _cifar_folder(cfg)
    train = [_cifar_batch(folder / f) for f in CIFAR_TRAIN_FILES]
    x_test, y_test = _cifar_batch(folder / CIFAR_TEST_FILE)
    x_train = np.concatenate([x for x, _ in train]).reshape(-1, 3, 32, 32)
    y_train = np.concatenate([y for _, y in train])
    return Dataset(
        name="cifar10",
        x_train=normalize(x_train, 255.0, "cifar10"),
        y_train=y_train,
        x_test=normalize(x_test.reshape(-1, 3, 32, 32), 255.0, "cifar10"),
        y_test=y_test,
        n_classes=10,
    )


def _numpy_globals() -> dict[tuple[str, str], Callable[..., Any]]:
    try:
        from numpy._core.multiarray import _reconstruct
        from numpy._core.numeric import _frombuffer
    except ImportError:  # numpy < 2 has no numpy._core
        from numpy.core.multiarray import _reconstruct
        from numpy.core.numeric import _frombuffer

    # Files written under numpy 1.x name numpy.core, under 2.x numpy._core; same objects.
    return {
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy.core.numeric", "_frombuffer"): _frombuffer,
        ("numpy._core.numeric", "_frombuffer"): _frombuffer,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only numpy's array-reconstruction globals.

    Everything else (``os.system``, ``builtins.eval``, ...) raises :class:`DatasetError`
    before it can be called, so a tampered batch file cannot run code.

    >>> import io
    >>> _RestrictedUnpickler(io.BytesIO(pickle.dumps(print)), Path("b")).load()
    Traceback (most recent call last):
    dcoded.errors.DatasetError: b: pickle refers to the disallowed global builtins.print; ...
    """

    def __init__(self, file: BinaryIO, path: Path) -> None:
        # encoding="bytes": the official batches are Python 2 pickles with str keys.
        super().__init__(file, encoding="bytes")
        self._path = path
        self._allowed = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise DatasetError(
                f"{self._path}: pickle refers to the disallowed global {module}.{name}; only "
                "numpy array reconstruction is allowed in CIFAR-10 batches"
            ) from None


def _cifar_folder(cfg: Mapping[str, Any]) -> Path:
    expected = [*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE]
    folder = dataset_folder(cfg, "cifar10", expected)
    for candidate in (folder, folder / CIFAR_SUBFOLDER):
        if all((candidate / f).is_file() for f in expected):
            return candidate
    missing = [f for f in expected if not (folder / f).is_file()]
    raise DatasetError(
        f"cifar10: missing {missing} in {str(folder)!r} (also looked in its {CIFAR_SUBFOLDER} "
        f"subfolder); expected the python-pickle batches {expected} (nothing is downloaded)"
    )


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Unpickle one batch safely and return ``(uint8 (N, 3072), int64 (N,))``."""
    try:
        with open(path, "rb") as f:
            obj = _RestrictedUnpickler(f, path).load()
    except DatasetError:
        raise
    except Exception as exc:
        # A malformed pickle can fail in many ways; all of them mean a bad file.
        raise DatasetError(f"{path}: not a readable CIFAR-10 pickle batch ({exc!r})") from exc
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    # Python 2 batches give bytes keys; accept str keys too for re-pickled copies.
    data = obj.get(b"data", obj.get("data"))
    labels = obj.get(b"labels", obj.get("labels"))
    if data is None or labels is None:
        raise DatasetError(
            f"{path}: batch dict lacks b'data' or b'labels' (keys: {sorted(map(repr, obj))})"
        )
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        raise DatasetError(
            f"{path}: b'data' must be a uint8 array, got "
            f"{getattr(data, 'dtype', type(data).__name__)}"
        )
    if data.ndim != 2 or data.shape[1] != CIFAR_ROW:
        raise DatasetError(f"{path}: b'data' must have shape (N, {CIFAR_ROW}), got {data.shape}")
    # Check element types first: np.asarray would silently truncate floats to ints.
    if isinstance(labels, np.ndarray):
        ints = labels.dtype.kind in "iu"
    else:
        ints = isinstance(labels, list | tuple) and all(
            isinstance(v, int | np.integer) and not isinstance(v, bool) for v in labels
        )
    if not ints:
        raise DatasetError(f"{path}: b'labels' must be a list of ints")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except OverflowError as exc:
        raise DatasetError(f"{path}: b'labels' must be a list of ints in 0..9 ({exc})") from exc
    if y.shape != (data.shape[0],):
        raise DatasetError(
            f"{path}: {data.shape[0]} images but b'labels' has shape {y.shape}; expected "
            f"({data.shape[0]},)"
        )
    if y.size and (int(y.min()) < 0 or int(y.max()) > 9):
        raise DatasetError(f"{path}: labels must be in 0..9, found {int(y.min())}..{int(y.max())}")
    return data, y
