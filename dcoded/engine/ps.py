"""The parameter-server baselines: synchronous (``ssgd``) and asynchronous (``asgd``).

The driver is the server: it holds ``θ`` and the optimizer. ``θ`` goes to each worker with
``client.scatter(..., workers=[w], direct=True)`` and gradients come back with
``client.gather(..., direct=True)``, so both directions go straight between the driver and
the worker, never relayed through the scheduler (Dask's default when the client cannot reach
the workers).

``asgd``: each worker loops (take the newest ``θ``, compute the gradient of ``B/K`` samples,
send it) and the server applies every gradient on arrival. A step still consumes ``B``
samples (``K`` updates of ``B/K``); each update applies ``Σ grad / B``, so that with no
staleness and plain SGD ``K`` updates move ``θ`` as far as one ``ssgd`` step. Staleness is the
number of server versions between a worker's read of ``θ`` and the apply.
"""

from __future__ import annotations

import time
from concurrent.futures import CancelledError

import numpy as np
from distributed import wait

from dcoded.coding import array_split_slices, sum_in_order
from dcoded.engine import registry
from dcoded.engine.driver import (
    POLL_S,
    Clock,
    Context,
    StepTimeout,
    WorkerLost,
    after_step,
    pinned,
)
from dcoded.engine.registry import record, state, task_key
from dcoded.engine.straggle import Injector
from dcoded.optim import SegmentOptimizer

# --------------------------------------------------------------------------- on the workers


def ps_grad(run_id: str, rank: int, step: int, part: int, theta: np.ndarray) -> dict:
    """Gradient (summed) of part ``part`` of ``K`` of step ``step``'s samples at ``θ``."""
    t0 = time.time()
    st = state(run_id, rank)
    injector = Injector(st.spec, rank, step, st.throttle is not None)
    with st.lock:  # asgd may hand one worker two updates; a multi-threaded worker runs both
        injector.before()
        st.replica.set_theta(theta)
        _, idx = st.replica.step_samples(step)
        n = st.spec.n_workers
        t1 = time.perf_counter()
        grad, loss = st.replica.grad_sum(idx[array_split_slices(len(idx), n)[part]])
        injector.after(time.perf_counter() - t1)
    if injector.active:
        record(run_id, step=step, rank=rank, phase="straggle", **injector.fields())
    return {"grad": grad, "loss": loss, "start": t0, "stop": time.time(), "rank": rank}


# --------------------------------------------------------------------------- the driver


def _setup(ctx: Context) -> tuple[np.ndarray, SegmentOptimizer]:
    """Build every worker's replica, and the server's ``θ`` and optimizer."""
    spec, client = ctx.spec, ctx.client
    futures = [
        client.submit(
            registry.setup,
            spec.run_id,
            k,
            spec,
            key=task_key(spec.run_id, "setup", -1, k),
            **pinned(w),
        )
        for k, w in enumerate(ctx.workers)
    ]
    ctx.wait_all(futures, "worker setup", setup=True)
    ctx.collect("setup")
    theta = ctx.resume.theta.copy() if ctx.resume else ctx.reference.theta
    optimizer = SegmentOptimizer(theta, spec.optimizer)
    if ctx.resume:
        optimizer.load_state_arrays(ctx.resume.optimizer)
    return theta, optimizer


def _after_server_step(ctx: Context, step: int, clock: Clock, theta, optimizer) -> None:
    """Evaluation and checkpoints of the server's ``θ`` and optimizer."""
    after_step(ctx, step, clock, lambda: theta, lambda: (theta, optimizer.state_arrays()))


def _send_theta(client, theta: np.ndarray, address: str):
    return client.scatter(theta, workers=[address], direct=True, hash=False)


