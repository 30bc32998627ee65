"""Clusters: an existing scheduler over TLS (distributed's Security), what is refused, and what
the run learns from its workers before training (threads, hosts, whether they read the data)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client, LocalCluster
from distributed.node import ServerNode
from distributed.security import Security
from distributed.utils import clean_dashboard_address

import dcoded.cluster
import dcoded.errors
import dcoded.run
import dcoded.summary
from dcoded import preflight
from dcoded.config import compose_config
from dcoded.errors import ClusterError, DatasetError
from tests.conftest import TINY, tiny_config
from tests.test_data import make_idx_folder

NO_PROCESSES = [o for o in TINY if "processes" not in o]


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """A scheduler and 3 workers that speak TLS only, and the PEM files a client needs."""
    security = Security.temporary()
    folder = tmp_path_factory.mktemp("tls")
    paths = {}
    for name, contents in [
        ("ca_file", security.tls_ca_file),
        ("cert", security.tls_client_cert),
        ("key", security.tls_client_key),
    ]:
        paths[name] = folder / f"{name}.pem"
        paths[name].write_text(contents)
    with LocalCluster(
        n_workers=3,
        threads_per_worker=1,
        processes=False,
        protocol="tls://",
        host="127.0.0.1",
        security=security,
        dashboard_address=":0",
    ) as cluster:
        yield cluster.scheduler_address, paths


def test_train_on_an_existing_scheduler_over_tls(tls_cluster):
    address, paths = tls_cluster
    assert address.startswith("tls://127.0.0.1:")
    cfg = compose_config(
        [
            *NO_PROCESSES,
            "cluster=address",
            f"cluster.address={address}",
            "cluster.n_workers=3",
            *(f"cluster.tls.{k}={v}" for k, v in paths.items()),
        ]
    )
    tls = dcoded.run.run(cfg)
    serial = dcoded.run.run(compose_config([*TINY, "algorithm=serial", "cluster.n_workers=3"]))
    assert tls["param_sha256"] == serial["param_sha256"]
    assert tls["environment"]["cluster"] == "address"


def test_a_tls_scheduler_refuses_a_client_without_certificates(tls_cluster):
    address, _ = tls_cluster
    cfg = compose_config(
        [
            *NO_PROCESSES,
            "cluster=address",
            f"cluster.address={address}",
            "cluster.n_workers=3",
            "cluster.connect_timeout_s=3",
        ]
    )
    with pytest.raises(ClusterError, match="cannot reach"):
        dcoded.run.run(cfg)


def test_a_refused_port_fails_at_once_not_after_the_connect_timeout(monkeypatch):
    """Nothing listens on the port: the connection is refused, and retrying for the whole
    connect timeout (as ``Client`` does) would tell the user nothing more."""

    def retries(*args, **kwargs):
        raise AssertionError("Client was asked to retry a refused port")

    monkeypatch.setattr(dcoded.cluster, "Client", retries)

    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = compose_config(
        [
            *NO_PROCESSES,
            "cluster=address",
            f"cluster.address=tcp://127.0.0.1:{port}",
            "cluster.connect_timeout_s=60",
        ]
    )
    with pytest.raises(ClusterError, match=f"nothing listens on port {port}"):
        dcoded.run.run(cfg)


@pytest.mark.parametrize(
    "address", ["localhost:99999", "tcp://127.0.0.1:0", "tls://127.0.0.1:65536"]
)
def test_a_port_outside_the_range_is_refused_before_any_connection(monkeypatch, address):
    """``localhost:99999`` was tried (on another port) and said "nothing listens on port
    99999": no port is tried that no scheduler can listen on."""

    def connects(*args, **kwargs):
        raise AssertionError("a connection was tried")

    monkeypatch.setattr(dcoded.cluster, "Client", connects)
    monkeypatch.setattr(socket, "create_connection", connects)
    cfg = compose_config([*NO_PROCESSES, "cluster=address", f"cluster.address={address}"])
    port = address.rsplit(":", 1)[1]
    with pytest.raises(dcoded.errors.ConfigError, match=f"port {port} is outside 1..65535"):
        dcoded.run.run(cfg)


