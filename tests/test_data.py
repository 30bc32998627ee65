"""Tests of dcoded.data: file parsing and validation, safe unpickling, sample order, datasets."""

from __future__ import annotations

import ast
import gzip
import os
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcoded.data as data_module
from dcoded.data import (
    DATASET_NAMES,
    NORMALIZATION,
    Dataset,
    DatasetError,
    check_dataset,
    dataset_files,
    epoch_permutation,
    load_dataset,
    step_indices,
    steps_per_epoch,
)
from dcoded.data.load import READERS

IDX_NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


# --------------------------------------------------------------------------- helpers


def write_idx(path: Path, magic: int, dims: tuple[int, ...], body: bytes, gz: bool) -> Path:
    """Write an IDX file (big-endian header) exactly as given, optionally gzipped."""
    raw = struct.pack(f">I{len(dims)}I", magic, *dims) + body
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)
    return path


def make_idx_folder(
    folder: Path, n_train: int = 7, n_test: int = 4, rows: int = 5, cols: int = 3, gz=False
) -> dict[str, np.ndarray]:
    """Four consistent IDX files with random pixels; returns the raw arrays written."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, rows, cols), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, rows, cols), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for i, (key, a) in enumerate(arrays.items()):
        magic = 0x803 if a.ndim == 3 else 0x801
        # gz may be a bool or "mixed": alternate plain and gzipped files.
        zipped = gz if isinstance(gz, bool) else bool(i % 2)
        write_idx(folder / IDX_NAMES[key], magic, a.shape, a.tobytes(), zipped)
    return arrays


def denormalize(x: np.ndarray, name: str) -> np.ndarray:
    mean, std = (np.asarray(v)[None, :, None, None] for v in NORMALIZATION[name])
    return x * std + mean


def cifar_batch(n: int, seed: int, labels=None) -> dict:
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": b"training batch",
        b"labels": list(rng.integers(0, 10, n).tolist()) if labels is None else labels,
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(n)],
    }


CIFAR_FILES = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]


def make_cifar_folder(folder: Path, protocol: int = 4) -> dict[str, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for i, fname in enumerate(CIFAR_FILES):
        batches[fname] = cifar_batch(10, seed=i)
        (folder / fname).write_bytes(pickle.dumps(batches[fname], protocol=protocol))
    return batches


def py2_pickle(batch: dict) -> bytes:
    """Hand-assemble a protocol-2 pickle as Python 2 + numpy 1.x wrote the official batches.

    Keys and raw bytes are py2 ``str`` opcodes and the array helper is named
    ``numpy.core.multiarray._reconstruct``; no ``_codecs`` global, unlike Python 3 protocol 2.
    """

    def s(b: bytes) -> bytes:
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b

    def i(v: int) -> bytes:
        return b"K" + bytes([v]) if 0 <= v < 256 else b"J" + struct.pack("<i", v)

    a = batch[b"data"]
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
        + i(0)
        + b"\x85"
        + s(b"b")
        + b"\x87R("
        + i(1)
        + i(a.shape[0])
        + i(a.shape[1])
        + b"\x86cnumpy\ndtype\n"
        + s(b"u1")
        + i(0)
        + i(1)
        + b"\x87R("
        + i(3)
        + s(b"|")
        + b"NNN"
        + i(-1)
        + i(-1)
        + i(0)
        + b"tb\x89"
        + s(a.tobytes())
        + b"tb"
    )
    labels = b"](" + b"".join(i(v) for v in batch[b"labels"]) + b"e"
    return b"\x80\x02}(" + s(b"data") + array + s(b"labels") + labels + b"u."


class Evil:
    """Unpickling this would run a shell command through os.system."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def raises_naming(path: Path | str, *, match: str = ""):
    """pytest.raises(DatasetError) whose message names ``path`` (and matches ``match``)."""
    return pytest.raises(DatasetError, match=re.escape(str(path)) + ".*" + match)


# --------------------------------------------------------------------------- package structure


def test_package_imports_neither_torch_nor_dask():
    modules = sorted(Path(data_module.__file__).parent.glob("*.py"))
    # Every module of the package is parsed, not just its __init__.
    assert {"dataset.py", "load.py", "idx.py", "cifar.py", "digits.py", "synthetic.py"} <= {
        p.name for p in modules
    }
    imported = set()
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
    assert {"numpy", "dcoded"} <= imported
    assert not imported & {"torch", "dask", "distributed"}


