"""PyTorch DistributedDataParallel (gloo) inside the same Dask workers: the system a user
would pick instead, measured on the same cluster, with the data order, batch split and
optimizer of ``ssgd``.

Each worker holds one rank: its process group (the rendezvous is a store on worker 0, on a
port the kernel picks), the model wrapped in ``DistributedDataParallel`` and its optimizer, kept
in the worker's registry from setup to teardown. One task per worker runs the training loop
from one checkpoint to the next (all of it without ``train.checkpoint_every``); between two,
the driver takes rank 0's ``θ`` and optimizer state and writes the checkpoint, in the layout
every algorithm shares, so a ddp run resumes (``train.resume``) and goes on after a lost
worker (``train.on_worker_loss=continue``) as the others do: on a new process group, from the
last checkpoint.

Each rank's loss is the sum over its ``B/K`` samples times ``K/B``, so DDP's average over
ranks is ``Σ grad / B``, the gradient ``ssgd`` applies. DDP reduces gradients in buckets
outside Dask, so Dask moves none of them (its byte count is zero); the buckets' sizes are
recorded, and on ``cluster=netem`` the wire counters are the truth.
"""

from __future__ import annotations

import datetime
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

from dcoded import health
from dcoded.coding import array_split_slices
from dcoded.engine import registry
from dcoded.engine.driver import (
    POLL_S,
    Context,
    StepTimeout,
    check_finite,
    checkpoint_due,
    pinned,
    save_checkpoint,
)
from dcoded.engine.registry import task_key
from dcoded.engine.replica import Replica
from dcoded.engine.spec import RunSpec
from dcoded.engine.straggle import Injector
from dcoded.errors import DcodedError, WorkerLost
from dcoded.optim import load_state_arrays, state_arrays

#: The rendezvous stores this worker process holds open, by run (rank 0's, until it trains).
_STORES: dict[str, dist.TCPStore] = {}