def test_a_scheduler_that_binds_a_moment_later_is_waited_for():
    """A scheduler started just before the run (``dask scheduler &`` in a batch script)
    refuses its port for a moment: that is not failed at once."""
    import threading

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def bind_later():
        threading.Event().wait(1.0)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    late = threading.Thread(target=bind_later)
    late.start()
    try:
        dcoded.cluster._refused_at_once(f"tcp://127.0.0.1:{port}", grace_s=10)
    finally:
        late.join()
        listener.close()


@pytest.fixture
def other_server():
    """A local server of another protocol: ``silent`` waits for a request (as HTTP does),
    ``banner`` sends one line first (as SSH does)."""
    import threading

    servers = []

    def start(kind: str) -> str:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        servers.append(listener)

        def serve():
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                if kind == "banner":
                    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                servers.append(conn)

        threading.Thread(target=serve, daemon=True).start()
        return f"tcp://127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for s in servers:
        s.close()


def test_a_server_that_never_speaks_dask_fails_within_the_connect_timeout(other_server):
    """An HTTP server on the port accepts and waits for a request: ``Client`` waited past
    its timeout (400 s seen), the run says what it met within ``cluster.connect_timeout_s``."""
    import time

    address = other_server("silent")
    cfg = compose_config(
        [
            *NO_PROCESSES,
            "cluster=address",
            f"cluster.address={address}",
            "cluster.connect_timeout_s=2",
        ]
    )
    began = time.monotonic()
    with pytest.raises(ClusterError, match="sent no Dask handshake within 2 s"):
        dcoded.run.run(cfg)
    assert time.monotonic() - began < 30


def test_a_server_of_another_protocol_is_named_not_read_as_a_frame(other_server):
    """A banner read as a frame length asked for 3.07 EiB: the run names the bytes instead."""
    address = other_server("banner")
    cfg = compose_config([*NO_PROCESSES, "cluster=address", f"cluster.address={address}"])
    with pytest.raises(
        ClusterError, match=r"does not speak Dask's protocol: it began with b'SSH-2"
    ):
        dcoded.run.run(cfg)


def test_a_real_scheduler_passes_the_handshake_check():
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster:
        dcoded.cluster._refused_at_once(cluster.scheduler_address, 1.0, handshake_s=5)


def test_incomplete_tls_settings_fail_before_connecting(tmp_path):
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    cfg = compose_config(
        [
            *NO_PROCESSES,
            "cluster=address",
            "cluster.address=tls://127.0.0.1:1",
            f"cluster.tls.cert={cert}",
        ]
    )
    with pytest.raises(dcoded.errors.ConfigError, match=r"cluster\.tls needs"):
        dcoded.run.run(cfg)


def test_no_fixed_port_is_taken_without_a_dashboard(monkeypatch, recwarn):
    """Dask's scheduler serves HTTP even without a dashboard, by default on port 8787: every
    run warned "Port 8787 is already in use" while another Dask ran. Each server asks for a
    free port instead, and no dashboard is started unless cluster.dashboard is set."""
    asked = []
    real = ServerNode.start_http_server

    def record(self, routes, dashboard_address, default_port=0, **kwargs):
        ports = [a["port"] for a in clean_dashboard_address(dashboard_address or default_port)]
        asked.append((type(self).__name__, ports))
        return real(self, routes, dashboard_address, default_port, **kwargs)

    monkeypatch.setattr(ServerNode, "start_http_server", record)
    dcoded.run.run(tiny_config())
    assert ("Scheduler", [0]) in asked and all(ports == [0] for _, ports in asked)
    assert not [w for w in recwarn if "already in use" in str(w.message)]


@pytest.fixture(scope="module")
def two_thread_cluster():
    """A scheduler with 2 in-process workers of 2 threads each, as `dask worker` starts them
    by default."""
    with LocalCluster(
        n_workers=2, threads_per_worker=2, processes=False, dashboard_address=":0"
    ) as cluster:
        yield cluster.scheduler_address


def _on(address: str, *overrides: str):
    return compose_config(
        [*NO_PROCESSES, "cluster=address", f"cluster.address={address}", *overrides]
    )


def test_each_workers_threads_are_recorded_and_more_than_one_is_warned(two_thread_cluster, capsys):
    summary = dcoded.run.run(_on(two_thread_cluster, "cluster.n_workers=2"))
    per = summary["environment"]["per_worker"]
    assert sorted(per) == summary["environment"]["workers"]
    assert {f["threads"] for f in per.values()} == {2}
    assert {f["host"] for f in per.values()} == {socket.gethostname()}
    warned = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning: ")]
    assert len(warned) == 1 and "2 of 2 workers run more than one thread" in warned[0]
    assert any("more than one thread" in e for e in summary["events"])
    assert "per worker: 2 Dask threads, 1 torch thread" in dcoded.summary.format_results(summary)