def test_every_name_has_a_reader_with_the_same_interface():
    assert set(READERS) == set(DATASET_NAMES)
    for reader in READERS.values():
        assert all(callable(getattr(reader, f)) for f in ("check", "files", "load"))


def test_dataset_files(tmp_path):
    make_idx_folder(tmp_path / "m", gz="mixed")
    got = dataset_files({"name": "mnist", "path": str(tmp_path / "m")})
    # The one file found for each of the four, plain or gzipped as written.
    assert sorted(p.name for p in got) == sorted(
        name + (".gz" if i % 2 else "") for i, name in enumerate(IDX_NAMES.values())
    )
    make_cifar_folder(tmp_path / "c" / "cifar-10-batches-py")
    got = dataset_files({"name": "cifar10", "path": str(tmp_path / "c")})
    assert got == [tmp_path / "c" / "cifar-10-batches-py" / f for f in CIFAR_FILES]
    assert dataset_files({"name": "digits", "path": None}) == []
    with pytest.raises(DatasetError, match="nothing is downloaded"):
        dataset_files({"name": "cifar10", "path": str(tmp_path / "m")})


def test_unknown_name_lists_allowed_names():
    with pytest.raises(DatasetError, match="imagenet") as info:
        check_dataset({"name": "imagenet"})
    for name in DATASET_NAMES:
        assert name in str(info.value)
    with pytest.raises(DatasetError):
        load_dataset({})


def test_dataset_validates_arrays():
    x = np.zeros((2, 1, 2, 2), np.float32)
    y = np.zeros(2, np.int64)
    ds = Dataset("t", x, y, x, y, 2)
    assert ds.shape == (1, 2, 2)
    assert "n_train=2" in repr(ds)
    with pytest.raises(DatasetError, match="float32"):
        Dataset("t", x.astype(np.float64), y, x, y, 2)
    with pytest.raises(DatasetError, match="int64"):
        Dataset("t", x, y[:1], x, y, 2)
    with pytest.raises(DatasetError, match=r"0\.\.1"):
        Dataset("t", x, y + 2, x, y, 2)


# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [False, True, "mixed"])
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_idx_loads(tmp_path, name, gz):
    raw = make_idx_folder(tmp_path, gz=gz)
    cfg = {"name": name, "path": str(tmp_path)}
    check_dataset(cfg)
    ds = load_dataset(cfg)
    assert ds.name == name and ds.n_classes == 10
    # Rows and cols come from the header (5×3 here, not 28×28).
    assert ds.shape == (1, 5, 3)
    assert ds.x_train.shape == (7, 1, 5, 3) and ds.x_test.shape == (4, 1, 5, 3)
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        assert x.dtype == np.float32 and x.flags.c_contiguous
        assert y.dtype == np.int64
    np.testing.assert_array_equal(ds.y_train, raw["train_labels"])
    np.testing.assert_allclose(
        denormalize(ds.x_test, name)[:, 0], raw["test_images"] / 255.0, atol=1e-5
    )


def test_idx_accepts_path_object_and_tilde(tmp_path, monkeypatch):
    make_idx_folder(tmp_path / "m")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_dataset({"name": "mnist", "path": "~/m"}).x_train.shape[0] == 7
    assert load_dataset({"name": "mnist", "path": tmp_path / "m"}).x_test.shape[0] == 4


def test_idx_works_with_omegaconf(tmp_path):
    omegaconf = pytest.importorskip("omegaconf")
    make_idx_folder(tmp_path)
    cfg = omegaconf.OmegaConf.create({"name": "mnist", "path": str(tmp_path)})
    omegaconf.OmegaConf.set_struct(cfg, True)
    check_dataset(cfg)
    assert load_dataset(cfg).shape == (1, 5, 3)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("extra", [-1, -10, 1, 5])
