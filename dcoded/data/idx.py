"""Reader for ``mnist`` and ``fashion_mnist``: the four standard IDX files in ``cfg.path``.

The files are ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each optionally gzipped (``.gz``;
the plain file wins when both exist). Rows and columns come from the headers; pixels are
scaled by ``/255`` before normalization.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from dcoded.data.dataset import Dataset, dataset_folder, normalize
from dcoded.errors import DatasetError

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
"""The four IDX files of mnist / fashion_mnist (each may also carry a ``.gz`` suffix)."""

IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801


def check(cfg: Mapping[str, Any]) -> None:
    """Check the four files cheaply: headers, exact lengths, and the (small) label files whole.

    Image files are streamed (a gzipped one is never held in memory whole) and not converted.
    """
    name = _name(cfg)
    files = _idx_paths(name, cfg)
    # Label files are tiny, so read them whole and check their range too.
    labels = {key: _idx_read(path) for key, path in files.items() if key.endswith("labels")}
    headers = {key: (m, d) for key, (m, d, _) in labels.items()}
    headers.update({k: _idx_header(p) for k, p in files.items() if k.endswith("images")})
    _idx_consistent(name, files, headers)
    for key, (_, _, y) in labels.items():
        _idx_labels_in_range(files[key], y)


def files(cfg: Mapping[str, Any]) -> list[Path]:
    """The four files a load reads (each the plain or the ``.gz`` one found)."""
    return list(_idx_paths(_name(cfg), cfg).values())


def load(cfg: Mapping[str, Any]) -> Dataset:
    """The dataset in the four IDX files, with every check of :func:`check` applied."""
    name = _name(cfg)
    files = _idx_paths(name, cfg)
    read = {key: _idx_read(path) for key, path in files.items()}
    _idx_consistent(name, files, {key: (m, d) for key, (m, d, _) in read.items()})
    out: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        labels = read[f"{split}_labels"][2]
        _idx_labels_in_range(files[f"{split}_labels"], labels)
        out[f"y_{split}"] = labels.astype(np.int64)
        out[f"x_{split}"] = normalize(read[f"{split}_images"][2][:, None, :, :], 255.0, name)
    return Dataset(name=name, n_classes=10, **out)


def _name(cfg: Mapping[str, Any]) -> str:
    # The name ("mnist" or "fashion_mnist") picks the normalization and labels the messages.
    return str(cfg.get("name"))


def _idx_paths(name: str, cfg: Mapping[str, Any]) -> dict[str, Path]:
    expected = list(IDX_FILES.values())
    folder = dataset_folder(cfg, name, [*expected, "(each optionally .gz)"])
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


#: The most data bytes an IDX file's header may declare (MNIST's largest file has 47 MB): a
#: crafted header or a gzip bomb is refused from its header, before its body is read.
MAX_IDX_BYTES = 1 << 32


def _idx_dims(path: Path, raw: bytes, ndim: int) -> tuple[int, ...]:
    if len(raw) < 4 * ndim:
        raise DatasetError(f"{path}: IDX file is truncated (shorter than its header)")
    dims = struct.unpack(f">{ndim}I", raw[: 4 * ndim])
    if math.prod(dims) > MAX_IDX_BYTES:
        raise DatasetError(
            f"{path}: IDX header {dims} declares {math.prod(dims):,} data bytes; at most "
            f"{MAX_IDX_BYTES:,} are read"
        )
    return dims


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
            f"{path}: IDX file has trailing bytes after the {want} data bytes its header "
            f"{tuple(dims)} declares"
        )


def _idx_header(path: Path) -> tuple[int, tuple[int, ...]]:
    """``(magic, dims)`` of an IDX file, after checking its exact length by streaming it."""
    try:
        with _open(path) as f:
            magic, ndim = _idx_magic(path, f.read(4))
            dims = _idx_dims(path, f.read(4 * ndim), ndim)
            body, want = 0, math.prod(dims)
            # Stream in blocks so a gzipped file never sits whole in memory here, and stop
            # past what the header declares (a gzip bomb is not decompressed to its end).
            while body <= want and (block := f.read(1 << 22)):
                body += len(block)
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{path}: cannot read IDX file ({exc})") from exc
    _idx_check_length(path, dims, body)
    return magic, dims


def _idx_read(path: Path) -> tuple[int, tuple[int, ...], np.ndarray]:
    """``(magic, dims, uint8 array shaped by dims)`` of an IDX file, with every check applied."""
    try:
        with _open(path) as f:
            magic, ndim = _idx_magic(path, f.read(4))
            dims = _idx_dims(path, f.read(4 * ndim), ndim)
            data = f.read(math.prod(dims) + 1)  # one byte more shows trailing data
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{path}: cannot read IDX file ({exc})") from exc
    _idx_check_length(path, dims, len(data))
    return magic, dims, np.frombuffer(data, dtype=np.uint8).reshape(dims)


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