def train_ssgd(ctx: Context) -> np.ndarray:
    """Synchronous parameter server: scatter ``θ``, ``K`` gradients of ``B/K`` samples, sum
    in worker order, one optimizer step on the driver."""
    spec, client, workers = ctx.spec, ctx.client, ctx.workers
    theta, optimizer = _setup(ctx)
    per_epoch = ctx.steps_per_epoch
    K, run = spec.n_workers, spec.run_id
    clock = Clock()
    for step in range(ctx.start_step, spec.steps):
        t0 = clock.now()
        sent = [ctx.bounded(f"step {step}", _send_theta, client, theta, w) for w in workers]
        t1 = clock.now()
        futures = [
            client.submit(
                ps_grad,
                run,
                k,
                step,
                k,
                sent[k],
                key=task_key(run, "grad", step, k),
                **pinned(workers[k]),
            )
            for k in range(K)
        ]
        ctx.wait_all(futures, f"step {step}")
        t2 = clock.now()
        results = ctx.bounded(f"step {step}", client.gather, futures, direct=True)
        t3 = clock.now()
        grad = sum_in_order([res["grad"] for res in results])
        theta = optimizer.step(grad, spec.batch_size)
        t4 = clock.now()
        nbytes = results[0]["grad"].nbytes
        ctx.log.driver_step(
            step,
            epoch=step // per_epoch,
            wall_s=t4,
            step_s=t4 - t0,
            train_loss=sum(res["loss"] for res in results) / spec.batch_size,
            map_s=max(res["stop"] - res["start"] for res in results),
            encode_s=0.0,
            shuffle_s=t3 - t2,
            decode_s=0.0,
            update_s=t4 - t3,
            params_s=t1 - t0,
            bytes_multicast=nbytes,
            bytes_unicast=nbytes,
            bytes_params=theta.nbytes,
        )
        # held until the next step's θ is scattered: a task group that empties is made anew
        # with a span of its own, which the scheduler keeps for good (one every step)
        held = sent  # noqa: F841
        _after_server_step(ctx, step, clock, theta, optimizer)
    return theta


class _Server:
    """asgd's server: ``θ`` and the optimizer, the ``version`` (updates applied), and the
    updates handed out and not yet applied (``pending``)."""

    def __init__(self, ctx: Context):
        spec = ctx.spec
        self.ctx, self.K = ctx, spec.n_workers
        self.workers = list(ctx.workers)  # a rank is its worker's place in the first list
        self.theta, self.optimizer = _setup(ctx)
        self.total = self.K * spec.steps
        self.next_update, self.version = self.K * ctx.start_step, 0
        #: future -> (update index, version read, worker, seconds to send θ)
        self.pending: dict = {}
        self.launches = 0  # a relaunched update needs a key of its own
        self.last_progress = 0.0  # when the last gradient arrived (or the first were launched)

    def start(self) -> None:
        """Hand each worker its first update."""
        for address in self.workers[: min(self.K, self.total - self.next_update)]:
            self.launch(address)
        self.last_progress = time.monotonic()

    def launch(self, address: str, update: int | None = None) -> None:
        """Send ``θ`` to ``address`` and submit its gradient of ``update`` (the next one if
        ``None``); a worker that died just now hands it on to another."""
        ctx, run = self.ctx, self.ctx.spec.run_id
        if update is None:
            update, self.next_update = self.next_update, self.next_update + 1
        step, part = divmod(update, self.K)
        t = time.perf_counter()
        while True:
            try:
                sent = ctx.bounded(
                    "asgd", _send_theta, ctx.client, self.theta, address, check=ctx.check_connection
                )
                break
            except WorkerLost:  # the worker died just now: the update goes to another one
                _drop_workers(ctx, {address, *ctx.lost_workers()})
                address = ctx.workers[update % len(ctx.workers)]
        future = ctx.client.submit(
            ps_grad,
            run,
            self.workers.index(address),
            step,
            part,
            sent,
            key=f"{task_key(run, 'grad', step, part)}/{self.launches}",
            **pinned(address),
        )
        self.pending[future] = (update, self.version, address, time.perf_counter() - t)
        self.launches += 1

    def wait(self) -> set:
        """The pending updates done within :data:`POLL_S`; none when a worker was lost
        meanwhile (its updates handed to live ones)."""
        try:
            done, _ = wait(list(self.pending), timeout=POLL_S, return_when="FIRST_COMPLETED")
        except TimeoutError:
            _reassign_lost(self.ctx, self.pending, self.launch)
            return set()
        except CancelledError:  # a worker died with the inputs of a pending update
            if not _reassign_lost(self.ctx, self.pending, self.launch):
                raise
            return set()
        return done

    def apply(self, future, acc: _StepAccumulator) -> dict | None:
        """Apply ``future``'s gradient, count it in ``acc`` and hand its worker the next
        update: the worker's result, or ``None`` if it died with it (the update goes to a
        live worker)."""
        ctx = self.ctx
        if future not in self.pending:  # a lost worker's, handed on with another in this batch
            return None
        update, read_version, address, send_s = self.pending.pop(future)
        t0 = time.monotonic()
        try:
            if future.status != "finished":
                future.result()  # raises the worker's error
            res = ctx.bounded(
                "asgd", ctx.client.gather, future, direct=True, check=ctx.check_connection
            )
        except Exception:
            if address not in ctx.lost_workers():
                raise
            # the worker died with its gradient: the update goes to a live worker
            self.pending[future] = (update, read_version, address, send_s)
            _reassign_lost(ctx, self.pending, self.launch)
            return None
        self.last_progress = t1 = time.monotonic()
        self.theta = self.optimizer.step(res["grad"], ctx.spec.batch_size)
        acc.add(
            res,
            staleness=self.version - read_version,
            send_s=send_s,
            gather_s=t1 - t0,
            update_s=time.monotonic() - t1,
        )
        self.version += 1
        if self.next_update < self.total:
            self.launch(address)
        return res