def test_idx_wrong_length(tmp_path, gz, extra):
    raw = make_idx_folder(tmp_path)
    a = raw["train_images"]
    body = a.tobytes() + b"\x00" * extra if extra > 0 else a.tobytes()[:extra]
    for p in tmp_path.iterdir():
        if p.name.startswith(IDX_NAMES["train_images"]):
            p.unlink()
    path = write_idx(tmp_path / IDX_NAMES["train_images"], 0x803, a.shape, body, gz)
    what = "trailing" if extra > 0 else "truncated"
    # The cheap check must catch it as well as the loader.
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match=what):
            fn({"name": "mnist", "path": str(tmp_path)})


@pytest.mark.parametrize("content", [b"", b"\x00\x00", b"\x00\x00\x08\x03\x00\x00"])
def test_idx_truncated_header(tmp_path, content):
    make_idx_folder(tmp_path)
    path = tmp_path / IDX_NAMES["test_images"]
    path.write_bytes(content)
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match="truncated"):
            fn({"name": "mnist", "path": str(tmp_path)})


def test_idx_wrong_magic(tmp_path):
    raw = make_idx_folder(tmp_path)
    a = raw["train_labels"]
    path = write_idx(tmp_path / IDX_NAMES["train_labels"], 0x0802, a.shape, a.tobytes(), False)
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match="magic 0x00000802"):
            fn({"name": "mnist", "path": str(tmp_path)})


def test_idx_swapped_files(tmp_path):
    raw = make_idx_folder(tmp_path)
    a = raw["test_labels"]
    path = write_idx(tmp_path / IDX_NAMES["test_images"], 0x801, a.shape, a.tobytes(), False)
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match="images magic"):
            fn({"name": "mnist", "path": str(tmp_path)})


def test_idx_labels_out_of_range(tmp_path):
    raw = make_idx_folder(tmp_path)
    labels = raw["test_labels"].copy()
    labels[2] = 10
    path = write_idx(tmp_path / IDX_NAMES["test_labels"], 0x801, labels.shape, labels.tobytes(), 0)
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match="label 10 is outside 0..9"):
            fn({"name": "mnist", "path": str(tmp_path)})


def test_idx_count_mismatch(tmp_path):
    raw = make_idx_folder(tmp_path)
    labels = raw["train_labels"][:-1]
    path = write_idx(tmp_path / IDX_NAMES["train_labels"], 0x801, labels.shape, labels.tobytes(), 0)
    for fn in (check_dataset, load_dataset):
        with raises_naming(tmp_path / IDX_NAMES["train_images"], match="7 images") as info:
            fn({"name": "mnist", "path": str(tmp_path)})
        assert f"{path} holds 6 labels" in str(info.value)


def test_idx_image_size_mismatch(tmp_path):
    make_idx_folder(tmp_path)
    a = np.zeros((4, 6, 3), np.uint8)
    write_idx(tmp_path / IDX_NAMES["test_images"], 0x803, a.shape, a.tobytes(), False)
    with pytest.raises(DatasetError, match="image sizes differ"):
        check_dataset({"name": "mnist", "path": str(tmp_path)})


def test_idx_bad_gzip(tmp_path):
    make_idx_folder(tmp_path)
    (tmp_path / IDX_NAMES["train_labels"]).unlink()
    path = tmp_path / (IDX_NAMES["train_labels"] + ".gz")
    path.write_bytes(b"this is not gzip at all")
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match="cannot read"):
            fn({"name": "mnist", "path": str(tmp_path)})


def test_idx_bombs_are_refused_from_their_header(tmp_path):
    """A gzipped IDX file was read whole in every process: a header that declares more than
    may be read is refused before its body, and a body past its header's size is not
    decompressed to its end."""
    make_idx_folder(tmp_path)
    path = tmp_path / (IDX_NAMES["train_images"] + ".gz")
    (tmp_path / IDX_NAMES["train_images"]).unlink()
    path.write_bytes(gzip.compress(struct.pack(">IIII", 0x803, 4096, 4096, 4096)))
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match="declares 68,719,476,736 data bytes"):
            fn({"name": "mnist", "path": str(tmp_path)})
    # a valid header, then 64 MB of zeros where 20 images belong: refused as trailing
    bomb = struct.pack(">IIII", 0x803, 20, 4, 4) + bytes(64 << 20)
    path.write_bytes(gzip.compress(bomb, compresslevel=1))
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match="trailing bytes"):
            fn({"name": "mnist", "path": str(tmp_path)})


