"""Bad settings end before any cluster starts, with one line naming the setting."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import dcoded.run
from dcoded.errors import ConfigError, DatasetError
from dcoded.run import run
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started for a config that cannot work")

    monkeypatch.setattr(dcoded.run, "open_cluster", refuse)


@pytest.mark.parametrize(
    "overrides,needles",
    [
        (["coding.redundancy=5"], ["coding.redundancy=5", "1..4"]),
        (["coding.redundancy=0"], ["coding.redundancy=0", "1..4"]),
        (["coding.group_size=3"], ["coding.group_size=3", "[1, 2, 4]"]),
        (["coding.group_size=2", "coding.redundancy=3"], ["coding.redundancy=3", "1..2"]),
        (["train.batch_size=5"], ["train.batch_size=5", ">= 6"]),
        (["cluster.n_workers=6", "coding.group_size=3", "train.batch_size=5"], [">= 6"]),
        (["algorithm.name=sgd"], ["algorithm='sgd'", "cdc"]),
        (["coding.shuffle=xor"], ["coding.shuffle='xor'", "uncoded"]),
        (["coding.shuffle=hybrid", "coding.hybrid_m=3"], ["coding.hybrid_m=3", "1..2"]),
        (["coding.shuffle=hybrid", "coding.hybrid_m=0"], ["coding.hybrid_m=0", "1..2"]),
        (
            ["coding.shuffle=hybrid", "coding.redundancy=3", "coding.hybrid_m=two"],
            ["coding.hybrid_m='two'", "an integer"],
        ),
        (["model.name=rnn"], ["model='rnn'", "dnn"]),
        (["cluster.n_workers=0"], ["cluster.n_workers=0"]),
        (["cluster.kind=slurm"], ["cluster.kind='slurm'"]),
        (["algorithm=ssgd", "cluster.n_workers=4", "train.batch_size=3"], [">= 4"]),
        (["train.steps=0"], ["train.steps=0"]),
        (["train.batch_size=5000"], ["train.batch_size=5000", "1500"]),
        (["optimizer.momentum=-1"], ["optimizer"]),
        (
            ["model=cnn", "model.hidden=16", "model.channels=[4,4,4,4]"],
            ["model=cnn", "dataset=digits", "8x8"],
        ),
        (
            [
                "dataset=synthetic",
                "dataset.n_test=2000",
                "dataset.shape=[1,2,2]",
                "model=cnn",
                "model.hidden=16",
            ],
            ["model=cnn", "2x2"],
        ),
    ],
)
def test_bad_settings_fail_before_any_cluster(overrides, needles):
    with pytest.raises(ConfigError) as err:
        run(tiny_config(*overrides))
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize(
    "overrides,typed,derived",
    [
        # g defaults to n_workers: the limit is the workers the user set, not a group size
        (["cluster.n_workers=1"], "cluster.n_workers=1", "group_size"),
        (["cluster.n_workers=2", "coding.redundancy=3"], "cluster.n_workers=2", "group_size"),
        # train.steps is derived from the epochs
        (["train.epochs=-1"], "train.epochs=-1", "train.steps="),
        (["train.epochs=0"], "train.epochs=0", "train.steps="),
        (["train.epochs=two"], "train.epochs='two'", "train.steps="),
        (["cluster.n_workers=two"], "cluster.n_workers='two'", "coding."),
        (["cluster.n_workers=true"], "cluster.n_workers=True", "coding."),
    ],
)
def test_errors_name_the_setting_the_user_typed(overrides, typed, derived):
    """Each of these named a value the user never set (coding.group_size=1, train.steps=-15)
    or said "must be >= 1" of a word."""
    with pytest.raises(ConfigError) as err:
        run(tiny_config(*overrides))
    message = str(err.value)
    assert typed in message and derived not in message and "\n" not in message
    if "two" in typed or "True" in typed:
        assert "an integer" in message


def _write_idx(path: Path, magic: int, dims: tuple[int, ...], payload: bytes, gz=False):
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims)
    opener = gzip.open if gz else open
    with opener(path, "wb") as f:
        f.write(header + payload)


def test_missing_dataset_names_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetError) as err:
        run(tiny_config("dataset=mnist", f"dataset.path={missing}"))
    assert str(missing) in str(err.value)
    assert "train-images-idx3-ubyte" in str(err.value)


def test_truncated_idx_names_the_file(tmp_path):
    n = 5
    _write_idx(tmp_path / "train-images-idx3-ubyte", 0x803, (n, 28, 28), bytes(n * 784 - 7))
    _write_idx(tmp_path / "train-labels-idx1-ubyte", 0x801, (n,), bytes(n))
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", 0x803, (n, 28, 28), bytes(n * 784))
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", 0x801, (n,), bytes(n))
    with pytest.raises(DatasetError) as err:
        run(tiny_config("dataset=mnist", f"dataset.path={tmp_path}"))
    assert "train-images-idx3-ubyte" in str(err.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dcoded", *args, "hydra.run.dir=" + str(ROOT / "outputs/_errors")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["coding.redundancy=7"], "coding.redundancy=7"),
        (["dataset=mnist", "dataset.path=/nonexistent/mnist"], "/nonexistent/mnist"),
    ],
)
def test_cli_prints_one_line_and_exits_nonzero(args, needle):
    result = _cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_cli_unknown_algorithm_lists_the_choices():
    result = _cli("algorithm=sgd")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "algorithm" in result.stderr and "cdc" in result.stderr
