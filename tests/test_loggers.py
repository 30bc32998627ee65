"""``logger=tensorboard`` and ``logger=mlflow``: a real tiny run of each algorithm, read back with
each library's own reader (TensorBoard's ``EventAccumulator``, MLflow's ``MlflowClient`` on the
local store) and checked against the run's ``history.csv`` and ``summary.json``; a missing
library and a store beyond the local disk are refused in one line before any cluster starts."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

import dcoded.run
from dcoded.engine.replica import Replica
from dcoded.errors import ConfigError
from dcoded.interrupt import Interrupted
from tests.conftest import TINY, tiny_config

#: ``history.csv``'s columns that hold text (lists of ranks), not a number.
TEXT_COLUMNS = {"straggle_ms", "not_waited", "abandoned"}
#: Evaluations at steps 1 and 2 of 3: ``test_accuracy`` is on some steps only.
EVAL = "train.eval_every=2"

FAST = ["cdc", "ssgd", "asgd", "serial"]
ALGORITHMS = [
    *FAST,
    pytest.param("ddp", marks=pytest.mark.slow),  # worker processes: a few seconds more
]


def _run(tmp_path: Path, algorithm: str, logger: str, *more: str) -> tuple[dict, dict]:
    """A tiny run into ``tmp_path``; its summary.json and history.csv's numbers as
    ``{column: {step: value}}``."""
    extra = ["cluster.processes=true"] if algorithm == "ddp" else []
    cfg = tiny_config(f"algorithm={algorithm}", f"logger={logger}", EVAL, *extra, *more)
    dcoded.run.run(cfg, out_dir=tmp_path)
    return json.loads((tmp_path / "summary.json").read_text()), _history(tmp_path)


def _history(run_dir: Path) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    with open(run_dir / "history.csv", newline="") as f:
        for row in csv.DictReader(f):
            for column, cell in row.items():
                if column != "step" and column not in TEXT_COLUMNS and cell != "":
                    out.setdefault(column, {})[int(row["step"])] = float(cell)
    return out


def _config_params(summary: dict) -> dict:
    """The config's leaves by dotted name (a list is one leaf), from summary.json."""
    out = {}

    def walk(value, name):
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, f"{name}.{key}" if name else key)
        else:
            out[name] = value

    walk(summary["config"], "")
    return out


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _final(summary: dict) -> dict[str, float]:
    """summary.json's numbers, nested names joined with dots, each character beyond
    ``[A-Za-z0-9_.-]`` as ``_`` (a worker's address), ``config`` left out."""
    out = {}

    def walk(value, name):
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, f"{name}.{key}")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out["summary/" + re.sub(r"[^A-Za-z0-9_.\-]", "_", name)] = float(value)

    for key, value in summary.items():
        if key != "config":
            walk(value, key)
    return out


def _f32(x: float) -> float:
    return float(np.float32(x))


def _read_tensorboard(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def _check_tensorboard(run_dir: Path, summary: dict, history: dict) -> None:
    """Every history.csv value at its step, and summary.json's at the last step, as float32
    (TensorBoard keeps a scalar as a 32-bit float: each value read back must be the csv's
    value rounded to float32, a relative difference of at most 2**-24); the config as
    hparams."""
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    events = _read_tensorboard(run_dir / "tensorboard")
    scalars = {
        tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]
    }
    for column, values in history.items():
        assert scalars[column] == {step: _f32(v) for step, v in values.items()}, column
    last = max(max(v) for v in history.values())
    final = _final(summary)
    assert final["summary/final.train_loss"] == history["train_loss"][last]
    for tag, value in final.items():
        assert scalars[tag] == {last: _f32(value)}, tag
    assert set(scalars) == set(history) | set(final)
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = HParamsPluginData.FromString(content).session_start_info.hparams
    params = _config_params(summary)
    assert set(hparams) == set(params)
    for name, value in params.items():
        got = hparams[name]
        if isinstance(value, int | float) and not isinstance(value, bool):
            assert got.number_value == value, name
        else:
            assert got.string_value == _text(value), name