def test_idx_missing_file(tmp_path):
    make_idx_folder(tmp_path)
    (tmp_path / IDX_NAMES["test_labels"]).unlink()
    for fn in (check_dataset, load_dataset):
        with raises_naming(tmp_path, match="nothing is downloaded") as info:
            fn({"name": "fashion_mnist", "path": str(tmp_path)})
        for base in IDX_NAMES.values():
            assert base in str(info.value)


@pytest.mark.parametrize("path", [None, "", "does/not/exist"])
def test_idx_missing_folder(path):
    with pytest.raises(DatasetError, match=r"dataset\.path.*train-images-idx3-ubyte.*downloaded"):
        check_dataset({"name": "mnist", "path": path})


# --------------------------------------------------------------------------- CIFAR-10


def _check_cifar(ds: Dataset, batches: dict[str, dict]) -> None:
    assert ds.name == "cifar10" and ds.n_classes == 10 and ds.shape == (3, 32, 32)
    assert ds.x_train.shape == (50, 3, 32, 32) and ds.x_test.shape == (10, 3, 32, 32)
    assert ds.x_train.dtype == np.float32 and ds.x_train.flags.c_contiguous
    assert ds.y_train.dtype == np.int64
    train = [batches[f"data_batch_{i}"] for i in range(1, 6)]
    np.testing.assert_array_equal(ds.y_train, np.concatenate([b[b"labels"] for b in train]))
    np.testing.assert_array_equal(ds.y_test, batches["test_batch"][b"labels"])
    raw = np.concatenate([b[b"data"] for b in train]).reshape(50, 3, 32, 32)
    # Row layout is 1024 red, then green, then blue values: channel-first.
    np.testing.assert_allclose(denormalize(ds.x_train, "cifar10"), raw / 255.0, atol=1e-5)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_cifar_loads(tmp_path, protocol):
    batches = make_cifar_folder(tmp_path, protocol)
    cfg = {"name": "cifar10", "path": str(tmp_path)}
    check_dataset(cfg)
    _check_cifar(load_dataset(cfg), batches)


def test_cifar_subfolder(tmp_path):
    batches = make_cifar_folder(tmp_path / "cifar-10-batches-py")
    cfg = {"name": "cifar10", "path": str(tmp_path)}
    check_dataset(cfg)
    _check_cifar(load_dataset(cfg), batches)


def test_cifar_python2_format(tmp_path):
    batches = {}
    for i, fname in enumerate(CIFAR_FILES):
        batches[fname] = cifar_batch(10, seed=i)
        (tmp_path / fname).write_bytes(py2_pickle(batches[fname]))
    _check_cifar(load_dataset({"name": "cifar10", "path": str(tmp_path)}), batches)


@pytest.mark.parametrize(
    ("payload", "shown"),
    [
        (lambda marker: Evil(f"touch {marker}"), r"(posix|os|nt)\.system"),
        (lambda marker: {b"data": Evil(f"touch {marker}"), b"labels": []}, r"\w+\.system"),
        (lambda marker: {b"data": print, b"labels": []}, r"builtins\.print"),
    ],
)
def test_cifar_rejects_disallowed_globals_without_running_them(tmp_path, payload, shown):
    make_cifar_folder(tmp_path)
    marker = tmp_path / "pwned"
    path = tmp_path / "data_batch_3"
    path.write_bytes(pickle.dumps(payload(marker), protocol=4))
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match="disallowed global " + shown):
            fn({"name": "cifar10", "path": str(tmp_path)})
    assert not marker.exists()


class _Encode:
    """A pickle that calls ``_codecs.encode`` with arguments of its own choosing."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        import _codecs

        return (_codecs.encode, self.args)


@pytest.mark.parametrize(
    "args", [("x", "rot13"), ("x", "latin1", "ignore"), (b"x", "hex"), ("x", "utf-8")]
)
def test_cifar_allows_codecs_encode_only_as_protocol_2_writes_bytes(tmp_path, args):
    """A batch re-pickled by Python 3 at protocol 2 names ``_codecs.encode(str, "latin1")``
    for its bytes (it was refused as a disallowed global); any other call is still refused."""
    make_cifar_folder(tmp_path)
    path = tmp_path / "data_batch_3"
    path.write_bytes(pickle.dumps({b"data": _Encode(*args), b"labels": []}, protocol=2))
    with raises_naming(path, match="not how Python 3 writes bytes at protocol 2"):
        load_dataset({"name": "cifar10", "path": str(tmp_path)})


class _Crafted:
    """A pickle that hands numpy's reconstruction helpers a state of its own choosing."""

    def __init__(self, func, args, state):
        self.reduced = (func, args, state)

    def __reduce__(self):
        return self.reduced


