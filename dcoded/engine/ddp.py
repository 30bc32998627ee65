"""PyTorch DistributedDataParallel (gloo) inside the same Dask workers: the system a user
would pick instead, measured on the same cluster, with the data order, batch split and
optimizer of ``ssgd``.

One long-lived task per worker runs the whole training loop; the rendezvous is worker 0's
address and a port chosen free at run time; the process group is destroyed at the end, also on
failure. Each rank's loss is the sum over its ``B/K`` samples times ``K/B``, so DDP's average
over ranks is ``Σ grad / B``, the gradient ``ssgd`` applies. DDP reduces gradients in buckets
outside Dask, so Dask moves none of them (its byte count is zero); the buckets' sizes are
recorded, and on ``cluster=netem`` the wire counters are the truth.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import threading
import time
from urllib.parse import urlparse

import numpy as np
import psutil
import torch
import torch.distributed as dist
from distributed import get_worker
from hydra.utils import instantiate
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from dcoded.coding import array_split_slices
from dcoded.engine import registry
from dcoded.engine.driver import (
    POLL_S,
    Context,
    StepTimeout,
    check_finite,
    pinned,
)
from dcoded.engine.registry import task_key
from dcoded.engine.replica import Replica
from dcoded.engine.spec import RunSpec
from dcoded.engine.straggle import Injector
from dcoded.errors import DcodedError, WorkerLost

#: The rendezvous stores this worker process holds open, by run (rank 0's, until it trains).
_STORES: dict[str, dist.TCPStore] = {}


def open_store(run_id: str, spec: RunSpec, host: str) -> int:
    """Open the run's rendezvous (gloo's ``TCPStore``) on worker 0 and return its port: the
    store binds a port the kernel picks and keeps it, so no other process can take it between
    choosing and binding (a port found free, closed and bound again later could be)."""
    store = dist.TCPStore(
        host,
        0,
        spec.n_workers,
        is_master=True,
        timeout=datetime.timedelta(seconds=spec.step_timeout_s),
        wait_for_workers=False,
    )
    _STORES[run_id] = store
    return store.port


def _interface_of(ip: str) -> str | None:
    """The network interface that carries ``ip``; gloo must use it (in a namespace, the
    hostname may resolve to loopback, which peers cannot reach)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return None


def ddp_train(
    run_id: str, rank: int, spec: RunSpec, master: str, port: int, theta0: np.ndarray | None
) -> dict:
    """The whole training loop of one rank; returns ``θ`` (rank 0) and the per-step records
    are left for :func:`dcoded.engine.registry.drain_records`."""
    ip = urlparse(get_worker().address).hostname
    iface = _interface_of(ip)
    if iface:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    replica = Replica(spec)
    if theta0 is not None:
        replica.set_theta(theta0)
    timeout = datetime.timedelta(seconds=spec.step_timeout_s)
    store = _STORES.pop(run_id, None) if rank == 0 else None
    if store is None:
        store = dist.TCPStore(master, port, spec.n_workers, is_master=False, timeout=timeout)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=spec.n_workers, timeout=timeout
    )
    try:
        return _loop(run_id, rank, spec, replica)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        del store


def _loop(run_id: str, rank: int, spec: RunSpec, replica: Replica) -> dict:
    model = DistributedDataParallel(replica.model)
    # bytes all-reduced this step, and the all-reduce's window: first bucket launched, last done
    reduced = [0, None, 0.0]
    lock = threading.Lock()  # gloo runs the futures' callbacks on threads of its own

    def count_buckets(state, bucket):  # the default all-reduce, counted and timed
        with lock:
            reduced[0] += bucket.buffer().numel() * bucket.buffer().element_size()
            if reduced[1] is None:
                reduced[1] = time.time()
        buf = bucket.buffer().div_(dist.get_world_size())

        def done(fut):
            with lock:
                reduced[2] = max(reduced[2], time.time())
            return fut.value()[0]

        return dist.all_reduce(buf, async_op=True).get_future().then(done)

    model.register_comm_hook(None, count_buckets)
    optimizer = instantiate(dict(spec.optimizer))(replica.model.parameters())
    throttle = registry.throttle(run_id, rank, spec)
    try:
        return _steps(run_id, rank, spec, replica, model, optimizer, reduced, throttle is not None)
    finally:
        if throttle is not None:
            throttle.release()


