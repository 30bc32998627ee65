"""Clusters: an existing scheduler over TLS (distributed's Security), and what is refused."""

from __future__ import annotations

import pytest
from distributed import LocalCluster
from distributed.node import ServerNode
from distributed.security import Security
from distributed.utils import clean_dashboard_address

import dcoded.run
from dcoded.cluster import ClusterError
from dcoded.config import compose_config
from tests.conftest import TINY, tiny_config

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
        dashboard_address=None,
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
    with pytest.raises(dcoded.run.ConfigError, match=r"cluster\.tls needs"):
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