def _crafted_batches():
    from numpy._core.multiarray import _reconstruct

    labels = list(range(10))
    rows = np.zeros((10, 3072), np.uint8)
    # a dtype that BUILD turns into one with an object field (what crashed the reader)
    fields = _Crafted(
        np.dtype, ("V8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 0)
    )
    u1_fields = _Crafted(
        np.dtype, ("u1", False, True), (3, "|", None, ("a",), {"a": (np.dtype("u1"), 0)}, 1, 1, 0)
    )
    # raw bytes that do not fill the shape they claim
    short = _Crafted(
        _reconstruct, (np.ndarray, (0,), b"b"), (1, (10, 3072), np.dtype("u1"), False, b"\0" * 5)
    )
    return {
        "object array": ({b"data": np.array([None] * 10, dtype=object), b"labels": labels}, "'O8'"),
        "object field": ({b"data": fields, b"labels": labels}, "'V8'"),
        "u1 given fields": ({b"data": u1_fields, b"labels": labels}, "fields"),
        "short bytes": ({b"data": short, b"labels": labels}, "in 5 bytes"),
        "structured": ({b"data": np.zeros(10, [("a", "u1")]), b"labels": labels}, "'V1'"),
        "rows then fine": ({b"data": rows, b"labels": labels}, None),
    }  # fmt: skip


@pytest.mark.parametrize("case", list(_crafted_batches()))
def test_a_crafted_cifar_pickle_is_one_line_and_no_crash(tmp_path, case):
    """A 269-byte batch whose dtype BUILD gave an object field made the reader raise and then
    segfault the process: the stand-ins check every state before numpy sees it."""
    obj, match = _crafted_batches()[case]
    make_cifar_folder(tmp_path)
    path = tmp_path / "data_batch_2"
    path.write_bytes(pickle.dumps(obj, protocol=4))
    cfg = {"name": "cifar10", "path": str(tmp_path)}
    if match is None:  # a plain batch still loads, through the same stand-ins
        assert load_dataset(cfg).x_train.shape == (50, 3, 32, 32)
        return
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match=match):
            fn(cfg)


def _bad_batches():
    ok = cifar_batch(10, 0)
    return {
        "short rows": ({**ok, b"data": ok[b"data"][:, :3071]}, r"\(N, 3072\)"),
        "3-d data": ({**ok, b"data": ok[b"data"].reshape(10, 3, 1024)}, r"\(N, 3072\)"),
        "float data": ({**ok, b"data": ok[b"data"].astype(np.float32)}, "uint8"),
        "label count": ({**ok, b"labels": ok[b"labels"][:-1]}, "10 images"),
        "label range": ({**ok, b"labels": [10] * 10}, r"0\.\.9"),
        "negative label": ({**ok, b"labels": [-1] * 10}, r"0\.\.9"),
        "float labels": ({**ok, b"labels": [1.5] * 10}, "list of ints"),
        "no labels": ({b"data": ok[b"data"]}, "lacks"),
        "not a dict": ([ok[b"data"]], "dict"),
    }


@pytest.mark.parametrize("case", list(_bad_batches()))
def test_cifar_bad_batch(tmp_path, case):
    obj, match = _bad_batches()[case]
    make_cifar_folder(tmp_path)
    path = tmp_path / "test_batch"
    path.write_bytes(pickle.dumps(obj, protocol=4))
    for fn in (check_dataset, load_dataset):
        with raises_naming(path, match=match):
            fn({"name": "cifar10", "path": str(tmp_path)})


@pytest.mark.parametrize("content", [b"", b"not a pickle", pickle.dumps({b"data": 1})[:-3]])
def test_cifar_unreadable_pickle(tmp_path, content):
    make_cifar_folder(tmp_path)
    path = tmp_path / "data_batch_1"
    path.write_bytes(content)
    with raises_naming(path, match="not a readable CIFAR-10 pickle"):
        load_dataset({"name": "cifar10", "path": str(tmp_path)})