def test_one_thread_per_worker_is_not_warned(tls_cluster, capsys):
    address, paths = tls_cluster
    tls = (f"cluster.tls.{k}={v}" for k, v in paths.items())
    summary = dcoded.run.run(_on(address, "cluster.n_workers=3", *tls))
    assert {f["threads"] for f in summary["environment"]["per_worker"].values()} == {1}
    assert "warning" not in capsys.readouterr().err and not summary["events"]


def test_a_clusters_warnings_are_printed_once_for_the_runs_that_share_it(
    two_thread_cluster, capsys, monkeypatch
):
    """The jobs of a sweep share one cluster: its warnings (more threads, more processes than
    cores) are printed by the first run only, and noted in every run's log."""
    monkeypatch.setattr(dcoded.run, "_SAID", set())
    real = dcoded.run.check_workers

    def one_core_each(*args):  # as if every worker were a process of its own on one core
        facts = real(*args)
        return {
            w: {**f, "pid": k, "cpus": [0], "cores": 1} for k, (w, f) in enumerate(facts.items())
        }

    monkeypatch.setattr(dcoded.run, "check_workers", one_core_each)
    warned, events = [], []
    for _ in range(2):
        summary = dcoded.run.run(_on(two_thread_cluster, "cluster.n_workers=2"))
        err = capsys.readouterr().err.splitlines()
        warned.append([ln for ln in err if ln.startswith("warning: ")])
        events.append(summary["events"])
    assert len(warned[0]) == 2 and any("share the 1 cores" in ln for ln in warned[0])
    assert warned[1] == []
    assert all(any("share the 1 cores" in e for e in ev) for ev in events)
    assert all(any("more than one thread" in e for e in ev) for ev in events)


def test_a_warning_is_said_once_by_the_processes_that_share_a_file_of_them(
    tmp_path, capsys, monkeypatch
):
    """On the emulated network each job of a sweep has a driver process of its own: the
    cores warning was printed by every job's (four times by ``make compare``)."""
    monkeypatch.setenv(dcoded.run.SAID_FILE, str(tmp_path / "said"))
    for _ in range(2):  # two processes: each its own memory of what it said
        monkeypatch.setattr(dcoded.run, "_SAID", set())
        dcoded.run._warn_once("4 worker processes share the 2 cores", ["w1", "w2"])
        dcoded.run._warn_once("another warning", ["w1", "w2"])
    dcoded.run._warn_once("4 worker processes share the 2 cores", ["w3"])  # other workers
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "warning: 4 worker processes share the 2 cores",
        "warning: another warning",
        "warning: 4 worker processes share the 2 cores",
    ]


def test_a_worker_that_cannot_read_the_data_is_named_before_training(
    two_thread_cluster, tmp_path, monkeypatch
):
    """The driver reads the folder; the workers (here made to look elsewhere) do not."""
    make_idx_folder(tmp_path / "mnist", n_train=48)
    monkeypatch.setattr(preflight, "dataset_files", lambda cfg: [Path("/elsewhere/mnist/x")])
    run_dir = tmp_path / "run"
    with pytest.raises(DatasetError) as err:
        dcoded.run.run(
            _on(
                two_thread_cluster,
                "cluster.n_workers=2",
                "algorithm=ssgd",
                "dataset=mnist",
                f"dataset.path={tmp_path / 'mnist'}",
            ),
            out_dir=run_dir,
        )
    message = str(err.value)
    with Client(two_thread_cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
    assert all(f"{w} (host {socket.gethostname()})" in message for w in workers)
    assert "/elsewhere/mnist/x" in message and "every worker" in message
    assert not run_dir.exists()  # nothing was measured, nothing written


@pytest.mark.slow
@pytest.mark.parallel_safe
def test_a_relative_dataset_path_reaches_a_worker_started_in_another_folder(tmp_path):
    """`dask worker` started by hand in another folder: a relative dataset.path was sent as
    it was typed, and the worker failed with "is not a folder", as if the driver's data were
    missing. The driver now sends it resolved."""
    driver, elsewhere = tmp_path / "driver", tmp_path / "elsewhere"
    make_idx_folder(driver / "data" / "mnist", n_train=48)
    elsewhere.mkdir()
    bin_dir = Path(sys.executable).parent
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": elsewhere}
    scheduler = ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]
    worker = ["worker", address, "--nthreads", "1", "--no-dashboard"]
    started = [subprocess.Popen([bin_dir / "dask", *args], **quiet) for args in (scheduler, worker)]
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "dcoded",
                *NO_PROCESSES,
                "algorithm=ssgd",
                "dataset=mnist",
                "dataset.path=data/mnist",
                "cluster=address",
                f"cluster.address={address}",
                "cluster.n_workers=1",
                "cluster.connect_timeout_s=60",
                f"hydra.run.dir={tmp_path / 'run'}",
            ],
            cwd=driver,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        for p in started:
            p.kill()
            p.wait()
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dataset"] == "mnist" and summary["steps"] == 3
    (worker_facts,) = summary["environment"]["per_worker"].values()
    assert worker_facts["threads"] == 1