def open_store(run_id: str, spec: RunSpec, host: str) -> int:
    """Open the run's rendezvous (gloo's ``TCPStore``) on worker 0 and return its port: the
    store binds a port the kernel picks and keeps it, so no other process can take it between
    choosing and binding (a port found free, closed and bound again later could be)."""
    _STORES.clear()  # a store an earlier attempt opened and never trained on
    store = dist.TCPStore(
        host,
        0,
        spec.n_workers,
        is_master=True,
        timeout=datetime.timedelta(seconds=spec.setup_timeout_s),  # the ranks' rendezvous
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


class _Closable:
    """What a teardown closes: ``closing`` is set, and the rank's task returns at once."""

    def __init__(self):
        self.closing = threading.Event()

    def close(self) -> None:
        self.closing.set()


#: What :func:`_unless_closed` returns for a call the teardown did not wait for.
CLOSED = "closed"


def _unless_closed(closing: threading.Event, name: str, call, *args):
    """``call(*args)`` in a thread of its own: its value (its error raised here), or
    :data:`CLOSED` as soon as ``closing`` is set. A rank waiting for a frozen or dead peer
    (in the rendezvous, or in an all-reduce) cannot be woken: gloo has no abort, and its
    connections stay open until the process ends. Its thread is left to gloo's timeout
    (``train.step_timeout_s``) while the task returns, so the worker is free for the next
    attempt's group."""
    value = health.in_thread(name, call, *args, watch=closing.is_set, poll_s=0.1)
    return CLOSED if value is health.GAVE_UP else value


class Group(_Closable):
    """One rank's DDP: a gloo process group of this run's own (not torch's default one, of
    which a process has one: a rank of a run that lost a worker may still wait in it when
    the next attempt builds its own), the model wrapped in ``DistributedDataParallel`` over
    it with a comm hook that counts and times its buckets, and the optimizer."""

    def __init__(self, replica: Replica, spec: RunSpec, optimizer_state, store, rank, iface):
        super().__init__()
        self.store = store  # rank 0's rendezvous store, kept while the group lives
        options = dist.ProcessGroupGloo._Options()
        # built (gloo's connections, DDP's broadcast of θ) within the setup's bound, and
        # then each all-reduce within a step's
        options._timeout = datetime.timedelta(seconds=spec.setup_timeout_s)
        gloo = dist.ProcessGroupGloo
        options._devices = [
            gloo.create_device(interface=iface) if iface else gloo.create_default_device()
        ]
        self.size = spec.n_workers
        # what torch.distributed.new_group builds, without the default group it needs
        self.pg = dist.ProcessGroup(store, rank, self.size)
        self.pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        backend = dist.ProcessGroupGloo(store, rank, self.size, options)
        self.pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
        # bucket_cap_mb=None is torch's default: 25 MiB buckets, the first one (the last
        # gradients of the backward pass) 1 MiB; set, it caps the first bucket too
        self.model = DistributedDataParallel(
            replica.model, process_group=self.pg, bucket_cap_mb=spec.bucket_cap_mb
        )
        # bytes all-reduced this step, and the all-reduce's window: first bucket launched,
        # last done
        self.reduced = [0, None, 0.0]
        self._lock = threading.Lock()  # gloo runs the futures' callbacks on threads of its own
        self.model.register_comm_hook(None, self._all_reduce)
        self.optimizer = instantiate(dict(spec.optimizer))(replica.model.parameters())
        load_state_arrays(self.optimizer, optimizer_state or {})
        self._rehearse(replica)
        if hasattr(backend, "_set_default_timeout"):  # an older torch: the driver's bound
            backend._set_default_timeout(datetime.timedelta(seconds=spec.step_timeout_s))

    def _rehearse(self, replica: Replica) -> None:
        """One backward that reduces nothing, before the first step: DDP lays its buckets
        out anew after its first iteration, by the order the gradients came in, and where
        an element sits in a bucket decides the order of its all-reduce's additions. So the
        first step of a run resumed at step ``t`` would not add as step ``t`` of the
        uninterrupted run did; rehearsed, every step of both runs uses the second layout."""
        self._rehearsing = True
        try:
            x = torch.from_numpy(replica.data.x_train[:1])
            self.model(x).sum().backward()
        finally:
            self._rehearsing = False
            replica.model.zero_grad(set_to_none=True)
            self.reduced[:] = [0, None, 0.0]

    def _all_reduce(self, state, bucket):  # the default all-reduce, counted and timed
        if self._rehearsing:
            kept = torch.futures.Future()
            kept.set_result(bucket.buffer())
            return kept
        reduced = self.reduced
        with self._lock:
            reduced[0] += bucket.buffer().numel() * bucket.buffer().element_size()
            if reduced[1] is None:
                reduced[1] = time.time()
        buf = bucket.buffer().div_(self.size)

        def done(fut):
            with self._lock:
                reduced[2] = max(reduced[2], time.time())
            return fut.value()[0]

        return self.pg.allreduce([buf]).get_future().then(done)


def ddp_setup(
    run_id: str,
    rank: int,
    spec: RunSpec,
    master: str,
    port: int,
    theta: np.ndarray | None,
    optimizer_state: dict | None,
) -> int:
    """Build this rank: its replica (from a checkpoint's ``θ`` and full-length optimizer
    state, or seeded), the process group and the DDP model; every rank runs it at once."""
    ip = urlparse(get_worker().address).hostname
    registry.setup(run_id, rank, spec, theta)
    st = registry.state(run_id, rank)
    st.group = building = _Closable()  # a peer lost meanwhile: the teardown ends the wait

    def build() -> Group:
        timeout = datetime.timedelta(seconds=spec.setup_timeout_s)
        store = _STORES.pop(run_id, None) if rank == 0 else None
        if store is None:
            store = dist.TCPStore(master, port, spec.n_workers, is_master=False, timeout=timeout)
        return Group(st.replica, spec, optimizer_state, store, rank, _interface_of(ip))

    group = _unless_closed(building.closing, f"dcoded ddp setup {rank}", build)
    if group is CLOSED:
        return -1
    group.closing = building.closing  # a teardown from now on closes the group
    st.group = group
    return rank


def ddp_steps(run_id: str, rank: int, first: int, stop: int) -> dict:
    """Steps ``first`` to ``stop - 1`` of this rank, in a thread of their own; rank 0
    returns ``θ``, its optimizer state (full length) and the ``θ`` of every
    ``eval_every``-th step; a rank whose gloo lost a peer returns ``peer_lost`` (the driver
    says which worker it was), and one whose run was torn down meanwhile ``closed``, at once,
    even if its thread still waits for a peer. The records are left for
    :func:`dcoded.engine.registry.drain_records`."""
    st = registry.state(run_id, rank)
    group = st.group
    try:
        snapshots = _unless_closed(
            group.closing, f"dcoded ddp rank {rank}", _steps, run_id, rank, st, group, first, stop
        )
    except RuntimeError as e:
        if not _a_peer_went_away(e):
            raise
        group.close()
        return {"peer_lost": str(e).splitlines()[0]}
    if snapshots is None or snapshots is CLOSED:
        return {"closed": True}
    if rank != 0:
        return {}
    return {
        "theta": st.replica.theta,
        "optimizer": state_arrays(group.optimizer),
        "snapshots": snapshots,
    }


def _steps(run_id, rank, st, group: Group, first: int, stop: int) -> dict | None:
    """DDP's training loop; ``None`` if the run was torn down meanwhile."""
    spec, replica, model, optimizer, reduced = (
        st.spec,
        st.replica,
        group.model,
        group.optimizer,
        group.reduced,
    )
    K, B = spec.n_workers, spec.batch_size
    part = array_split_slices(B, K)[rank]
    snapshots = {}  # rank 0: θ after every eval_every steps, evaluated by the driver
    for step in range(first, stop):
        if group.closing.is_set():
            return None
        t0 = time.time()
        injector = Injector(spec, rank, step, st.throttle is not None)
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
    return snapshots


#: What gloo says when the other end of a rank's connection went away (a dead process).
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _a_peer_went_away(error: BaseException) -> bool:
    """Whether a rank's error is gloo losing a peer (a killed worker), not a bug."""
    return any(s in str(error) for s in PEER_GONE)


def _lost_a_peer(ctx: Context, message: str, within_s: float = 10.0):
    """Raise :class:`WorkerLost` for a rank whose gloo lost its peer: the cluster's own
    account (the worker and its rank) once the scheduler has seen the worker go, waiting up
    to ``within_s`` for it to notice, else gloo's ``message``."""
    health.until(lambda: ctx.check_cluster("ddp"), within_s)  # raises once it sees the loss
    raise WorkerLost(f"ddp: a rank lost its peer ({message})")


#: A rank's task runs at most this many steps: between two, the driver evaluates the
#: snapshots and writes the steps' rows, so what it holds of them stays bounded in a long run.
LOOP_STEPS = 500


def _stops(ctx: Context) -> list[int]:
    """Where each task's steps end: at every checkpoint, every :data:`LOOP_STEPS` steps,
    and at the last step."""
    spec, start = ctx.spec, ctx.start_step
    every = spec.checkpoint_every if ctx.run_dir is not None else 0
    ends = set(range(start - start % LOOP_STEPS + LOOP_STEPS, spec.steps, LOOP_STEPS))
    if every:
        ends.update(range(start - start % every + every, spec.steps, every))
    return [*sorted(ends), spec.steps] if start < spec.steps else []


class _Follower:
    """The driver's view of the ranks' tasks: their records taken in, the progress bar moved
    as steps finish (``shown`` of them so far), and a run with no step done for
    ``train.step_timeout_s`` (its groups not built within ``train.setup_timeout_s``) stopped."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.shown, self.last_progress = 0, time.monotonic()

    def follow(self, futures, what: str, setup: bool = False) -> list[dict]:
        """Wait for ``futures``, taking in the records and moving the progress bar as the
        ranks go; each result as soon as its task is done. ``setup``: the ranks' setup,
        bounded by ``train.setup_timeout_s``."""
        ctx = self.ctx
        pending, results, collected = set(futures), {}, 0.0
        self.last_progress = time.monotonic()  # the tasks start now, not when the last did
        while pending:
            try:
                pending = ctx.wait_some(pending, POLL_S, what)
            except RuntimeError as e:  # gloo, building the group with a dead peer
                if isinstance(e, DcodedError) or not _a_peer_went_away(e):
                    raise
                _lost_a_peer(ctx, str(e).splitlines()[0])
            self._gather_done(futures, pending, results, what)
            if pending and time.monotonic() - collected < POLL_S:
                continue  # the other ranks end their steps a moment later
            ctx.collect(what)
            collected = time.monotonic()
            check_finite(ctx.log.first_nonfinite_loss())
            self._progress(pending, what, setup)
        return [results[f.key] for f in futures]

    def _gather_done(self, futures, pending: set, results: dict, what: str) -> None:
        """Put the result of each task done since into ``results`` (by key); a rank that lost
        its peer is the worker lost."""
        ctx = self.ctx
        done = [f for f in futures if f not in pending and f.key not in results]
        if done:
            for f, result in zip(
                done, ctx.bounded(what, ctx.client.gather, done, direct=True), strict=True
            ):
                results[f.key] = result
                if isinstance(result, dict) and "peer_lost" in result:
                    _lost_a_peer(ctx, result["peer_lost"])

    def _progress(self, pending: set, what: str, setup: bool = False) -> None:
        """Move the progress bar by the steps every rank has finished since; raise
        :class:`StepTimeout` if none has for ``train.step_timeout_s`` while tasks still run
        (``setup``: if the tasks have not ended within ``train.setup_timeout_s``)."""
        ctx = self.ctx
        timeout = ctx.spec.setup_timeout_s if setup else ctx.spec.step_timeout_s
        done_steps = ctx.log.steps_with_records(ctx.spec.n_workers)
        if done_steps > self.shown:
            self.last_progress = time.monotonic()
            if ctx.progress is not None:
                ctx.progress.update(done_steps - self.shown)
            self.shown = done_steps
        elif pending and time.monotonic() - self.last_progress > timeout:
            if setup:
                raise StepTimeout(
                    f"{what} did not finish within train.setup_timeout_s={timeout:g}s"
                )
            raise StepTimeout(f"no ddp step finished within {timeout:g}s")


def _build_groups(ctx: Context, follower: _Follower) -> None:
    """Open the rendezvous on worker 0 and build every rank's group from it (from the
    checkpoint resumed, if any)."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    run, start = spec.run_id, ctx.start_step
    master = urlparse(workers[0]).hostname
    opened = client.submit(
        open_store,
        run,
        spec,
        master,
        key=task_key(run, "ddp", start - 1, "store"),
        **pinned(workers[0]),
    )
    port = ctx.gather(opened, "rendezvous port", setup=True)
    theta0 = ctx.resume.theta if ctx.resume else None
    opt0 = ctx.resume.optimizer if ctx.resume else None
    setups = [
        client.submit(
            ddp_setup,
            run,
            k,
            spec,
            master,
            port,
            theta0,
            opt0,
            key=task_key(run, "ddp", start - 1, "setup", k),
            **pinned(w),
        )
        for k, w in enumerate(workers)
    ]
    follower.follow(setups, "ddp: building the process group", setup=True)