def test_cifar_missing_file(tmp_path):
    make_cifar_folder(tmp_path)
    (tmp_path / "data_batch_5").unlink()
    for fn in (check_dataset, load_dataset):
        with raises_naming(tmp_path, match="data_batch_5.*nothing is downloaded") as info:
            fn({"name": "cifar10", "path": str(tmp_path)})
        assert "cifar-10-batches-py" in str(info.value) and "test_batch" in str(info.value)


# --------------------------------------------------------------------------- sample order


def test_epoch_permutation():
    p = epoch_permutation(100, seed=3, epoch=2)
    assert p.dtype == np.int64
    np.testing.assert_array_equal(np.sort(p), np.arange(100))
    np.testing.assert_array_equal(p, epoch_permutation(100, 3, 2))
    np.testing.assert_array_equal(p, np.random.default_rng([3, 2]).permutation(100))
    assert not np.array_equal(p, epoch_permutation(100, 3, 3))
    assert not np.array_equal(p, epoch_permutation(100, 4, 2))
    with pytest.raises(DatasetError):
        epoch_permutation(100, -1, 0)


def test_step_indices_example():
    n, b = 103, 10
    steps = [step_indices(n, b, seed=7, step=s) for s in range(25)]
    assert [e for e, _ in steps] == [0] * 10 + [1] * 10 + [2] * 5
    for epoch in (0, 1):
        got = np.concatenate([idx for e, idx in steps if e == epoch])
        # The 3-sample tail of every epoch is dropped.
        np.testing.assert_array_equal(got, epoch_permutation(n, 7, epoch)[:100])
        assert len(np.unique(got)) == 100
    assert all(idx.dtype == np.int64 and idx.shape == (b,) for _, idx in steps)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 5),
)
def test_step_indices_cover_each_epoch_without_repeats(n, data, seed, epoch):
    b = data.draw(st.integers(1, n))
    spe = n // b
    idx = [step_indices(n, b, seed, epoch * spe + i) for i in range(spe)]
    assert {e for e, _ in idx} == {epoch}
    flat = np.concatenate([i for _, i in idx])
    assert len(flat) == spe * b == len(np.unique(flat))
    assert flat.min() >= 0 and flat.max() < n


@pytest.mark.parametrize(("n", "b", "s"), [(10, 11, 0), (10, 0, 0), (10, 2, -1), (10, 2.0, 0)])
def test_step_indices_rejects(n, b, s):
    with pytest.raises(DatasetError):
        step_indices(n, b, 0, s)


@pytest.mark.parametrize(("n", "b", "want"), [(103, 10, 10), (100, 10, 10), (5, 5, 1), (7, 1, 7)])
def test_steps_per_epoch_is_where_step_indices_starts_a_new_epoch(n, b, want):
    assert steps_per_epoch(n, b) == want
    assert step_indices(n, b, seed=0, step=want - 1)[0] == 0
    assert step_indices(n, b, seed=0, step=want)[0] == 1


@pytest.mark.parametrize(("n", "b"), [(10, 11), (10, 0), (-1, 1), (10, 2.0), (10, True)])
def test_steps_per_epoch_rejects(n, b):
    with pytest.raises(DatasetError, match=r"n_train|batch_size"):
        steps_per_epoch(n, b)


# --------------------------------------------------------------------------- digits


def test_digits():
    from sklearn.datasets import load_digits

    cfg = {"name": "digits", "path": None}
    check_dataset(cfg)
    ds = load_dataset(cfg)
    assert ds.name == "digits" and ds.n_classes == 10 and ds.shape == (1, 8, 8)
    assert ds.x_train.shape == (1500, 1, 8, 8) and ds.x_test.shape == (297, 1, 8, 8)
    assert ds.x_train.dtype == np.float32 and ds.x_train.flags.c_contiguous
    assert ds.y_train.dtype == np.int64 and set(np.unique(ds.y_test)) == set(range(10))
    # The documented split: last 297 entries of the seed-0 permutation are the test set.
    bunch = load_digits()
    perm = np.random.default_rng(0).permutation(1797)
    np.testing.assert_array_equal(ds.y_test, bunch.target[perm[-297:]])
    np.testing.assert_allclose(
        denormalize(ds.x_test, "digits")[:, 0], bunch.images[perm[-297:]] / 16, atol=1e-5
    )
    again = load_dataset(cfg)
    np.testing.assert_array_equal(ds.x_train, again.x_train)