def test_teardown_closes_and_counts_every_state_of_the_run():
    """It once shadowed its list with the loop variable and failed on every worker of a run
    made with ``client=`` or ``cluster=address``, logging four tracebacks."""
    from dcoded.engine import registry

    class Closes:
        closed = 0

        def close(self):
            Closes.closed += 1

    registry._STATES.update({("dcteardown", 0): Closes(), ("dcteardown", 1): Closes()})
    assert registry.teardown("dcteardown") == 2
    assert Closes.closed == 2 and ("dcteardown", 0) not in registry._STATES


@pytest.mark.slow
@pytest.mark.parallel_safe
def test_runs_share_a_client_the_caller_made():
    """``run(cfg, client=...)``: a notebook's cluster serves several runs and stays up; each
    run drops its replicas from the workers when it ends, and trains as ``serial`` does."""
    from dcoded.engine import registry

    overrides = ["cluster.n_workers=3", "coding.redundancy=2", "transport=dask"]
    serial = dcoded.run.run(tiny_config("algorithm=serial", *overrides))
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        before = set(registry._STATES)  # what other tests' in-process workers left, if any
        first = dcoded.run.run(tiny_config(*overrides), client=client)
        assert not [k for k in registry._STATES if k not in before and k[0].startswith("dc")]
        second = dcoded.run.run(tiny_config(*overrides, "coding.shuffle=uncoded"), client=client)
        assert client.status == "running" and len(client.scheduler_info()["workers"]) == 3
    assert first["param_sha256"] == second["param_sha256"] == serial["param_sha256"]
    assert first["environment"]["cluster"] == "client"
    with pytest.raises(dcoded.errors.ConfigError, match="do not pass a client"):
        dcoded.run.run(compose_config(["cluster=netem"]), client=object())


def test_a_dashboard_without_bokeh_is_refused_before_the_cluster_starts(monkeypatch):
    """``cluster.dashboard=true`` without bokeh started the cluster and printed a link to a page
    that said "Dask needs bokeh": it is refused first, in one line naming the extra."""

    def starts(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setitem(sys.modules, "bokeh", None)  # import bokeh fails, installed or not
    monkeypatch.setattr(dcoded.cluster, "LocalCluster", starts)
    cfg = compose_config([*NO_PROCESSES, "cluster.dashboard=true"])
    with pytest.raises(dcoded.errors.ConfigError) as refused:
        dcoded.run.run(cfg)
    assert str(refused.value) == (
        "cluster.dashboard=true needs the bokeh package (bokeh>=3.1.0), which does not import "
        "here: pip install 'dcoded[dashboard]'"
    )


@pytest.mark.parametrize(("version", "refused"), [("3.4.1", False), ("2.4.3", True)])
def test_a_dashboard_needs_the_bokeh_dask_needs(monkeypatch, version, refused):
    import types

    monkeypatch.setitem(sys.modules, "bokeh", types.SimpleNamespace(__version__=version))
    cfg = {"kind": "local", "dashboard": True}
    if refused:
        with pytest.raises(ValueError, match=f"not bokeh {version}: pip install"):
            dcoded.cluster.check_cluster_config(cfg, 4)
    else:
        dcoded.cluster.check_cluster_config(cfg, 4)
    dcoded.cluster.check_cluster_config({**cfg, "dashboard": False}, 4)  # not asked: no check