def _read_mlflow(run_dir: Path, monkeypatch):
    """The one run of the experiment ``dcoded`` in the run folder's store, and the client."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store so
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("dcoded")
    (run,) = client.search_runs([experiment.experiment_id])
    return client, run


def _check_mlflow(client, run, summary: dict | None, history: dict) -> None:
    """Every history.csv value at its step, exactly (MLflow keeps doubles); the config as
    params; summary.json's numbers as metrics at the last step."""
    run_id = run.info.run_id
    for column, values in history.items():
        got = {m.step: m.value for m in client.get_metric_history(run_id, column)}
        assert got == values, column
    if summary is None:
        assert set(run.data.metrics) == set(history)
        return
    last = max(max(v) for v in history.values())
    final = _final(summary)
    assert set(run.data.metrics) == set(history) | set(final)
    for name, value in final.items():
        assert run.data.metrics[name] == value, name
    got = client.get_metric_history(run_id, "summary/final.test_accuracy")
    assert [(m.step, m.value) for m in got] == [(last, history["test_accuracy"][last])]
    assert run.data.params == {k: _text(v) for k, v in _config_params(summary).items()}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_tensorboard_holds_history_csv_the_config_and_the_summary(tmp_path, algorithm):
    summary, history = _run(tmp_path, algorithm, "tensorboard")
    assert {"train_loss", "wall_s", "step_s", "test_accuracy"} <= set(history)
    assert set(history["test_accuracy"]) == {1, 2}  # the steps that evaluated, no others
    _check_tensorboard(tmp_path, summary, history)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_mlflow_holds_history_csv_the_config_and_the_summary(tmp_path, algorithm, monkeypatch):
    summary, history = _run(tmp_path, algorithm, "mlflow")
    client, run = _read_mlflow(tmp_path, monkeypatch)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == tmp_path.name
    _check_mlflow(client, run, summary, history)


def test_the_bytes_and_phase_times_of_cdc_are_there(tmp_path, monkeypatch):
    """cdc's rows carry each phase's time and each byte count: each is a metric."""
    _, history = _run(tmp_path, "cdc", "mlflow")
    wanted = {"map_s", "encode_s", "shuffle_s", "decode_s", "update_s", "bytes_multicast"}
    assert wanted <= set(history)
    _, run = _read_mlflow(tmp_path, monkeypatch)
    assert wanted <= set(run.data.metrics)


def test_csv_writes_what_it_always_wrote(tmp_path):
    dcoded.run.run(tiny_config(), out_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "history.csv",
        "summary.json",
        "theta.npy",
    ]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["logger"] == {"name": "csv"}


def test_a_run_that_fails_keeps_what_it_logged(tmp_path, monkeypatch):
    """The summary cannot be made: every row is logged all the same, and the MLflow run ends
    FAILED; the TensorBoard events are on disk."""

    def broken(*args, **kwargs):
        raise RuntimeError("no summary")

    monkeypatch.setattr(dcoded.run, "make_summary", broken)
    for logger in ("mlflow", "tensorboard"):
        with pytest.raises(RuntimeError, match="no summary"):
            dcoded.run.run(tiny_config(f"logger={logger}", EVAL), out_dir=tmp_path / logger)
    history = _history(tmp_path / "mlflow")
    client, run = _read_mlflow(tmp_path / "mlflow", monkeypatch)
    assert run.info.status == "FAILED"
    _check_mlflow(client, run, None, history)
    events = _read_tensorboard(tmp_path / "tensorboard" / "tensorboard")
    loss = _history(tmp_path / "tensorboard")["train_loss"]
    assert {e.step: e.value for e in events.Scalars("train_loss")} == {
        step: _f32(v) for step, v in loss.items()
    }


def test_an_interrupted_run_logs_its_summary_and_ends_killed(tmp_path, monkeypatch):
    """SIGTERM in the middle of step 2: the rows of steps 0 and 1, and the summary.json the
    interrupted run writes; the MLflow run ends KILLED."""
    real = Replica.step_samples

    def step_samples(self, step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, step)

    monkeypatch.setattr(Replica, "step_samples", step_samples)
    cfg = tiny_config("algorithm=serial", "logger=mlflow", "train.steps=5", EVAL)
    with pytest.raises(Interrupted):
        dcoded.run.run(cfg, out_dir=tmp_path)
    summary, history = json.loads((tmp_path / "summary.json").read_text()), _history(tmp_path)
    assert summary["status"] == "interrupted" and set(history["train_loss"]) == {0, 1}
    client, run = _read_mlflow(tmp_path, monkeypatch)
    assert run.info.status == "KILLED"
    _check_mlflow(client, run, summary, history)


