"""dcoded's DDP beside DDP as a user runs it: a plain ``torchrun`` script of the same model,
batch, optimizer and threads, and the two run in turn on this host.

Run by ``torchrun`` (``RANK`` is set), this file is the plain script: the MLP of
``model=dnn`` on MNIST-sized inputs (784 -> 128 -> 64 -> 10, d = 109,386), each rank ``B/K``
random samples a step, SGD with momentum 0.9, gloo (on loopback unless
``GLOO_SOCKET_IFNAME`` says otherwise), ``torch.set_num_threads(1)``,
``DistributedDataParallel`` with its defaults. It times each step on each rank as dcoded
times a DDP step (from taking the step's samples to the optimizer's step, the slowest rank's
time a step) and rank 0 prints one line of JSON: the median over the timed steps.

Run as ``python paper/ddp_plain.py --compare``, it runs that script and
``python -m dcoded algorithm=ddp`` of the same model and batch alternately, ``--runs`` times
each, and prints both medians of every run and their ratio (``--out FILE``: and writes them,
as stage 1 of the paper does for the report's DDP section, :mod:`paper.table_ddp`)::

    python paper/ddp_plain.py --compare --runs 3 --steps 300
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 10  # steps left out of the median: DDP lays its buckets out after its first


def plain(steps: int, batch: int, lr: float) -> None:
    """The plain DDP script, one rank of ``torchrun``."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 128),
        nn.ReLU(),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    generator = torch.Generator().manual_seed(rank)
    n = batch // size
    x_all = torch.randn(64 * n, 1, 28, 28, generator=generator)
    y_all = torch.randint(0, 10, (64 * n,), generator=generator)
    took = []
    for step in range(steps):
        t0 = time.time()
        lo = (step % 64) * n
        x, y = x_all[lo : lo + n], y_all[lo : lo + n]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y, reduction="sum")
        (loss * (size / batch)).backward()
        optimizer.step()
        took.append(time.time() - t0)
    slowest = torch.tensor(took[WARMUP:], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        d = sum(p.numel() for p in model.parameters())
        print(json.dumps({"d": d, "step_median_s": float(slowest.median())}), flush=True)
    dist.barrier()  # no rank tears gloo down while another still reduces
    dist.destroy_process_group()
    # Past this point nothing is measured or sent, yet the interpreter's exit runs gloo's
    # static destructors, which on a loaded host abort ("terminate called without an active
    # exception", SIGABRT) in one run of about ten: leave without them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_plain(args, tries: int = 2) -> dict:
    """The plain script under ``torchrun`` on this host: what its rank 0 printed.

    A launch whose ranks die before rank 0 prints (gloo aborting while it connects its ranks,
    seen on a loaded host) is launched again, ``tries`` times in all; the last failure is raised
    with the ranks' last lines. A launch that printed is never repeated: its time is the one
    measured."""
    for attempt in range(1, tries + 1):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={args.workers}",
                __file__,
                "--steps",
                str(args.steps),
                "--batch",
                str(args.batch),
                "--lr",
                str(args.lr),
            ],
            capture_output=True,
            text=True,
            env={"GLOO_SOCKET_IFNAME": "lo", **os.environ, "OMP_NUM_THREADS": "1"},
        )
        said = [s for s in out.stdout.splitlines() if s.startswith("{")]
        if out.returncode == 0 and said:
            return json.loads(said[-1])
        # torchrun's own message says little: the ranks' last lines say why
        tail = "\n".join((out.stdout + out.stderr).splitlines()[-25:])
        if said:  # it measured, then failed: never hidden by a second launch
            raise RuntimeError(
                f"the plain DDP script printed its time, then failed (status "
                f"{out.returncode}):\n{tail}"
            )
        if attempt < tries:
            print(
                f"the plain DDP script failed (status {out.returncode}), launching it again:\n"
                f"{tail}",
                file=sys.stderr,
                flush=True,
            )
    raise RuntimeError(
        f"the plain DDP script failed {tries} times (last status {out.returncode}):\n{tail}"
    )


def run_dcoded(args, folder: Path) -> float:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "dcoded",
            "algorithm=ddp",
            "model=dnn",
            "dataset=synthetic",
            f"cluster.n_workers={args.workers}",
            f"train.batch_size={args.batch}",
            f"train.steps={args.steps}",
            f"train.lr={args.lr}",
            "train.eval_every=0",
            f"hydra.run.dir={folder}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads((folder / "summary.json").read_text())["time_s"]["step_median"]


def compare(args) -> dict:
    """Both, alternately, ``--runs`` times each; the record ``--out`` writes (medians in ms)."""
    plain_s, dcoded_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            plain_s.append(run_plain(args)["step_median_s"])
            dcoded_s.append(run_dcoded(args, Path(tmp) / f"run{i}"))
            print(
                f"run {i}: plain {plain_s[-1] * 1e3:.2f} ms, dcoded {dcoded_s[-1] * 1e3:.2f} ms",
                flush=True,
            )
    p, q = statistics.median(plain_s), statistics.median(dcoded_s)
    print(
        f"median of {args.runs}: plain torchrun DDP {p * 1e3:.2f} ms a step, dcoded "
        f"algorithm=ddp {q * 1e3:.2f} ms; dcoded / plain = {q / p:.3f} "
        f"(K = {args.workers}, B = {args.batch}, {args.steps} steps, the first {WARMUP} "
        "left out)"
    )
    return {
        "workers": args.workers,
        "batch": args.batch,
        "steps": args.steps,
        "warmup": WARMUP,
        "lr": args.lr,
        "plain_ms": [1e3 * t for t in plain_s],
        "dcoded_ms": [1e3 * t for t in dcoded_s],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", action="store_true", help="run both, alternately")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=480)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=None, help="--compare: write the record here")
    args = parser.parse_args()
    if args.steps <= WARMUP:
        parser.error(f"--steps must be more than {WARMUP} (the steps left out)")
    if "RANK" in os.environ:
        plain(args.steps, args.batch, args.lr)
    elif args.compare:
        record = compare(args)
        if args.out is not None:
            from dcoded import files

            args.out.parent.mkdir(parents=True, exist_ok=True)
            files.write_text(args.out, json.dumps(record, indent=1))
    else:
        parser.error("run it with torchrun, or with --compare")


if __name__ == "__main__":
    main()