def train_asgd(ctx: Context) -> np.ndarray:
    """Asynchronous parameter server; ``K * steps`` updates of ``B/K`` samples each. A lost
    worker's update is handed to a live one and the run goes on with the workers left."""
    spec = ctx.spec
    server = _Server(ctx)
    per_epoch, K = ctx.steps_per_epoch, spec.n_workers
    clock = Clock()
    step, step_t0, acc = ctx.start_step, 0.0, _StepAccumulator()
    server.start()
    while server.pending:
        if time.monotonic() - server.last_progress > spec.step_timeout_s:
            raise StepTimeout(
                f"no asgd gradient arrived within train.step_timeout_s={spec.step_timeout_s:g}s"
            )
        for future in server.wait():
            res = server.apply(future, acc)
            if res is None or server.version % K:  # K updates = one step's B samples
                continue
            now = clock.now()
            ctx.log.driver_step(
                step,
                epoch=step // per_epoch,
                wall_s=now,
                step_s=now - step_t0,
                **acc.row(spec.batch_size, res["grad"].nbytes),
            )
            _after_server_step(ctx, step, clock, server.theta, server.optimizer)
            step, step_t0, acc = step + 1, clock.now(), _StepAccumulator()
    return server.theta


def _reassign_lost(ctx: Context, pending: dict, launch) -> bool:
    """Give the updates pinned to lost workers to live ones (asgd goes on without them);
    say whether any worker was lost."""
    ctx.check_connection("asgd")
    lost = set(ctx.lost_workers())
    if not lost:
        return False
    _drop_workers(ctx, lost)
    for future, (update, _, address, _) in list(pending.items()):
        if address in lost:
            del pending[future]
            launch(ctx.workers[update % len(ctx.workers)], update)
    return True


def _drop_workers(ctx: Context, lost: set[str]) -> None:
    """Go on without ``lost`` (noted in the summary's events)."""
    gone = sorted(w for w in lost if w in ctx.workers)
    alive = [w for w in ctx.workers if w not in lost]
    if not alive:
        raise WorkerLost("asgd: every worker was lost")
    if gone:
        ctx.log.note(f"asgd lost worker(s) {gone}; going on with {len(alive)}")
    ctx.workers[:] = alive


class _StepAccumulator:
    """The ``K`` updates of one asgd step."""

    def __init__(self):
        self.items: list[dict] = []

    def add(self, res: dict, **fields) -> None:
        self.items.append({"loss": res["loss"], "map": res["stop"] - res["start"], **fields})

    def row(self, batch_size: int, nbytes: int) -> dict:
        n = len(self.items)
        stale = [i["staleness"] for i in self.items]
        return {
            "train_loss": sum(i["loss"] for i in self.items) / batch_size,
            "map_s": max(i["map"] for i in self.items),
            "encode_s": 0.0,
            "decode_s": 0.0,
            "shuffle_s": sum(i["gather_s"] for i in self.items),
            "update_s": sum(i["update_s"] for i in self.items),
            "params_s": sum(i["send_s"] for i in self.items),
            "bytes_multicast": nbytes,
            "bytes_unicast": nbytes,
            "bytes_params": nbytes,
            "staleness_mean": sum(stale) / n,
            "staleness_max": max(stale),
        }
