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

import numpy as np
from distributed import wait

from dcoded.coding import sum_in_order
from dcoded.engine import tasks
from dcoded.engine.driving import Clock, StepTimeout, after_step, pinned, steps_per_epoch, wait_all
from dcoded.engine.record import TrainingLog
from dcoded.engine.replica import Replica
from dcoded.engine.spec import RunSpec
from dcoded.engine.tasks import task_key
from dcoded.optim import SegmentOptimizer


def _setup(client, spec: RunSpec, workers: list[str], log: TrainingLog) -> None:
    futures = [
        client.submit(
            tasks.setup,
            spec.run_id,
            k,
            spec,
            key=task_key(spec.run_id, "setup", -1, k),
            **pinned(workers[k]),
        )
        for k in range(spec.n_workers)
    ]
    wait_all(futures, spec, "worker setup")
    log.pull(client)


def _send_theta(client, theta: np.ndarray, address: str):
    return client.scatter(theta, workers=[address], direct=True, hash=False)


def train_ssgd(
    spec: RunSpec,
    client,
    workers: list[str],
    log: TrainingLog,
    reference: Replica,
    progress=None,
    theta0: np.ndarray | None = None,
) -> np.ndarray:
    """Synchronous parameter server: scatter ``θ``, ``K`` gradients of ``B/K`` samples, sum
    in worker order, one optimizer step on the driver."""
    _setup(client, spec, workers, log)
    theta = reference.theta if theta0 is None else theta0.copy()
    optimizer = SegmentOptimizer(theta, spec.optimizer)
    per_epoch = steps_per_epoch(len(reference.data.y_train), spec.batch_size)
    K, run = spec.n_workers, spec.run_id
    clock = Clock()
    for step in range(spec.steps):
        t0 = clock.now()
        sent = [_send_theta(client, theta, w) for w in workers]
        t1 = clock.now()
        futures = [
            client.submit(
                tasks.ps_grad,
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
        wait_all(futures, spec, f"step {step}")
        t2 = clock.now()
        results = client.gather(futures, direct=True)
        t3 = clock.now()
        grad = sum_in_order([res["grad"] for res in results])
        theta = optimizer.step(grad, spec.batch_size)
        t4 = clock.now()
        nbytes = results[0]["grad"].nbytes
        log.driver_step(
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
        del sent
        after_step(
            step, spec, log, clock, lambda theta=theta: theta, reference.evaluate, client, progress
        )
    return theta


def train_asgd(
    spec: RunSpec,
    client,
    workers: list[str],
    log: TrainingLog,
    reference: Replica,
    progress=None,
    theta0: np.ndarray | None = None,
) -> np.ndarray:
    """Asynchronous parameter server; ``K * steps`` updates of ``B/K`` samples each."""
    _setup(client, spec, workers, log)
    theta = reference.theta if theta0 is None else theta0.copy()
    optimizer = SegmentOptimizer(theta, spec.optimizer)
    per_epoch = steps_per_epoch(len(reference.data.y_train), spec.batch_size)
    K, run = spec.n_workers, spec.run_id
    total = K * spec.steps
    launched, version = 0, 0
    pending: dict = {}  # future -> (update index, version read, rank, time sent)

    def launch(rank: int) -> None:
        nonlocal launched
        step, part = divmod(launched, K)
        t = time.perf_counter()
        sent = _send_theta(client, theta, workers[rank])
        future = client.submit(
            tasks.ps_grad,
            run,
            rank,
            step,
            part,
            sent,
            key=task_key(run, "grad", step, part),
            **pinned(workers[rank]),
        )
        pending[future] = (launched, version, rank, time.perf_counter() - t)
        launched += 1

    clock = Clock()
    step, step_t0, acc = 0, 0.0, _StepAccumulator()
    for rank in range(min(K, total)):
        launch(rank)
    while pending:
        try:
            done, _ = wait(
                list(pending), timeout=spec.step_timeout_s, return_when="FIRST_COMPLETED"
            )
        except TimeoutError:
            raise StepTimeout(
                f"no asgd gradient arrived within train.step_timeout_s={spec.step_timeout_s:g}s"
            ) from None
        for future in done:
            _, read_version, rank, send_s = pending.pop(future)
            t0 = time.perf_counter()
            res = client.gather(future, direct=True)
            t1 = time.perf_counter()
            theta = optimizer.step(res["grad"], spec.batch_size)
            acc.add(
                res,
                staleness=version - read_version,
                send_s=send_s,
                gather_s=t1 - t0,
                update_s=time.perf_counter() - t1,
            )
            version += 1
            if launched < total:
                launch(rank)
            if version % K == 0:  # K updates = one step's B samples
                now = clock.now()
                log.driver_step(
                    step,
                    epoch=step // per_epoch,
                    wall_s=now,
                    step_s=now - step_t0,
                    **acc.row(spec.batch_size, res["grad"].nbytes),
                )
                after_step(
                    step,
                    spec,
                    log,
                    clock,
                    lambda theta=theta: theta,
                    reference.evaluate,
                    client,
                    progress,
                )
                step, step_t0, acc = step + 1, clock.now(), _StepAccumulator()
    return theta


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
