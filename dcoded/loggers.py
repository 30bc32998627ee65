"""Where a run's figures go besides ``history.csv`` and ``summary.json``: the ``logger`` group.

``logger=csv`` (the default) adds nothing: the two files are written whatever the logger.
``logger=tensorboard`` and ``logger=mlflow`` also write, on the local disk only:

- the whole config, flattened to dotted names (:func:`flat_params`), once at the start:
  TensorBoard's hparams, MLflow's params;
- every number of every ``history.csv`` row, named as its column, at the row's step, as the
  row is appended to the file (:class:`LoggedHistory`): the loss, each phase time, each byte
  count, ``test_accuracy`` and ``test_loss`` on the steps that evaluated. A run that fails
  keeps what it logged, as it keeps its ``history.csv``;
- ``summary.json``'s numbers (:func:`summary_metrics`) at the end, as ``summary/<dotted
  name>`` at the last step written.

Each library is an optional extra of the package, imported only when its logger is chosen; a
missing one is refused in one line (:func:`make`) before any cluster starts. Under
``cluster=netem`` the driver inside the emulated network, which writes ``history.csv``, logs;
the process that builds the network only checks the library first. Before it imports MLflow,
:func:`make` sets ``MLFLOW_DISABLE_TELEMETRY=true`` in this process (MLflow 3 would send usage
data) and ``MLFLOW_ALLOW_FILE_STORE=true`` unless it is set (MLflow 3 opens a ``file:`` store
only so).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from dcoded.engine.record import HISTORY_COLUMNS, TEXT_COLUMNS, HistoryFile
from dcoded.errors import ConfigError
from dcoded.settings import SETTINGS, leaves

#: The columns of ``history.csv`` that hold numbers: each is a scalar (metric) of that name.
NUMBER_COLUMNS = tuple(c for c in HISTORY_COLUMNS if c != "step" and c not in TEXT_COLUMNS)
#: The prefix of the summary's figures.
SUMMARY_PREFIX = "summary/"


class Logger(Protocol):
    """What a run hands its logger: the config at the start, each batch of ``history.csv``
    rows as they are written, the summary at the end; :meth:`close` in every case (a logger
    that got no summary marks its run failed where the library has such a mark)."""

    def start(self, params: Mapping[str, Any]) -> None: ...

    def rows(self, rows: list[dict]) -> None: ...

    def finish(self, summary: Mapping) -> None: ...

    def close(self) -> None: ...


class CsvLogger:
    """``logger=csv``: nothing beyond ``history.csv`` and ``summary.json``, which the run
    writes itself."""

    def start(self, params: Mapping[str, Any]) -> None:
        pass

    def rows(self, rows: list[dict]) -> None:
        pass

    def finish(self, summary: Mapping) -> None:
        pass

    def close(self) -> None:
        pass


def make(c: Mapping, run_dir: str | Path | None) -> Logger:
    """The logger the plain config ``c`` chooses (``logger.name``; ``csv`` without a
    ``logger`` group), not started: nothing is written yet. Refuses in one
    :class:`ConfigError` line a library that is not installed, a run without a folder whose
    logger would write into it, and a store that is not on the local disk.

    >>> type(make({}, None)).__name__
    'CsvLogger'
    """
    conf = c.get("logger") or {}
    name = conf.get("name", "csv")
    run_dir = Path(run_dir) if run_dir is not None else None
    if name == "csv":
        return CsvLogger()
    if name == "tensorboard":
        _import_tensorboard()
        where = conf.get("log_dir") or _in_run_dir(run_dir, "tensorboard", "logger.log_dir")
        return TensorBoardLogger(Path(where).expanduser())
    if name == "mlflow":
        _import_mlflow()
        uri = conf.get("tracking_uri") or _in_run_dir(run_dir, "mlruns", "logger.tracking_uri")
        SETTINGS["logger.tracking_uri"].check("logger.tracking_uri", str(uri))
        experiment = conf.get("experiment_name") or "dcoded"
        return MlflowLogger(store_uri(uri), experiment, run_dir.name if run_dir else None)
    raise ConfigError(f"logger={name!r} is not known: choose {SETTINGS['logger.name'].accepts}")


def _in_run_dir(run_dir: Path | None, sub: str, setting: str) -> str:
    """``run_dir/sub``, where a logger writes by default; refused without a run folder, or
    where a symbolic link stands at that name (under ``cluster=netem`` root writes there)."""
    name = "tensorboard" if sub == "tensorboard" else "mlflow"
    if run_dir is None:
        raise ConfigError(
            f"logger={name} writes into the run folder's {sub}/ and this run has no folder: "
            f"give run() an out_dir, or set {setting}"
        )
    if (run_dir / sub).is_symlink():
        raise ConfigError(f"{run_dir / sub} is a symbolic link: remove it, or set {setting}")
    return str(run_dir / sub)


def store_uri(where: str | Path) -> str:
    """The ``file:`` URI of a local folder (relative to this process's folder) or of a
    ``file:`` URI.

    >>> store_uri("/tmp/runs"), store_uri("file:///tmp/runs")
    ('file:///tmp/runs', 'file:///tmp/runs')
    """
    where = str(where)
    if where.startswith("file:"):
        return where
    return Path(where).expanduser().absolute().as_uri()


def _missing(name: str, error: Exception) -> ConfigError:
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    return ConfigError(
        f"logger={name} needs the {name} package, which does not import here ({first}): "
        f"pip install 'dcoded[{name}]'"
    )


def _import_tensorboard():
    try:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
    except Exception as e:  # ImportError, or a build that does not fit this protobuf
        raise _missing("tensorboard", e) from None
    return SummaryWriter


def _import_mlflow():
    # nothing beyond the local disk: no usage telemetry; a file: store, which MLflow 3 only
    # opens when asked to (it is in maintenance mode there, and reads as before)
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        import mlflow.tracking
    except Exception as e:
        raise _missing("mlflow", e) from None
    return mlflow


def value_text(value: Any) -> str:
    """A config value as a parameter's text: a string as it is, anything else as JSON.

    >>> [value_text(v) for v in ("sgd", 0.05, None, True, [16])]
    ['sgd', '0.05', 'null', 'true', '[16]']
    """
    return value if isinstance(value, str) else json.dumps(value)


def flat_params(config: Mapping) -> dict[str, Any]:
    """The config's leaves by dotted name (a list is one leaf).

    >>> flat_params({"train": {"lr": 0.05}, "model": {"hidden": [16]}})
    {'train.lr': 0.05, 'model.hidden': [16]}
    """
    return dict(leaves(config))


def row_scalars(row: Mapping) -> dict[str, float]:
    """The numbers of a ``history.csv`` row by column, as the file holds them (each value
    read back from the text :mod:`csv` writes); the step, text columns and empty cells left
    out.

    >>> row_scalars({"step": 3, "train_loss": 0.5, "test_accuracy": None, "not_waited": "1"})
    {'train_loss': 0.5}
    """
    out = {}
    for column in NUMBER_COLUMNS:
        value = row.get(column)
        if value is None or value == "":
            continue
        try:
            out[column] = float(str(value))
        except ValueError:
            continue
    return out


def metric_name(name: str) -> str:
    """``name`` with each character other than a letter, a digit, ``_``, ``-`` or ``.`` as
    ``_`` (a worker's address in a name of the summary).

    >>> metric_name("environment.per_worker.tcp://127.0.0.1:4000.cores")
    'environment.per_worker.tcp___127.0.0.1_4000.cores'
    """
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)


def summary_metrics(summary: Mapping) -> dict[str, float]:
    """The summary's numbers as ``summary/<dotted name>`` (nested dicts joined with dots,
    names through :func:`metric_name`); text, lists, ``None`` and true/false left out, and
    ``config`` too (it is the parameters).

    >>> summary_metrics({"steps": 3, "final": {"test_accuracy": 0.5, "test_loss": None},
    ...                  "algorithm": "cdc", "config": {"train": {"lr": 0.1}}})
    {'summary/steps': 3.0, 'summary/final.test_accuracy': 0.5}
    """
    out: dict[str, float] = {}

    def walk(value, name: str) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                walk(inner, f"{name}.{key}")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[SUMMARY_PREFIX + metric_name(name)] = float(value)

    for key, value in summary.items():
        if key != "config":
            walk(value, str(key))
    return out


class TensorBoardLogger:
    """``logger=tensorboard``: event files in ``log_dir``, written with torch's
    ``SummaryWriter`` (TensorBoard stores each scalar as float32) and flushed at every batch
    of rows. The config is the run's hparams (numbers as numbers, anything else as
    :func:`value_text`)."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self._writer = None
        self._last_step = 0

    def start(self, params: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = _import_tensorboard()(str(self.log_dir))
        shown = {k: hparam_value(v) for k, v in params.items()}
        _, session_start, _ = hparams(shown, {})
        self._writer._get_file_writer().add_summary(session_start)
        self._writer.flush()

    def rows(self, rows: list[dict]) -> None:
        for row in rows:
            step = int(row["step"])
            for tag, value in row_scalars(row).items():
                self._writer.add_scalar(tag, value, step)
            self._last_step = max(self._last_step, step)
        self._writer.flush()

    def finish(self, summary: Mapping) -> None:
        for tag, value in summary_metrics(summary).items():
            self._writer.add_scalar(tag, value, self._last_step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def hparam_value(value: Any) -> float | str:
    """A config value as TensorBoard's hparams take it: a number, or its
    :func:`value_text`."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return value_text(value)


class MlflowLogger:
    """``logger=mlflow``: a run in the experiment ``experiment_name`` (made if missing) of
    the local store at ``uri``, through ``MlflowClient``; everything goes in batches of the
    most one call takes. A parameter's value longer than MLflow takes is cut to its limit.
    The run ends ``FINISHED`` with a summary, ``KILLED`` with an interrupted run's summary,
    ``FAILED`` without one."""

    def __init__(self, uri: str, experiment_name: str, run_name: str | None):
        self.uri, self.experiment_name, self.run_name = uri, experiment_name, run_name
        self._client = None
        self.run_id: str | None = None
        self._ended = False
        self._last_step = 0

    def start(self, params: Mapping[str, Any]) -> None:
        _import_mlflow()
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient
        from mlflow.utils import validation

        try:
            self._client = client = MlflowClient(tracking_uri=self.uri)
            found = client.get_experiment_by_name(self.experiment_name)
            if found is None:
                experiment = client.create_experiment(self.experiment_name)
            else:
                experiment = found.experiment_id
            run = client.create_run(experiment, run_name=self.run_name)
            self.run_id = run.info.run_id
        except Exception as e:  # MlflowException, or the disk's OSError
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(
                f"logger=mlflow cannot start a run in {self.uri} "
                f"(logger.experiment_name={self.experiment_name!r}): {first}"
            ) from None
        longest = getattr(validation, "MAX_PARAM_VAL_LENGTH", 500)
        key_most = getattr(validation, "MAX_ENTITY_KEY_LENGTH", 250)
        named = {metric_name(k)[:key_most]: value_text(v)[:longest] for k, v in params.items()}
        batch = getattr(validation, "MAX_PARAMS_TAGS_PER_BATCH", 100)
        items = [Param(k, v) for k, v in named.items()]
        try:
            for i in range(0, len(items), batch):
                client.log_batch(self.run_id, params=items[i : i + batch])
        except BaseException:
            self.close()  # the run that was made ends failed
            raise

    def _log(self, values: list[tuple[str, float, int]]) -> None:
        from mlflow.entities import Metric
        from mlflow.utils import validation

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v, step in values]
        batch = getattr(validation, "MAX_METRICS_PER_BATCH", 1000)
        for i in range(0, len(metrics), batch):
            self._client.log_batch(self.run_id, metrics=metrics[i : i + batch])

    def rows(self, rows: list[dict]) -> None:
        values = []
        for row in rows:
            step = int(row["step"])
            values += [(k, v, step) for k, v in row_scalars(row).items()]
            self._last_step = max(self._last_step, step)
        self._log(values)

    def finish(self, summary: Mapping) -> None:
        self._log([(k, v, self._last_step) for k, v in summary_metrics(summary).items()])
        status = "FINISHED" if summary.get("status", "finished") == "finished" else "KILLED"
        self._client.set_terminated(self.run_id, status)
        self._ended = True

    def close(self) -> None:
        if self.run_id is not None and not self._ended:
            self._ended = True
            try:
                self._client.set_terminated(self.run_id, "FAILED")
            except Exception:  # the error the run ends with is the one to report
                pass


class LoggedHistory(HistoryFile):
    """``history.csv`` (:class:`~dcoded.engine.record.HistoryFile`) that hands every row it
    appends to ``logger`` once the file has it, as the file holds it: with its first rows, the
    rows a resumed run starts with too."""

    def __init__(self, path: Path | None, earlier=(), logger: Logger | None = None):
        super().__init__(path, earlier)
        self.logger = logger if logger is not None else CsvLogger()

    def append(self, rows: list[dict], sync: bool = False) -> None:
        before = list(self._earlier or [])  # written with the first rows
        super().append(rows, sync=sync)
        if before or rows:
            self.logger.rows([*before, *rows])