def train_ddp(ctx: Context) -> np.ndarray:
    """Set up one DDP rank per worker, run their loops from checkpoint to checkpoint and
    follow them through their records."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    run = spec.run_id
    follower = _Follower(ctx)
    _build_groups(ctx, follower)
    theta = ctx.resume.theta if ctx.resume else ctx.reference.theta
    first = ctx.start_step
    for stop in _stops(ctx):
        ctx.log.loop_begins(first, ctx.steps_per_epoch)
        futures = [
            client.submit(
                ddp_steps, run, k, first, stop, key=task_key(run, "ddp", first, k), **pinned(w)
            )
            for k, w in enumerate(workers)
        ]
        result = follower.follow(futures, "ddp")[0]
        if "closed" in result:
            raise WorkerLost("ddp: the run was torn down while it trained")
        theta = result["theta"]
        for step, snapshot in sorted(result["snapshots"].items()):  # the test accuracy curve
            ctx.log.evaluation(step, *ctx.reference.evaluate(snapshot))
        if checkpoint_due(ctx, stop):
            save_checkpoint(ctx, stop, theta, result["optimizer"])
        elif stop < spec.steps:  # the last step's row waits for the final evaluation
            ctx.log.write_rows(stop - 1)
        first = stop
    acc, loss = ctx.reference.evaluate(theta)
    ctx.log.evaluation(spec.steps - 1, acc, loss)
    return theta
