"""Reader for ``cifar10``: the python-pickle batches of CIFAR-10.

The batches ``data_batch_1`` … ``data_batch_5`` and ``test_batch`` lie in ``cfg.path`` or its
``cifar-10-batches-py`` subfolder. They are read with a restricted unpickler that only admits
numpy's array-reconstruction helpers, each replaced by a stand-in that checks the shape, the
plain integer dtype and the byte count before a copy of the bytes becomes an array, so a
tampered batch can neither run code nor build an array numpy would crash on. Pixels are scaled by
``/255`` before normalization.
"""

from __future__ import annotations

import math
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


#: The element types a CIFAR-10 batch can hold (its pixels are uint8; re-pickled labels may be
#: an integer array). A dtype with fields, a subarray or objects is refused: pickle's BUILD
#: would hand numpy's ``__setstate__`` whatever state the file says, and an array of object
#: pointers filled from raw bytes crashes the process that touches it.
CIFAR_DTYPES = ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "b1")


class _Dtype:
    """What a batch's ``numpy.dtype(...)`` builds instead of a dtype: its name, and the state
    pickle then gives it, checked before any numpy dtype exists."""

    def __init__(self, name, align=False, copy=True):
        name = name.decode("latin1") if isinstance(name, bytes) else name  # Python 2 batches
        if name not in CIFAR_DTYPES:
            raise pickle.UnpicklingError(
                f"an array of dtype {name!r}: a batch holds uint8 pixels and integer labels"
            )
        self.name, self.order = name, "|"

    def __setstate__(self, state):
        ok = isinstance(state, tuple) and len(state) >= 5 and state[2:5] == (None, None, None)
        order = state[1] if ok else None
        order = order.decode("latin1") if isinstance(order, bytes) else order
        if not isinstance(order, str) or order not in ("|", "<", ">", "="):
            raise pickle.UnpicklingError(
                "a dtype state with fields, a subarray or an unknown byte order"
            )
        self.order = order

    def real(self) -> np.dtype:
        dt = np.dtype(self.name)
        return dt if self.order in "|=" else dt.newbyteorder(self.order)


class _Array:
    """What ``_reconstruct`` builds instead of an array: pickle's BUILD gives it the shape,
    dtype and raw bytes, and :meth:`real` makes a plain copy from them once they are checked."""

    def __init__(self, cls=None, shape=(0,), code=b"b"):
        self.array = None

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5):
            raise pickle.UnpicklingError("an array state that is not (version, shape, ...)")
        _, shape, dtype, fortran, raw = state
        self.array = _from_bytes(raw, dtype, shape, "F" if fortran else "C")


def _from_bytes(raw, dtype, shape, order) -> np.ndarray:
    if not isinstance(dtype, _Dtype):
        raise pickle.UnpicklingError("an array whose dtype is not a plain integer type")
    if not isinstance(raw, bytes | bytearray | memoryview | pickle.PickleBuffer):
        raise pickle.UnpicklingError("an array whose data is not raw bytes")
    shape = tuple(shape) if isinstance(shape, tuple | list) else (shape,)
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise pickle.UnpicklingError(f"an array of shape {shape!r}")
    dt = dtype.real()
    raw = memoryview(raw).cast("B")
    if raw.nbytes != math.prod(shape) * dt.itemsize:
        raise pickle.UnpicklingError(
            f"an array of shape {shape} and dtype {dt} in {raw.nbytes} bytes"
        )
    return np.frombuffer(raw, dtype=dt).reshape(shape, order=order).copy()


def _frombuffer(buf, dtype, shape, order):
    """Pickle protocol 5's array (``numpy._core.numeric._frombuffer``), checked."""
    return _Checked(_from_bytes(buf, dtype, shape, order))


class _Checked:
    """An array made by :func:`_frombuffer`, as the batch dict holds it until :func:`_arrays`."""

    def __init__(self, array):
        self.array = array


def _arrays(obj):
    """The batch dict with each array stand-in replaced by its plain numpy array."""
    if isinstance(obj, dict):
        return {k: (v.array if isinstance(v, _Array | _Checked) else v) for k, v in obj.items()}
    return obj


def _latin1(text, encoding="utf-8", errors="strict"):
    """How Python 3 writes ``bytes`` at pickle protocol 2: ``_codecs.encode(text, "latin1")``
    (a batch re-pickled with ``protocol=2``); any other use of ``_codecs.encode`` is refused."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise pickle.UnpicklingError(
            "a _codecs.encode that is not how Python 3 writes bytes at protocol 2"
        )
    return text.encode("latin1")


def _numpy_globals() -> dict[tuple[str, str], Callable[..., Any]]:
    """The only globals a batch may name: numpy's array reconstruction, each replaced by a
    stand-in that checks what the file gives it (files written under numpy 1.x name
    ``numpy.core``, under 2.x ``numpy._core``), and the latin-1 encoding by which Python 3
    writes bytes at protocol 2."""
    return {
        ("numpy.core.multiarray", "_reconstruct"): _Array,
        ("numpy._core.multiarray", "_reconstruct"): _Array,
        ("numpy.core.numeric", "_frombuffer"): _frombuffer,
        ("numpy._core.numeric", "_frombuffer"): _frombuffer,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): _Dtype,
        ("_codecs", "encode"): _latin1,
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
    obj = _unpickled(path)
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
    return data, _labels(path, labels, data.shape[0])


def _unpickled(path: Path) -> dict:
    """The batch dict in ``path``, unpickled by :class:`_RestrictedUnpickler`."""
    try:
        with open(path, "rb") as f:
            obj = _arrays(_RestrictedUnpickler(f, path).load())
    except DatasetError:
        raise
    except Exception as exc:
        # A malformed pickle can fail in many ways; all of them mean a bad file.
        raise DatasetError(f"{path}: not a readable CIFAR-10 pickle batch ({exc!r})") from exc
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def _labels(path: Path, labels, n_images: int) -> np.ndarray:
    """A batch's ``labels`` as int64, checked: integers in 0..9, one per image."""
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
    if y.shape != (n_images,):
        raise DatasetError(
            f"{path}: {n_images} images but b'labels' has shape {y.shape}; expected ({n_images},)"
        )
    if y.size and (int(y.min()) < 0 or int(y.max()) > 9):
        raise DatasetError(f"{path}: labels must be in 0..9, found {int(y.min())}..{int(y.max())}")
    return y