# --------------------------------------------------------------------------- synthetic


def synthetic(**kw):
    cfg = {"name": "synthetic", "shape": [1, 8, 8], "n_classes": 10, "n_samples": 600}
    cfg.update({"n_test": 400, **kw})
    return load_dataset(cfg)


def test_synthetic_is_learnable():
    from sklearn.linear_model import LogisticRegression

    ds = synthetic()
    clf = LogisticRegression(max_iter=500).fit(ds.x_train.reshape(600, -1), ds.y_train)
    assert clf.score(ds.x_test.reshape(400, -1), ds.y_test) > 0.8


def test_synthetic_shapes_and_determinism():
    ds = synthetic(shape=[3, 5, 7], n_classes=4, n_samples=101, n_test=13, seed=5)
    assert ds.shape == (3, 5, 7) and ds.n_classes == 4
    assert ds.x_train.shape == (101, 3, 5, 7) and ds.x_test.shape == (13, 3, 5, 7)
    assert ds.x_train.dtype == np.float32 and ds.x_train.flags.c_contiguous
    assert ds.y_train.dtype == np.int64
    # Balanced up to one sample per class.
    assert np.ptp(np.bincount(ds.y_train, minlength=4)) <= 1
    same = synthetic(shape=[3, 5, 7], n_classes=4, n_samples=101, n_test=13, seed=5)
    np.testing.assert_array_equal(ds.x_train, same.x_train)
    np.testing.assert_array_equal(ds.y_test, same.y_test)
    other = synthetic(shape=[3, 5, 7], n_classes=4, n_samples=101, n_test=13, seed=6)
    assert not np.array_equal(ds.x_train, other.x_train)


def test_synthetic_defaults_and_independent_test_set():
    a, b = synthetic(n_samples=50), synthetic(n_samples=80)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    assert synthetic(seed=0).x_train.shape == (600, 1, 8, 8)
    np.testing.assert_array_equal(synthetic().x_train, synthetic(seed=0).x_train)
    assert abs(float(synthetic().x_train.std()) - 1.0) < 0.05


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("shape", [8, 8], "shape"),
        ("shape", [1, 0, 8], "shape"),
        ("shape", None, "shape"),
        ("n_classes", 1, "n_classes"),
        ("n_samples", None, "n_samples"),
        ("n_samples", 0, "n_samples"),
        ("n_test", -1, "n_test"),
        ("n_test", None, "n_test"),
        ("seed", 1.5, "seed"),
    ],
)
def test_synthetic_bad_config(key, value, match):
    cfg = {"name": "synthetic", "shape": [1, 8, 8], "n_classes": 10, "n_samples": 10, "n_test": 5}
    cfg[key] = value
    for fn in (check_dataset, load_dataset):
        with pytest.raises(DatasetError, match=match):
            fn(cfg)


def test_a_validation_split_holds_out_training_samples_and_never_the_test_set():
    """dataset.validation: the same held-out samples whatever the seed, disjoint from the
    samples trained on; the test set is not evaluated at all."""
    import numpy as np

    from dcoded.data import load_dataset
    from dcoded.errors import DatasetError

    cfg = {"name": "digits", "path": None}
    full, held = load_dataset(cfg), load_dataset({**cfg, "validation": 0.2})
    assert len(held.y_test) == round(0.2 * len(full.y_train))
    assert len(held.y_train) + len(held.y_test) == len(full.y_train)
    rows = {r.tobytes() for r in full.x_train}
    assert all(r.tobytes() in rows for r in held.x_test)  # from the training samples
    assert not {r.tobytes() for r in held.x_train} & {r.tobytes() for r in held.x_test}
    again = load_dataset({**cfg, "validation": 0.2})
    assert np.array_equal(again.x_test, held.x_test)
    with pytest.raises(DatasetError, match="at least one sample"):
        load_dataset({**cfg, "validation": 1e-6})
