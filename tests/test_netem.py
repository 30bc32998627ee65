"""The emulated network, for real: namespaces, capped links, wire counters, clean-up.

Needs root and iproute2 (CI has both and runs these); elsewhere they are skipped with the
reason, and ``cluster=netem`` itself fails at once with one clear line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dcoded.run
from dcoded import netem
from dcoded.config import compose_config
from tests.conftest import TINY, tiny_config

ROOT = Path(__file__).resolve().parent.parent
CAN_NETEM = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
needs_netem = pytest.mark.skipif(not CAN_NETEM, reason="needs root and iproute2 (ip, tc)")
NETEM = ["cluster=netem"]


def netem_config(*overrides):
    return compose_config([*(o for o in TINY if "processes" not in o), *NETEM, *overrides])


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    if CAN_NETEM:
        assert netem.stale_namespaces() == []


SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 9100)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    t0 = t0 or time.monotonic(); n += len(b)
print(n, time.monotonic() - t0, flush=True)
"""
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], 9100)); c.sendall(b"x" * int(sys.argv[2])); c.close()
"""


def _transfer(net, sender: str, receiver: str, nbytes: int) -> float:
    """Seconds the receiver took to get ``nbytes`` from the sender over the emulated links."""
    rx, tx = net.hosts[receiver], net.hosts[sender]
    server = subprocess.Popen(
        ["ip", "netns", "exec", rx.ns, sys.executable, "-c", SERVER, rx.ip],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout.readline().strip() == "ready"
    subprocess.run(
        ["ip", "netns", "exec", tx.ns, sys.executable, "-c", CLIENT, rx.ip, str(nbytes)],
        check=True,
        timeout=120,
    )
    got, seconds = server.communicate(timeout=120)[0].split()
    assert int(got) == nbytes
    return float(seconds)


@needs_netem
def test_links_are_capped_in_both_directions():
    """Worker links at 20 Mbit/s, the driver's at 400: worker -> driver is capped by the
    worker's egress, driver -> worker by the worker's ingress (the bridge end's egress)."""
    net = netem.build(n_workers=1, rate_mbit=20, driver_rate_mbit=400)
    try:
        nbytes = 3_000_000
        expected = nbytes * 8 / 20e6  # 1.2 s
        up = _transfer(net, "w0", "drv", nbytes)
        down = _transfer(net, "drv", "w0", nbytes)
        for seconds in (up, down):
            assert 0.85 * expected < seconds < 1.6 * expected, (up, down, expected)
    finally:
        netem.destroy(net)


@needs_netem
def test_netem_run_equals_local_bit_for_bit_and_counts_wire_bytes(tmp_path):
    common = ["cluster.n_workers=3", "train.steps=4"]
    emulated = dcoded.run.run(
        netem_config(*common, "cluster.bandwidth_mbit=200"), out_dir=tmp_path / "netem"
    )
    local = dcoded.run.run(tiny_config(*common))
    assert emulated["param_sha256"] == local["param_sha256"]
    b = emulated["bytes_per_worker"]
    assert b["wire"] is not None and b["wire"] > b["transport"] > 0
    assert emulated["environment"]["cluster"] == "netem"
    assert all(w.startswith(f"tcp://{netem.SUBNET}.") for w in emulated["environment"]["workers"])
    assert (tmp_path / "netem" / "history.csv").exists()


@needs_netem
@pytest.mark.parametrize("algorithm", ["ssgd"])
def test_parameter_server_on_netem_reports_wire(tmp_path, algorithm):
    s = dcoded.run.run(
        netem_config(f"algorithm={algorithm}", "cluster.n_workers=2", "train.steps=3"),
        out_dir=tmp_path,
    )
    assert s["bytes_per_worker"]["wire"] >= s["bytes_per_worker"]["unicast"]


@needs_netem
def test_a_failing_run_leaves_nothing_behind(tmp_path):
    with pytest.raises(netem.NetemRunFailed):
        dcoded.run.run(
            netem_config("cluster.n_workers=2", "train.step_timeout_s=0.001"), out_dir=tmp_path
        )


@needs_netem
def test_cleanup_removes_a_stale_set():
    net = netem.build(n_workers=2, rate_mbit=50)
    assert len(netem.stale_namespaces()) == 5  # hub, scheduler, 2 workers, driver
    del net  # as if the run was killed
    out = subprocess.run(
        [sys.executable, "-m", "dcoded.netem", "cleanup"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "removed 5" in out.stdout


def test_without_root_it_fails_at_once_pointing_to_local(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(netem.NetemUnavailable, match="cluster=local"):
        dcoded.run.run(netem_config())


def test_bad_bandwidth_is_a_config_error():
    with pytest.raises(dcoded.run.ConfigError, match="bandwidth_mbit"):
        dcoded.run.run(netem_config("cluster.bandwidth_mbit=-5"))


def interrupt_after_first_checkpoint(args: list[str], checkpoints) -> None:
    """Start ``python -m dcoded *args``, Ctrl-C it once ``checkpoints()`` finds one, and
    check that it failed and left no namespace behind."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dcoded", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while not checkpoints():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert netem.stale_namespaces() == []


@needs_netem
@pytest.mark.slow
def test_ctrl_c_removes_everything(tmp_path):
    interrupt_after_first_checkpoint(
        [
            *NETEM,
            "progress=false",
            "cluster.n_workers=2",
            "train.steps=100000",
            "train.checkpoint_every=5",
            f"hydra.run.dir={tmp_path}",
        ],
        lambda: (tmp_path / "checkpoint.npz").exists(),
    )
    assert (tmp_path / "checkpoint.npz").exists()


def _qdisc_rates(net) -> set[str]:
    rates = set()
    for i, host in enumerate(net.hosts.values()):
        for ns, dev in ((host.ns, "eth0"), (net.hub, f"v{i}")):
            out = subprocess.run(
                ["tc", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True, text=True
            ).stdout
            rates.add(out.split(" rate ")[1].split()[0])
    return rates


@needs_netem
def test_retune_sets_every_link_both_ways():
    net = netem.build(n_workers=2, rate_mbit=50)
    try:
        assert _qdisc_rates(net) == {"50Mbit"}
        netem.retune(net, 30)
        assert _qdisc_rates(net) == {"30Mbit"}
        assert {h.rate_mbit for h in net.hosts.values()} == {30.0}
    finally:
        netem.destroy(net)


MULTIRUN = [
    *(o for o in TINY if "processes" not in o),
    *NETEM,
    "cluster.n_workers=2",
    "train.steps=3",
]


@needs_netem
@pytest.mark.slow
def test_a_multirun_shares_one_emulated_cluster_and_retunes_it(tmp_path):
    """Jobs of a multirun reuse one cluster (one scheduler log), each at its own rate, with
    the same result bit for bit; nothing is left once the multirun ends."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dcoded",
            "-m",
            *MULTIRUN,
            "cluster.bandwidth_mbit=200,40",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*/summary.json"))]
    assert [s["environment"]["netem"]["bandwidth_mbit"] for s in summaries] == [200.0, 40.0]
    assert len({s["param_sha256"] for s in summaries}) == 1
    assert [p.name for p in tmp_path.glob("*/scheduler.log")] == ["scheduler.log"]
    assert netem.stale_namespaces() == []


@needs_netem
@pytest.mark.slow
def test_ctrl_c_in_a_multirun_removes_the_shared_cluster(tmp_path):
    interrupt_after_first_checkpoint(
        [
            "-m",
            *MULTIRUN,
            "train.steps=100000",
            "train.checkpoint_every=5",
            "coding.redundancy=1,2",
            f"hydra.sweep.dir={tmp_path}",
        ],
        lambda: list(tmp_path.glob("*/checkpoint.npz")),
    )
    assert list(tmp_path.glob("*/checkpoint.npz"))