def _steps(run_id, rank, spec, replica, model, optimizer, reduced, throttled) -> dict:
    """DDP's training loop (``throttled``: ``straggle=slow`` made with a cgroup)."""
    K, B = spec.n_workers, spec.batch_size
    part = array_split_slices(B, K)[rank]
    snapshots = {}  # rank 0: θ after every eval_every steps, evaluated by the driver at the end
    for step in range(spec.steps):
        t0 = time.time()
        injector = Injector(spec, rank, step, throttled)
        injector.before()
        _, idx = replica.step_samples(step)
        x = torch.from_numpy(replica.data.x_train[idx[part]])
        y = torch.from_numpy(replica.data.y_train[idx[part]])
        optimizer.zero_grad(set_to_none=True)
        t_compute = time.perf_counter()
        # a drawn delay holds back this rank's backward, and so every bucket's all-reduce
        loss_sum = F.cross_entropy(model(x), y, reduction="sum")
        (loss_sum * (K / B)).backward()  # DDP averages over ranks: Σ grad / B
        injector.after(time.perf_counter() - t_compute)
        if injector.active:
            registry.record(run_id, step=step, rank=rank, phase="straggle", **injector.fields())
        t1 = time.time()
        optimizer.step()
        t2 = time.time()
        registry.record(
            run_id,
            step=step,
            rank=rank,
            phase="map",
            start=t0,
            stop=t1,
            loss=float(loss_sum.detach()),
            allreduced=reduced[0],
        )
        registry.record(run_id, step=step, rank=rank, phase="update", start=t1, stop=t2)
        if reduced[1] is not None:  # the exchange, inside the backward of map (it overlaps it)
            registry.record(
                run_id, step=step, rank=rank, phase="shuffle", start=reduced[1], stop=reduced[2]
            )
        reduced[:] = [0, None, 0.0]
        if rank == 0 and spec.eval_every and (step + 1) % spec.eval_every == 0:
            snapshots[step] = replica.theta  # a copy of d floats: tens of microseconds
    theta = replica.theta if rank == 0 else None
    return {"theta": theta, "snapshots": snapshots}


#: What gloo says when the other end of a rank's connection went away (a dead process).
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _a_peer_went_away(error: BaseException) -> bool:
    """Whether a rank's error is gloo losing a peer (a killed worker), not a bug."""
    return any(s in str(error) for s in PEER_GONE)


def _name_the_lost_worker(ctx: Context, what: str, within_s: float = 10.0) -> None:
    """Raise the cluster's own account (the worker and its rank) once the scheduler has seen
    the worker go, waiting up to ``within_s`` for it to notice."""
    deadline = time.monotonic() + within_s
    while True:
        ctx.check_cluster(what)
        if time.monotonic() > deadline:
            return
        time.sleep(0.5)


def train_ddp(ctx: Context) -> np.ndarray:
    """Start one DDP rank per worker and follow them through their records."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    if ctx.resume is not None:
        raise NotImplementedError("train.resume is not supported for algorithm=ddp yet")
    master = urlparse(workers[0]).hostname
    opened = client.submit(open_store, spec.run_id, spec, master, **pinned(workers[0]))
    port = ctx.gather(opened, "rendezvous port")
    futures = [
        client.submit(
            ddp_train,
            spec.run_id,
            k,
            spec,
            master,
            port,
            None,
            key=task_key(spec.run_id, "ddp", -1, k),
            **pinned(w),
        )
        for k, w in enumerate(workers)
    ]
    per_epoch = ctx.steps_per_epoch
    shown, last_progress = 0, time.monotonic()
    while True:
        try:
            ctx.wait_some(futures, POLL_S, "ddp")
        except RuntimeError as e:
            if isinstance(e, DcodedError) or not _a_peer_went_away(e):
                raise
            # a rank's gloo connection to a dead peer broke: say which worker it was
            _name_the_lost_worker(ctx, "ddp")
            raise WorkerLost(f"ddp: a rank lost its peer ({str(e).splitlines()[0]})") from None
        ctx.collect("ddp")
        check_finite(ctx.log.first_nonfinite_loss())
        done_steps = ctx.log.steps_with_records(spec.n_workers)
        if done_steps > shown:
            last_progress = time.monotonic()
            if ctx.progress is not None:
                ctx.progress.update(done_steps - shown)
            shown = done_steps
        if all(f.done() for f in futures):
            break
        if time.monotonic() - last_progress > spec.step_timeout_s:
            raise StepTimeout(f"no ddp step finished within {spec.step_timeout_s:g}s")
    result = ctx.gather(futures[0], "gathering θ")
    theta = result["theta"]
    ctx.collect("ddp")
    ctx.log.ddp_rows(per_epoch)
    for step, snapshot in sorted(result["snapshots"].items()):  # the test accuracy curve
        ctx.log.evaluation(step, *ctx.reference.evaluate(snapshot))
    acc, loss = ctx.reference.evaluate(theta)
    ctx.log.evaluation(spec.steps - 1, acc, loss)
    return theta