def test_a_resumed_run_logs_the_steps_its_history_starts_with(tmp_path, monkeypatch):
    """Resumed into a new folder, history.csv starts with the checkpoint's steps: so does the
    MLflow run; a logger only the resumed run has is no setting changed."""
    first = tiny_config("algorithm=serial", "train.steps=4", "train.checkpoint_every=2")
    dcoded.run.run(first, out_dir=tmp_path / "a")
    again = [f"train.resume={tmp_path / 'a'}", "train.checkpoint_every=2", "train.steps=6"]
    summary, history = _run(tmp_path / "b", "serial", "mlflow", *again)
    assert set(history["train_loss"]) == set(range(6)) and summary["start_step"] == 4
    assert not any("logger" in e for e in summary["events"])
    client, run = _read_mlflow(tmp_path / "b", monkeypatch)
    _check_mlflow(client, run, summary, history)


def test_a_chosen_log_dir_and_store_are_used(tmp_path, monkeypatch):
    board, store = tmp_path / "board", tmp_path / "store"
    dcoded.run.run(tiny_config("logger=tensorboard", f"logger.log_dir={board}"), out_dir=tmp_path)
    assert list(board.glob("events.out.tfevents.*")) and not (tmp_path / "tensorboard").exists()
    dcoded.run.run(
        tiny_config(
            "logger=mlflow", f"logger.tracking_uri={store.as_uri()}", "logger.experiment_name=mine"
        ),
        out_dir=tmp_path / "run",
    )
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=store.as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("mine").experiment_id])
    assert run.data.params["logger.experiment_name"] == "mine"
    assert not (tmp_path / "run" / "mlruns").exists()


@pytest.fixture
def no_cluster(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(dcoded.run, "open_cluster", refuse)


@pytest.mark.parametrize(
    "logger,modules",
    [("tensorboard", ["tensorboard", "torch.utils.tensorboard"]), ("mlflow", ["mlflow"])],
)
def test_a_missing_library_is_one_line_before_any_cluster(
    tmp_path, monkeypatch, no_cluster, logger, modules
):
    for name in [m for m in sys.modules if m.split(".")[0] in ("tensorboard", "mlflow")]:
        monkeypatch.delitem(sys.modules, name)  # imported by an earlier test: import again
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    with pytest.raises(ConfigError) as err:
        dcoded.run.run(tiny_config(f"logger={logger}"), out_dir=tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"logger={logger} needs the {logger} package")
    assert message.endswith(f"pip install 'dcoded[{logger}]'")
    assert list(tmp_path.iterdir()) == []  # nothing written, no history.csv


@pytest.mark.parametrize(
    "uri", ["http://127.0.0.1:5000", "https://mlflow.example.com", "file://otherhost/mlruns"]
)
def test_a_store_beyond_the_local_disk_is_refused_in_one_line(tmp_path, no_cluster, uri):
    with pytest.raises(ConfigError) as err:
        dcoded.run.run(
            tiny_config("logger=mlflow", f"logger.tracking_uri='{uri}'"), out_dir=tmp_path
        )
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"logger.tracking_uri={uri!r} is not allowed: it must be a local")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("logger,setting", [("tensorboard", "log_dir"), ("mlflow", "tracking_uri")])
def test_without_a_run_folder_the_default_place_is_refused(no_cluster, logger, setting):
    with pytest.raises(ConfigError, match=f"this run has no folder: .* set logger.{setting}$"):
        dcoded.run.run(tiny_config(f"logger={logger}"))


def test_a_link_at_the_default_place_is_refused(tmp_path, no_cluster):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tensorboard").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"is a symbolic link: remove it, or set logger\.log_dir"):
        dcoded.run.run(tiny_config("logger=tensorboard"), out_dir=tmp_path / "run")
    assert list((tmp_path / "elsewhere").iterdir()) == []


CAN_NETEM = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")


@pytest.mark.skipif(not CAN_NETEM, reason="needs root and iproute2 (ip, tc)")
@pytest.mark.netem
@pytest.mark.slow
def test_netem_driver_logs_into_the_same_run_folder(tmp_path, monkeypatch):
    """cluster=netem: the driver that writes history.csv, inside the emulated network, logs
    too; the config it records is the one given (``cluster.kind=netem``)."""
    from dcoded.config import compose_config

    overrides = [o for o in TINY if "processes" not in o]
    cfg = compose_config([*overrides, "cluster=netem", "algorithm=ssgd", "logger=mlflow", EVAL])
    dcoded.run.run(cfg, out_dir=tmp_path)
    summary, history = json.loads((tmp_path / "summary.json").read_text()), _history(tmp_path)
    client, run = _read_mlflow(tmp_path, monkeypatch)
    assert run.data.params["cluster.kind"] == "netem"
    _check_mlflow(client, run, summary, history)
