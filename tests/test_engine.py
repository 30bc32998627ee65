"""The training engine against independent references: the serial CDC math (bit for bit),
plain single-process PyTorch (within float tolerance), and the closed-form loads."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from dcoded.coding import best_m, hybrid_plan
from dcoded.coding.shuffles import KINDS
from dcoded.data import load_dataset, step_indices
from dcoded.engine.replica import param_sha256
from dcoded.models import build_model
from dcoded.results import read_history
from dcoded.run import run
from tests.conftest import tiny_config

# (n_workers, redundancy, shuffle, group_size, model)
CASES = [
    (2, 1, "coded", None, "dnn"),
    (2, 2, "coded", None, "dnn"),
    (3, 1, "coded", None, "dnn"),
    (3, 2, "coded", None, "dnn"),
    (3, 3, "coded", None, "dnn"),
    (4, 1, "coded", None, "dnn"),
    (4, 2, "coded", None, "dnn"),
    (4, 3, "coded", None, "dnn"),
    (4, 4, "coded", None, "dnn"),
    (3, 2, "uncoded", None, "dnn"),
    (4, 2, "uncoded", None, "dnn"),
    (4, 3, "uncoded", None, "dnn"),
    (4, 1, "coded", 2, "dnn"),
    (4, 2, "coded", 2, "dnn"),
    (6, 2, "coded", 3, "dnn"),
    (6, 2, "uncoded", 3, "dnn"),
    (3, 2, "coded", None, "cnn"),
    (4, 3, "coded", None, "cnn"),
    (4, 2, "uncoded", 2, "cnn"),
    (2, 1, "summed", None, "dnn"),
    (3, 2, "summed", None, "dnn"),
    (4, 1, "summed", None, "dnn"),
    (4, 2, "summed", None, "dnn"),
    (4, 3, "summed", None, "dnn"),
    (4, 4, "summed", None, "dnn"),
    (5, 2, "summed", None, "dnn"),
    (4, 2, "summed", 2, "dnn"),
    (6, 2, "summed", 3, "dnn"),
    (4, 2, "summed", None, "cnn"),
    (3, 2, "pieces", None, "dnn"),
    (4, 3, "pieces", None, "dnn"),
    (6, 2, "pieces", 3, "dnn"),
    (6, 1, "coded", 2, "dnn"),
    (8, 2, "summed", 2, "dnn"),
]
TRANSPORTS = ["dask", "direct"]
CNN = ["model.channels=[4,8]", "model.hidden=16"]


def _overrides(K, r, shuffle, g, model):
    out = [
        f"cluster.n_workers={K}",
        f"coding.redundancy={r}",
        f"coding.shuffle={shuffle}",
        f"coding.group_size={'null' if g is None else g}",
        f"model={model}",
    ]
    return out + (CNN if model == "cnn" else [])


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "K{}-r{}-{}-g{}-{}".format(*c))
def test_cdc_equals_serial_bit_for_bit(train, case, transport):
    serial = train("algorithm=serial", *_overrides(*case))
    cdc = train("algorithm=cdc", f"transport={transport}", *_overrides(*case))
    assert cdc["param_sha256"] == serial["param_sha256"]
    assert cdc["final"]["train_loss"] == serial["final"]["train_loss"]
    assert cdc["n_params"] == serial["n_params"]
    assert cdc["transport"] == transport and serial["transport"] is None


# (n_workers, redundancy, hybrid_m or None for the library's choice, group_size, batch_size):
# several K <= 9, m from 1 (a summed shuffle) to r (CDC's family), values left empty (K=4,
# r=3, m=2), hierarchical clusters, r = g with clusters, r = K; batches just above C(g, r)
HYBRID_CASES = [
    (3, 2, 1, None, 24),
    (4, 2, 2, None, 24),
    (4, 3, 2, None, 24),
    (5, 3, None, None, 24),
    (6, 4, None, None, 24),
    (6, 2, 1, 3, 24),
    (8, 3, 2, 4, 24),
    (4, 2, None, 2, 24),
    (7, 4, 2, None, 40),
    (8, 5, None, None, 60),
    (9, 5, None, None, 130),
    (4, 4, None, None, 24),
]


def _hybrid(K, r, m, g, batch):
    return [
        f"cluster.n_workers={K}",
        f"coding.redundancy={r}",
        "coding.shuffle=hybrid",
        f"coding.hybrid_m={'null' if m is None else m}",
        f"coding.group_size={'null' if g is None else g}",
        f"train.batch_size={batch}",
        "train.steps=2",
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", HYBRID_CASES, ids=lambda c: "K{}-r{}-m{}-g{}-B{}".format(*c))
def test_hybrid_equals_serial_bit_for_bit(train, case, transport):
    serial = train("algorithm=serial", *_hybrid(*case))
    cdc = train("algorithm=cdc", f"transport={transport}", *_hybrid(*case))
    assert cdc["param_sha256"] == serial["param_sha256"]
    assert cdc["final"]["train_loss"] == serial["final"]["train_loss"]
    K, r, m, g, _ = case
    gg = g or K
    expected_m = m if m is not None else best_m(gg, r)
    for s in (serial, cdc):  # the choice and the family are on record
        assert s["shuffle"] == "hybrid" and s["hybrid_m"] == expected_m
        plan = hybrid_plan(gg, r, expected_m)
        assert s["hybrid"]["family"] == [list(x) for x in plan.family]
        assert len(s["hybrid"]["active"]) == len(plan.charges)
    if r < gg:
        assert set(cdc["bytes_per_worker"]["transport_by_kind"]) <= {"hyb", "red", "seg"}
        assert cdc["bytes_per_worker"]["transport_by_kind"]["hyb"] > 0


def test_hybrid_order_is_its_own():
    """The hybrid adds in another order than the coded shuffle, and its bits depend on m, so
    the comparison above could fail; serial follows each."""
    common = ["cluster.n_workers=6", "coding.redundancy=4", "train.steps=3"]
    sha = {}
    for a in ("serial", "cdc"):
        for sh, m in (("coded", "null"), ("hybrid", 2), ("hybrid", 3)):
            s = run(
                tiny_config(
                    f"algorithm={a}", f"coding.shuffle={sh}", f"coding.hybrid_m={m}", *common
                )
            )
            sha[a, sh, m] = s["param_sha256"]
    assert sha["cdc", "hybrid", 2] == sha["serial", "hybrid", 2]
    assert sha["cdc", "hybrid", 3] == sha["serial", "hybrid", 3]
    assert sha["cdc", "coded", "null"] == sha["serial", "coded", "null"]
    assert (
        len(
            {sha["serial", "coded", "null"], sha["serial", "hybrid", 2], sha["serial", "hybrid", 3]}
        )
        == 3
    )


def test_summed_order_is_its_own():
    """The summed shuffle adds in another order than the coded one, so its bits differ (the
    comparison above could fail), and serial follows each."""
    runs = {
        (a, sh): run(tiny_config(f"algorithm={a}", f"coding.shuffle={sh}", "train.steps=5"))
        for a in ("serial", "cdc")
        for sh in ("coded", "summed")
    }
    sha = {k: v["param_sha256"] for k, v in runs.items()}
    assert sha[("cdc", "coded")] == sha[("serial", "coded")]
    assert sha[("cdc", "summed")] == sha[("serial", "summed")]
    assert sha[("serial", "coded")] != sha[("serial", "summed")]


@pytest.mark.parametrize(
    "extra",
    [
        ["transport.steps_per_task=1"],  # one task per step, pipelined
        ["transport.steps_per_task=1", "train.pipeline=false"],
        ["transport.steps_per_task=2", "train.eval_every=3"],  # chunks cut by evaluations
        ["coding.redundancy=4", "transport.steps_per_task=1"],
    ],
    ids=["per-step", "per-step-unpipelined", "chunks", "replicated-per-step"],
)
def test_direct_task_shapes_equal_serial(train, extra, tmp_path):
    serial = train("algorithm=serial", "train.steps=7", *extra)
    direct = train("algorithm=cdc", "transport=direct", "train.steps=7", *extra, out_dir=tmp_path)
    assert direct["param_sha256"] == serial["param_sha256"]
    rows = read_history(tmp_path)
    steps = [r for r in rows if r["step_s"]]
    assert [int(r["step"]) for r in steps] == list(range(7))
    # the steps' times add up to the training time the driver measured
    total = direct["time_s"]["total"]
    assert sum(float(r["step_s"]) for r in steps) == pytest.approx(total, abs=1e-3)


def test_sha_changes_with_the_seed(train):
    """The comparison above can fail: another seed (init and sample order) gives other bits."""
    a = train("algorithm=serial", "train.seed=0")
    b = train("algorithm=serial", "train.seed=1")
    assert a["param_sha256"] != b["param_sha256"]


def _plain_torch(n_steps: int, batch: int, lr: float, momentum: float, seed: int, hidden):
    """Textbook single-process training on the same samples: mean loss, one optimizer."""
    torch.set_num_threads(1)
    data = load_dataset({"name": "digits"})
    model = build_model({"name": "dnn", "hidden": hidden}, data.shape, 10, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for step in range(n_steps):
        _, idx = step_indices(len(data.y_train), batch, seed, step)
        opt.zero_grad()
        x, y = torch.from_numpy(data.x_train[idx]), torch.from_numpy(data.y_train[idx])
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()


def test_r1_cdc_matches_plain_pytorch(train, tmp_path):
    steps, batch, lr = 8, 30, 0.05
    summary = train(
        "algorithm=cdc",
        "cluster.n_workers=3",
        "coding.redundancy=1",
        f"train.steps={steps}",
        f"train.batch_size={batch}",
        f"train.lr={lr}",
        out_dir=tmp_path,
    )
    expected = _plain_torch(steps, batch, lr, 0.9, 0, [16])
    theta = np.load(tmp_path / "theta.npy")
    assert param_sha256(theta) == summary["param_sha256"]
    np.testing.assert_allclose(theta, expected, rtol=1e-4, atol=1e-6)
    assert not np.array_equal(theta, _plain_torch(0, batch, lr, 0.9, 0, [16]))  # it moved


@pytest.mark.parametrize("algorithm", ["ssgd", "asgd"])
def test_parameter_servers_learn_digits(train, algorithm):
    summary = train(
        f"algorithm={algorithm}", "train.steps=80", "train.batch_size=64", "model.hidden=[32]"
    )
    assert summary["final"]["test_accuracy"] >= 0.85
    assert summary["final"]["train_loss"] < 0.6
    if algorithm == "asgd":
        assert summary["staleness_mean"] > 0  # K=4 gradients in flight: some are stale


def test_ssgd_matches_serial_at_r1_closely(train):
    """Same samples, same optimizer; only the summation grouping differs."""
    serial = train("algorithm=serial", "coding.redundancy=1", "train.steps=10")
    ssgd = train("algorithm=ssgd", "train.steps=10")
    assert abs(serial["final"]["train_loss"] - ssgd["final"]["train_loss"]) < 1e-4


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    "K,r,g,shuffle",
    [
        (4, 1, None, "coded"),
        (4, 2, None, "coded"),
        (4, 3, None, "coded"),
        (4, 2, None, "uncoded"),
        (6, 2, 3, "coded"),
        (4, 2, None, "summed"),
        (6, 2, 3, "summed"),
        (4, 4, None, "coded"),
        (6, 4, None, "hybrid"),
        (4, 3, None, "hybrid"),
        (6, 2, 3, "hybrid"),
        (4, 2, None, "pieces"),
        (6, 2, 3, "pieces"),
        (6, 1, 2, "coded"),
        (8, 2, 2, "summed"),
    ],
)
def test_bytes_match_closed_forms(train, K, r, g, shuffle, transport):
    s = train(*_overrides(K, r, shuffle, g, "dnn"), f"transport={transport}")
    b = s["bytes_per_worker"]
    gg = g or K
    # each packet carries at most one float32 of padding over the mean piece length
    n_packets = math.comb(gg - 1, r)  # sent per worker on average, coded or uncoded
    if shuffle == "pieces":  # r pieces where CDC sends one packet
        n_packets *= r
    if shuffle == "hybrid":  # the chosen family's packets, at the busiest sender
        plan = hybrid_plan(gg, r, s["hybrid_m"])
        n_packets = max(plan.packets(j) for j in range(gg))
    pad = 4 * n_packets + 4 * (K // gg)
    assert abs(b["multicast"] - b["theory_multicast"]) <= pad
    assert abs(b["unicast"] - b["theory_unicast"]) <= r * pad
    assert abs(b["params"] - b["theory_params"]) <= 4
    # what the transport moved is exactly the messages, once per receiver, and the segments
    kinds = b["transport_by_kind"]
    assert set(kinds) <= {*KINDS, "red", "seg"}, "a map output moved"
    shuffled = sum(kinds.get(k, 0) for k in (*KINDS, "red"))
    assert shuffled == pytest.approx(b["unicast"])
    assert kinds.get("seg", 0) == pytest.approx(b["params"])
    assert b["transport"] == pytest.approx(shuffled + kinds.get("seg", 0))
    if transport == "direct":  # nothing went through Dask's own transfers
        assert b["dask_transfer"] == 0 and b["dask_transfer_by_kind"] == {}
    if r == K:  # every worker updates all of θ: nothing is sent at all
        assert b["transport"] == b["params"] == b["theory_params"] == 0


def test_parameter_server_bytes(train):
    s = train("algorithm=ssgd", "cluster.n_workers=3")
    b, d = s["bytes_per_worker"], s["n_params"]
    assert b["unicast"] == b["theory_unicast"] == 4 * d
    assert b["params"] == b["theory_params"] == 4 * d
    # the gradients really went through Dask, straight from each worker to the driver
    assert b["dask_transfer_by_kind"]["grad"] >= 4 * d


@pytest.mark.slow
@pytest.mark.parallel_safe
def test_ddp_follows_ssgd_on_worker_processes(train, tmp_path):
    """DDP (gloo, in the Dask workers) applies the gradient ssgd applies: Σ grad / B over
    the same samples, split the same way; only the reduction order differs."""
    every = ["train.steps=12", "train.eval_every=4"]
    ddp = train("algorithm=ddp", "cluster.processes=true", *every, out_dir=tmp_path / "ddp")
    ssgd = train("algorithm=ssgd", *every, out_dir=tmp_path / "ssgd")
    assert ddp["final"]["train_loss"] == pytest.approx(ssgd["final"]["train_loss"], rel=1e-3)
    np.testing.assert_allclose(
        np.load(tmp_path / "ddp" / "theta.npy"),
        np.load(tmp_path / "ssgd" / "theta.npy"),
        rtol=1e-4,
        atol=1e-6,
    )
    b = ddp["bytes_per_worker"]
    assert b["dask_transfer"] == 0
    assert b["allreduced"] == pytest.approx(4 * ddp["n_params"])  # every gradient, once a step
    assert ddp["final"]["test_accuracy"] is not None
    # the all-reduce is timed: its window lies inside map's forward and backward
    t = ddp["time_s"]
    assert t["shuffle"] is not None and 0 < t["shuffle"] <= t["map"]
    # the accuracy curve too: rank 0's θ after every eval_every steps, evaluated by the driver
    curves = [
        {
            int(r["step"]): float(r["test_loss"])
            for r in read_history(tmp_path / a)
            if r["test_loss"]
        }
        for a in ("ddp", "ssgd")
    ]
    assert list(curves[0]) == list(curves[1]) == [3, 7, 11]
    assert list(curves[0].values()) == pytest.approx(list(curves[1].values()), rel=1e-3)


@pytest.mark.parametrize(
    "extra",
    [
        ["optimizer=adam", "train.lr=0.01"],
        [
            "dataset=synthetic",
            "dataset.shape=[1,12,12]",
            "dataset.n_samples=300",
            "dataset.n_test=50",
        ],
        [
            "model=cnn",
            *CNN,
            "dataset=synthetic",
            "dataset.shape=[3,8,8]",
            "dataset.n_samples=300",
            "dataset.n_test=50",
        ],
    ],
    ids=["adam", "synthetic-dnn", "synthetic-rgb-cnn"],
)
def test_cdc_equals_serial_for_other_optimizers_and_data(train, extra):
    serial = train("algorithm=serial", "cluster.n_workers=4", *extra)
    cdc = train("algorithm=cdc", "cluster.n_workers=4", *extra)
    assert cdc["param_sha256"] == serial["param_sha256"]


def test_cdc_trains_on_cifar10_pickles(train, tmp_path):
    from tests.test_data import make_cifar_folder

    make_cifar_folder(tmp_path / "cifar-10-batches-py")
    common = [
        "dataset=cifar10",
        f"dataset.path={tmp_path}",
        "model=cnn",
        *CNN,
        "train.batch_size=12",
        "train.steps=2",
    ]
    serial = train("algorithm=serial", *common)
    cdc = train("algorithm=cdc", *common)
    assert cdc["param_sha256"] == serial["param_sha256"] and cdc["dataset"] == "cifar10"


def test_task_keys_give_dask_one_prefix_per_kind():
    """Dask keeps a task prefix for good; a key with the run and step in its prefix made one
    per task, and a 400-step run slowed from 116 to 349 ms per step."""
    from dask.utils import key_split

    from dcoded.engine.registry import parse_key, task_key

    keys = [task_key("dc0123abcdef", "pkt", s, (0, 1, 2), 1) for s in (0, 17, 399)]
    assert {key_split(k) for k in keys} == {"dcoded-pkt"}
    assert [parse_key(k) for k in keys] == [("dc0123abcdef", "pkt", s) for s in (0, 17, 399)]
    assert parse_key(task_key("run", "seg", -1, 3)) == ("run", "seg", -1)
    assert parse_key("some-other-key") is None


def test_ddps_rendezvous_port_is_held_from_the_moment_it_is_chosen():
    """The rendezvous port was found free, closed, and bound again by gloo later: a local
    process could take it in between. The store binds a port the kernel picks and keeps it."""
    import socket

    from dcoded.config import build_spec
    from dcoded.engine import ddp

    spec = build_spec(tiny_config("algorithm=ddp", "cluster.processes=true"))[0]
    port = ddp.open_store("held", spec, "127.0.0.1")
    try:
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", port))
        store = ddp._STORES["held"]
        store.set("k", "v")
        peer = torch.distributed.TCPStore("127.0.0.1", port, 2, is_master=False)
        assert peer.get("k") == b"v"
    finally:
        ddp._STORES.pop("held", None)


def test_a_setup_that_comes_after_its_runs_teardown_keeps_nothing():
    """A run that failed while its setup tasks still waited (a step timeout) tore down its
    replicas, then the late tasks made theirs: left in workers that serve other runs."""
    from dcoded.config import build_spec
    from dcoded.engine import registry

    spec, _, _ = build_spec(tiny_config())
    registry.teardown("dc-late-setup")
    registry.setup("dc-late-setup", 0, spec)
    assert not [k for k in registry._STATES if k[0] == "dc-late-setup"]
    registry.setup("dc-live-setup", 0, spec)  # a run not torn down keeps its replica
    assert registry.teardown("dc-live-setup") == 1


def test_a_run_freezes_what_lives_at_its_setup_and_its_end_lets_it_go(monkeypatch):
    """A full collection of a worker's heap stalls every rank that waits for it: a worker's
    first replica collects once and freezes what lives (nothing then walks it during the
    run), and the end of the last run in the process unfreezes it, to be collected again."""
    import gc

    from dcoded.config import build_spec
    from dcoded.engine import registry

    spec, _, _ = build_spec(tiny_config())
    assert not registry.worker_process()  # the test's own process: never frozen as it is
    monkeypatch.setattr(registry, "worker_process", lambda: True)
    others = dict(registry._STATES)  # another test's run in this process: set aside
    registry._STATES.clear()
    gc.unfreeze()
    try:
        registry.setup("dc-frozen", 0, spec)
        assert gc.get_freeze_count() > 0
        made = gc.get_freeze_count()
        registry.setup("dc-frozen", 1, spec)  # not the first replica here: no second pass
        assert gc.get_freeze_count() <= made  # (frozen objects that die leave the count)
        assert registry.teardown("dc-frozen") == 2
        assert gc.get_freeze_count() == 0
    finally:
        registry.teardown("dc-frozen")
        registry._STATES.update(others)


FAULTS = """
import resource, sys
import numpy as np
import dcoded.engine.replica as R
from dcoded.config import build_spec, compose_config
if sys.argv[1] == "as-dask-left-it":
    R.reuse_freed_memory = lambda: False
spec = build_spec(compose_config(["model=cnn", "dataset=synthetic", "dataset.n_samples=256"]))[0]
replica = R.Replica(spec)
for _ in range(3):  # warm up: the heap grows to what one gradient needs
    replica.grad_sum(np.arange(64))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    replica.grad_sum(np.arange(64))
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_a_worker_reuses_the_memory_a_gradient_frees():
    """Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which makes glibc map
    every buffer over 128 KiB afresh: a cnn's gradient then page-faults its activations in on
    every call (twice the time of the same gradient in a plain process). A replica undoes it:
    under the same environment, five gradients fault a small fraction of the pages they did."""
    import subprocess
    import sys

    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    faults = {
        way: int(
            subprocess.run(
                [sys.executable, "-c", FAULTS, way],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()[-1]
        )
        for way in ("as-dask-left-it", "reused")
    }
    assert faults["as-dask-left-it"] > 1000, faults  # 4 KiB pages: megabytes a call
    assert faults["reused"] * 10 < faults["as-dask-left-it"], faults
