"""Datasets and the deterministic sample order shared by every algorithm.

Every worker loads the dataset itself from local files; nothing is ever downloaded. The order
of samples is a pure function of ``(seed, epoch)`` (:func:`epoch_permutation`), and global step
``s`` takes the next ``B`` samples of that order (:func:`step_indices`), so every algorithm and
every redundancy ``r`` sees exactly the same samples at every step (DESIGN.md §5).

Datasets (``cfg.name``):

``digits``
    scikit-learn's bundled 8×8 digits (1797 images, shape ``(1, 8, 8)``). Split: a fixed
    permutation ``np.random.default_rng(0).permutation(1797)``; its first 1500 entries are the
    training set and its last 297 (about 1/6) the test set, each kept in permutation order.
``mnist`` / ``fashion_mnist``
    The four standard IDX files in ``cfg.path`` (``train-images-idx3-ubyte``,
    ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``), each
    optionally gzipped (``.gz``; the plain file wins when both exist).
``cifar10``
    The python-pickle batches ``data_batch_1`` … ``data_batch_5`` and ``test_batch`` in
    ``cfg.path`` or its ``cifar-10-batches-py`` subfolder, read with a restricted unpickler that
    only admits numpy's array-reconstruction helpers.
``synthetic``
    Random but learnable: fixed, spatially smooth class templates plus Gaussian noise, sized by
    ``cfg.shape``, ``cfg.n_classes``, ``cfg.n_samples`` and ``cfg.n_test``, drawn from
    ``cfg.seed`` (default 0).

Normalization: pixels are first scaled to ``[0, 1]`` (digits ``/16``, the others ``/255``) and
then standardized with the fixed per-dataset, per-channel constants in :data:`NORMALIZATION`
(``x = (x01 - mean) / std``). The synthetic data are generated with zero mean and unit
variance per pixel and are not rescaled.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import operator
import os
import pickle
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from dcoded.errors import DatasetError

__all__ = [
    "DATASET_NAMES",
    "NORMALIZATION",
    "Dataset",
    "DatasetError",
    "absolute_path",
    "check_dataset",
    "dataset_files",
    "epoch_permutation",
    "load_dataset",
    "step_indices",
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

DIGITS_N_TEST = 297
"""Size of the digits test split (the last 297 entries of the seed-0 permutation)."""

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
"""The four IDX files of mnist / fashion_mnist (each may also carry a ``.gz`` suffix)."""

IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801

CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch"
CIFAR_SUBFOLDER = "cifar-10-batches-py"
CIFAR_ROW = 3 * 32 * 32

# Synthetic data: distance between class templates, in noise standard deviations.
SYNTHETIC_SEPARATION = 5.0
# Rows generated at once, to bound the temporary of templates[y].
_CHUNK = 8192


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
    """
    n, seed, epoch = (
        _nonneg_int(v, label) for v, label in ((n, "n"), (seed, "seed"), (epoch, "epoch"))
    )
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64, copy=False)


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
        ``step // (n_train // batch_size)``; the partial tail of every epoch is dropped.
    indices : numpy.ndarray
        int64, the ``batch_size`` entries ``i * B .. (i + 1) * B`` of
        ``epoch_permutation(n_train, seed, epoch)``, with ``i = step % steps_per_epoch``.

    Raises
    ------
    DatasetError
        If ``batch_size`` is outside ``1 .. n_train`` or an argument is negative.
    """
    n_train = _nonneg_int(n_train, "n_train")
    batch_size = _nonneg_int(batch_size, "batch_size")
    step = _nonneg_int(step, "step")
    if not 1 <= batch_size <= n_train:
        raise DatasetError(f"batch_size must be in 1..n_train={n_train}, got {batch_size}")
    steps_per_epoch = n_train // batch_size
    epoch, i = divmod(step, steps_per_epoch)
    perm = epoch_permutation(n_train, seed, epoch)
    # Copy so callers never hold a view that pins the whole permutation.
    return epoch, perm[i * batch_size : (i + 1) * batch_size].copy()


# --------------------------------------------------------------------------- public entry points


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
    name = _name(cfg)
    if name == "digits":
        return
    if name == "synthetic":
        _synthetic_params(cfg)
        return
    if name in ("mnist", "fashion_mnist"):
        files = _idx_paths(name, cfg)
        # Label files are tiny, so read them whole and check their range too.
        labels = {key: _idx_read(path) for key, path in files.items() if key.endswith("labels")}
        headers = {key: (m, d) for key, (m, d, _) in labels.items()}
        headers.update({k: _idx_header(p) for k, p in files.items() if k.endswith("images")})
        _idx_consistent(name, files, headers)
        for key, (_, _, y) in labels.items():
            _idx_labels_in_range(files[key], y)
        return
    folder = _cifar_folder(cfg)
    for fname in (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE):
        _cifar_batch(folder / fname)


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
    name = _name(cfg)
    if name in ("mnist", "fashion_mnist"):
        return list(_idx_paths(name, cfg).values())
    if name == "cifar10":
        folder = _cifar_folder(cfg)
        return [folder / f for f in (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE)]
    return []


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
    name = _name(cfg)
    if name == "digits":
        return _load_digits()
    if name == "synthetic":
        return _load_synthetic(**_synthetic_params(cfg))
    if name in ("mnist", "fashion_mnist"):
        return _load_idx(name, cfg)
    return _load_cifar(cfg)


# --------------------------------------------------------------------------- config helpers


def _get(cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
    # Mapping.get works for dicts and DictConfig alike (struct mode included).
    return cfg.get(key, default)


def _name(cfg: Mapping[str, Any]) -> str:
    name = _get(cfg, "name")
    if name not in DATASET_NAMES:
        raise DatasetError(f"dataset.name={name!r} is unknown; expected one of {DATASET_NAMES}")
    return str(name)


def _nonneg_int(value: Any, label: str) -> int:
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


def _folder(cfg: Mapping[str, Any], name: str, expected: Sequence[str]) -> Path:
    raw = _get(cfg, "path")
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


# --------------------------------------------------------------------------- normalization


def _normalize(raw: np.ndarray, scale: float, name: str) -> np.ndarray:
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


# --------------------------------------------------------------------------- digits


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


def _load_digits() -> Dataset:
    # the same values as sklearn.datasets.load_digits(): 64 pixel columns (0..16), then the label
    table = np.loadtxt(_digits_file(), delimiter=",", dtype=np.float64)
    images = table[:, :64].reshape(-1, 1, 8, 8)
    labels = table[:, 64].astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(labels))
    train, test = perm[:-DIGITS_N_TEST], perm[-DIGITS_N_TEST:]
    return Dataset(
        name="digits",
        x_train=_normalize(images[train], 16.0, "digits"),
        y_train=labels[train],
        x_test=_normalize(images[test], 16.0, "digits"),
        y_test=labels[test],
        n_classes=10,
    )


# --------------------------------------------------------------------------- IDX (mnist, fashion)


def _idx_paths(name: str, cfg: Mapping[str, Any]) -> dict[str, Path]:
    expected = list(IDX_FILES.values())
    folder = _folder(cfg, name, [*expected, "(each optionally .gz)"])
    found: dict[str, Path] = {}
    missing: list[str] = []
    for key, base in IDX_FILES.items():
        for candidate in (folder / base, folder / f"{base}.gz"):
            if candidate.is_file():
                found[key] = candidate
                break
        else:
            missing.append(base)
    if missing:
        raise DatasetError(
            f"{name}: missing {missing} (or .gz) in {str(folder)!r}; expected the IDX files "
            f"{expected}, each optionally gzipped (nothing is downloaded)"
        )
    return found


def _open(path: Path) -> BinaryIO:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _idx_magic(path: Path, head: bytes) -> tuple[int, int]:
    """Check the 4-byte IDX magic and return ``(magic, ndim)``."""
    if len(head) < 4:
        raise DatasetError(f"{path}: IDX file is truncated (shorter than its header)")
    (magic,) = struct.unpack(">I", head[:4])
    if magic not in (IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC):
        raise DatasetError(
            f"{path}: bad IDX magic 0x{magic:08x}; expected 0x{IDX_IMAGES_MAGIC:08x} "
            f"(images) or 0x{IDX_LABELS_MAGIC:08x} (labels)"
        )
    return magic, magic & 0xFF


def _idx_dims(path: Path, raw: bytes, ndim: int) -> tuple[int, ...]:
    if len(raw) < 4 * ndim:
        raise DatasetError(f"{path}: IDX file is truncated (shorter than its header)")
    return struct.unpack(f">{ndim}I", raw[: 4 * ndim])


def _idx_check_length(path: Path, dims: Sequence[int], body: int) -> None:
    # math.prod on Python ints: a corrupt header must not overflow into a small number.
    want = math.prod(dims)
    if body < want:
        raise DatasetError(
            f"{path}: IDX file is truncated: header {tuple(dims)} needs {want} data bytes, "
            f"found {body}"
        )
    if body > want:
        raise DatasetError(
            f"{path}: IDX file has {body - want} trailing bytes after the {want} data bytes "
            f"its header {tuple(dims)} declares"
        )


def _idx_header(path: Path) -> tuple[int, tuple[int, ...]]:
    """``(magic, dims)`` of an IDX file, after checking its exact length by streaming it."""
    try:
        with _open(path) as f:
            magic, ndim = _idx_magic(path, f.read(4))
            dims = _idx_dims(path, f.read(4 * ndim), ndim)
            body = 0
            # Stream in blocks so a gzipped file never sits whole in memory here.
            while block := f.read(1 << 22):
                body += len(block)
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{path}: cannot read IDX file ({exc})") from exc
    _idx_check_length(path, dims, body)
    return magic, dims


def _idx_read(path: Path) -> tuple[int, tuple[int, ...], np.ndarray]:
    """``(magic, dims, uint8 array shaped by dims)`` of an IDX file, with every check applied."""
    try:
        with _open(path) as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{path}: cannot read IDX file ({exc})") from exc
    magic, ndim = _idx_magic(path, data[:4])
    dims = _idx_dims(path, data[4 : 4 + 4 * ndim], ndim)
    offset = 4 + 4 * ndim
    _idx_check_length(path, dims, len(data) - offset)
    return magic, dims, np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def _idx_consistent(
    name: str, files: Mapping[str, Path], headers: Mapping[str, tuple[int, tuple[int, ...]]]
) -> None:
    """Right magic per file, non-empty images, matching counts and image sizes."""
    for split in ("train", "test"):
        ipath, lpath = files[f"{split}_images"], files[f"{split}_labels"]
        imagic, idims = headers[f"{split}_images"]
        lmagic, ldims = headers[f"{split}_labels"]
        if imagic != IDX_IMAGES_MAGIC:
            raise DatasetError(
                f"{ipath}: magic 0x{imagic:08x} is not the images magic 0x{IDX_IMAGES_MAGIC:08x}"
            )
        if lmagic != IDX_LABELS_MAGIC:
            raise DatasetError(
                f"{lpath}: magic 0x{lmagic:08x} is not the labels magic 0x{IDX_LABELS_MAGIC:08x}"
            )
        if min(idims) < 1:
            raise DatasetError(f"{ipath}: empty image dimensions {idims}; expected (N, H, W) >= 1")
        if idims[0] != ldims[0]:
            raise DatasetError(
                f"{name}: {ipath} holds {idims[0]} images but {lpath} holds {ldims[0]} labels"
            )
    if headers["train_images"][1][1:] != headers["test_images"][1][1:]:
        raise DatasetError(
            f"{name}: image sizes differ: {files['train_images']} is "
            f"{headers['train_images'][1][1:]}, {files['test_images']} is "
            f"{headers['test_images'][1][1:]}"
        )


def _idx_labels_in_range(path: Path, labels: np.ndarray) -> None:
    # uint8 labels cannot be negative, so only the maximum needs checking.
    if labels.size and int(labels.max()) > 9:
        raise DatasetError(f"{path}: label {int(labels.max())} is outside 0..9")


def _load_idx(name: str, cfg: Mapping[str, Any]) -> Dataset:
    files = _idx_paths(name, cfg)
    read = {key: _idx_read(path) for key, path in files.items()}
    _idx_consistent(name, files, {key: (m, d) for key, (m, d, _) in read.items()})
    out: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        labels = read[f"{split}_labels"][2]
        _idx_labels_in_range(files[f"{split}_labels"], labels)
        out[f"y_{split}"] = labels.astype(np.int64)
        out[f"x_{split}"] = _normalize(read[f"{split}_images"][2][:, None, :, :], 255.0, name)
    return Dataset(name=name, n_classes=10, **out)


# --------------------------------------------------------------------------- CIFAR-10


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
    folder = _folder(cfg, "cifar10", expected)
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


def _load_cifar(cfg: Mapping[str, Any]) -> Dataset:
    folder = _cifar_folder(cfg)
    train = [_cifar_batch(folder / f) for f in CIFAR_TRAIN_FILES]
    x_test, y_test = _cifar_batch(folder / CIFAR_TEST_FILE)
    x_train = np.concatenate([x for x, _ in train]).reshape(-1, 3, 32, 32)
    y_train = np.concatenate([y for _, y in train])
    return Dataset(
        name="cifar10",
        x_train=_normalize(x_train, 255.0, "cifar10"),
        y_train=y_train,
        x_test=_normalize(x_test.reshape(-1, 3, 32, 32), 255.0, "cifar10"),
        y_test=y_test,
        n_classes=10,
    )


# --------------------------------------------------------------------------- synthetic


def _synthetic_params(cfg: Mapping[str, Any]) -> dict[str, Any]:
    shape = _get(cfg, "shape")
    try:
        dims = tuple(_nonneg_int(v, "dataset.shape entry") for v in shape)
    except (TypeError, DatasetError):
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise DatasetError(
            f"dataset.shape={shape!r} for synthetic must be three positive ints [C, H, W]"
        )
    params = {"shape": dims}
    for key, low in (("n_classes", 2), ("n_samples", 1), ("n_test", 0)):
        value = _get(cfg, key)
        if value is None:
            raise DatasetError(f"dataset.{key} must be set for synthetic (an int >= {low})")
        value = _nonneg_int(value, f"dataset.{key}")
        if value < low:
            raise DatasetError(f"dataset.{key}={value} for synthetic must be >= {low}")
        params[key] = value
    params["seed"] = _nonneg_int(_get(cfg, "seed", 0), "dataset.seed")
    return params


def _synthetic_split(
    templates: np.ndarray, n: int, rng: np.random.Generator, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    n_classes = templates.shape[0]
    # Exactly balanced (up to one sample) labels in random order.
    y = rng.permutation(np.arange(n, dtype=np.int64) % n_classes)
    x = rng.standard_normal((n, templates.shape[1]), dtype=np.float32)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        x[start:stop] += templates[y[start:stop]]
    x *= np.float32(scale)
    return x, y


def _load_synthetic(
    shape: tuple[int, int, int], n_classes: int, n_samples: int, n_test: int, seed: int
) -> Dataset:
    """Class templates plus unit Gaussian noise, rescaled to unit variance per pixel.

    Each template is white noise on a half-resolution grid, upsampled 2×2 (spatial structure
    a CNN can use), then scaled to RMS ``SYNTHETIC_SEPARATION / sqrt(2 D)`` with
    ``D = C·H·W``: two templates then lie about ``SYNTHETIC_SEPARATION`` noise standard
    deviations apart whatever the size, so difficulty does not depend on the shape. Templates,
    train set and test set use the independent streams ``[seed, 0]``, ``[seed, 1]`` and
    ``[seed, 2]``, so the test set does not depend on ``n_samples``.
    """
    c, h, w = shape
    d = c * h * w
    rng_t = np.random.default_rng([seed, 0])
    coarse = rng_t.standard_normal((n_classes, c, (h + 1) // 2, (w + 1) // 2))
    templates = coarse.repeat(2, axis=2).repeat(2, axis=3)[:, :, :h, :w].reshape(n_classes, d)
    rms = np.sqrt(np.mean(templates**2, axis=1, keepdims=True))
    templates *= SYNTHETIC_SEPARATION / np.sqrt(2 * d) / np.maximum(rms, 1e-12)
    templates = templates.astype(np.float32)
    # Per-pixel variance is 1 (noise) + mean template power; divide it out.
    scale = 1.0 / np.sqrt(1.0 + SYNTHETIC_SEPARATION**2 / (2 * d))
    x_train, y_train = _synthetic_split(
        templates, n_samples, np.random.default_rng([seed, 1]), scale
    )
    x_test, y_test = _synthetic_split(templates, n_test, np.random.default_rng([seed, 2]), scale)
    return Dataset(
        name="synthetic",
        x_train=x_train.reshape(n_samples, c, h, w),
        y_train=y_train,
        x_test=x_test.reshape(n_test, c, h, w),
        y_test=y_test,
        n_classes=n_classes,
    )
