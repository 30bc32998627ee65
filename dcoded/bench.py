"""Side-by-side benchmark: ``python -m dcoded.bench`` (or ``make bench``).

On one emulated cluster (``cluster=netem``; ``--cluster local`` where there is no root) it runs
``ssgd``, ``asgd``, ``ddp`` and ``cdc`` at every redundancy (coded, and uncoded where the two
differ) for each model, on MNIST-sized synthetic data, and writes ``results.csv`` and
``results.md``: time per batch and per phase, bytes per worker (measured multicast and unicast,
Dask, wire) beside the closed forms, and every time as a ratio to ``ssgd`` and to ``ddp``
measured in the same run. Speed is judged here, never by timed assertions in tests.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
import time
from pathlib import Path

from dcoded.coding import Placement, bounds, hybrid_plan
from dcoded.coding.messages import step_messages
from dcoded.config import compose_config

COLUMNS = [
    "topology",
    "model",
    "algorithm",
    "r",
    "shuffle",
    "transport",
    "steps",
    "step_ms",
    "vs_ssgd",
    "vs_ddp",
    "comm_bound_ms",
    "map_ms",
    "encode_ms",
    "shuffle_ms",
    "shuffle_bound_ms",
    "shuffle_x",
    "decode_ms",
    "update_ms",
    "params_ms",
    "params_bound_ms",
    "params_x",
    "multicast",
    "theory_multicast",
    "unicast",
    "theory_unicast",
    "params",
    "dask",
    "moved",
    "wire",
    "test_accuracy",
]


def plan(
    n_workers: int, redundancies: list[int] | None, transports=("direct",), shuffles=None
) -> list[list[str]]:
    """The runs for one model: the baselines, then cdc at every useful ``r``, shuffle and
    transport (at ``r = 1`` every shuffle sends the same values; at ``r = K`` none sends)."""
    runs = [["algorithm=ssgd"], ["algorithm=asgd"], ["algorithm=ddp"]]
    for transport in transports:
        for r in redundancies or range(1, n_workers + 1):
            kinds = shuffles or (
                ("coded", "uncoded", "summed") if 1 < r < n_workers else ("coded",)
            )
            for shuffle in kinds:
                runs.append(
                    [
                        "algorithm=cdc",
                        f"coding.redundancy={r}",
                        f"coding.shuffle={shuffle}",
                        f"transport={transport}",
                    ]
                )
    return runs


def phase_messages(summary: dict) -> dict[str, list[tuple[int, list[int], float]]]:
    """The messages of one step of the run, ``(sender, receivers, bytes)``: the gradient
    exchange and the parameter distribution. Hosts ``0..K-1`` are the workers, ``K`` the
    driver (the parameter server)."""
    K, d4 = summary["n_workers"], 4 * summary["n_params"]
    algorithm = summary["algorithm"]
    if algorithm == "cdc":
        p = Placement(K, summary["redundancy"], summary["group_size"])
        plan = None
        if summary["shuffle"] == "hybrid":
            plan = hybrid_plan(p.g, p.redundancy, summary["hybrid_m"])
        phases = step_messages(p, summary["shuffle"], plan)
        return {k: [(s, r, v * d4) for s, r, v in m] for k, m in phases.items()}
    if algorithm == "ddp":  # ring all-reduce: 2(K-1) chunks of d/K to the next rank
        return {"shuffle": [(i, [(i + 1) % K], 2 * (K - 1) / K * d4) for i in range(K)]}
    return {  # parameter server: gradients up, θ down, through the driver's one link
        "shuffle": [(i, [K], d4) for i in range(K)],
        "params": [(K, [i], d4) for i in range(K)],
    }


def topology_bounds(summary: dict) -> dict[str, float]:
    """Seconds per step that each exchange phase needs at least on the run's emulated
    topology (:mod:`dcoded.coding.bounds`), and their sum (``comm``)."""
    net = summary["environment"].get("netem")
    if not net:
        return {}
    K = summary["n_workers"]
    topology = {
        "kind": net.get("topology", "switch"),
        "rate": net["bandwidth_mbit"] * 1e6 / 8,
        "uplink": (net.get("uplink_mbit") or net["bandwidth_mbit"]) * 1e6 / 8,
    }
    racks = None
    if topology["kind"] == "racks":
        racks = [k // net["rack_size"] for k in range(K)] + [None]  # the driver: on the core
    multicast = summary.get("transport") == "multicast"
    out = {"shuffle": 0.0, "params": 0.0}
    for phase, messages in phase_messages(summary).items():
        loads = bounds.link_bytes(messages, K + 1, multicast, racks)
        out[phase] = bounds.seconds(topology, loads)
    out["comm"] = out["shuffle"] + out["params"]
    return out


def row(summary: dict) -> dict:
    """One bench row from a run's summary; on the emulated network, each exchange phase
    beside its bound on that topology and their ratio (``*_x``)."""
    t, b = summary["time_s"], summary["bytes_per_worker"]

    def ms(x):
        return None if x is None else round(1e3 * x, 2)

    limits = topology_bounds(summary)

    def ratio(phase):
        bound, took = limits.get(phase), t.get(phase)
        return round(took / bound, 3) if bound and took else None

    net = summary["environment"].get("netem") or {}
    return {
        "topology": net.get("topology"),
        "model": summary["model"],
        "algorithm": summary["algorithm"],
        "r": summary["redundancy"],
        "shuffle": summary["shuffle"],
        "transport": summary.get("transport"),
        "steps": summary["steps"],
        "step_ms": ms(t["step_median"]),
        **{
            f"{p}_ms": ms(t.get(p))
            for p in ("map", "encode", "shuffle", "decode", "update", "params")
        },
        **{f"{p}_bound_ms": ms(v) for p, v in limits.items()},
        "shuffle_x": ratio("shuffle"),
        "params_x": ratio("params"),
        "multicast": b["multicast"],
        "theory_multicast": b["theory_multicast"],
        "unicast": b["unicast"],
        "theory_unicast": b["theory_unicast"],
        "params": b["params"],
        "dask": b["dask_transfer"],
        "moved": b.get("transport"),
        "wire": b["wire"],
        "test_accuracy": summary["final"]["test_accuracy"],
    }


def add_ratios(rows: list[dict]) -> None:
    """Each step time over ``ssgd``'s and ``ddp``'s for the same model on the same topology,
    from this run."""
    for where in {(r["model"], r.get("topology")) for r in rows}:
        same = [r for r in rows if (r["model"], r.get("topology")) == where]
        base = {r["algorithm"]: r["step_ms"] for r in same if r["algorithm"] in ("ssgd", "ddp")}
        for r in same:
            for name in ("ssgd", "ddp"):
                ref = base.get(name)
                r[f"vs_{name}"] = round(r["step_ms"] / ref, 3) if ref and r["step_ms"] else None


def markdown(rows: list[dict], header: str) -> str:
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"
        return str(v)

    lines = [header, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dcoded.bench", description=__doc__)
    parser.add_argument("--cluster", choices=["netem", "local"], default="netem")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--bandwidth-mbit", type=float, default=100.0)
    parser.add_argument("--topology", default="switch", help="e.g. switch,bus,racks")
    parser.add_argument("--rack-size", type=int, default=2, help="racks: workers per rack")
    parser.add_argument("--uplink-mbit", type=float, default=None, help="racks (default: rate)")
    parser.add_argument("--queue-ms", type=float, default=None, help="queue of every link")
    parser.add_argument("--models", default="dnn,cnn")
    parser.add_argument("--redundancies", default=None, help="e.g. 1,2 (default: 1..K)")
    parser.add_argument("--transports", default="dask,direct", help="cdc's transports")
    parser.add_argument("--shuffles", default=None, help="e.g. coded,summed (default: all)")
    parser.add_argument("--baselines", default="ssgd,asgd,ddp", help="'' for none")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=240)
    parser.add_argument("--samples", type=int, default=4096, help="synthetic training samples")
    parser.add_argument("--out", default="bench")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    redundancies = [int(x) for x in args.redundancies.split(",")] if args.redundancies else None
    common = [
        f"cluster={args.cluster}",
        f"cluster.n_workers={args.workers}",
        "dataset=synthetic",
        f"dataset.n_samples={args.samples}",
        "dataset.n_test=1000",
        "dataset.shape=[1,28,28]",
        f"train.steps={args.steps}",
        f"train.batch_size={args.batch_size}",
        "train.eval_every=0",
        "progress=false",
        *args.overrides,
    ]
    if args.cluster == "netem":
        common.append(f"cluster.bandwidth_mbit={args.bandwidth_mbit}")
    from dcoded import netem
    from dcoded.run import run

    rows = []
    topologies = args.topology.split(",") if args.cluster == "netem" else [None]
    for topology in topologies:
        shape = []
        if topology:
            shape = [f"cluster.topology={topology}"]
            if args.queue_ms:
                shape.append(f"cluster.queue_ms={args.queue_ms}")
            if topology == "racks":
                uplink = args.uplink_mbit or args.bandwidth_mbit
                shape += [f"cluster.rack_size={args.rack_size}", f"cluster.uplink_mbit={uplink}"]
        with contextlib.ExitStack() as stack:
            net = None
            if topology:
                cluster = compose_config([*common, *shape]).cluster
                links = netem.Links.from_config(cluster)
                net = stack.enter_context(
                    netem.network(args.workers, links, out / f"netem-{topology}")
                )
            for model in args.models.split(","):
                runs = plan(
                    args.workers,
                    redundancies,
                    args.transports.split(","),
                    args.shuffles.split(",") if args.shuffles else None,
                )
                keep = set(filter(None, args.baselines.split(",")))
                runs = [e for e in runs if e[0] == "algorithm=cdc" or e[0].split("=")[1] in keep]
                for extra in runs:
                    name = "-".join([*filter(None, [topology]), model])
                    name = "-".join([name, *(e.split("=")[1] for e in extra)])
                    cfg = compose_config([*common, *shape, f"model={model}", *extra])
                    t = time.monotonic()
                    if net is not None:
                        from omegaconf import OmegaConf

                        summary = netem.run_in_network(
                            OmegaConf.to_container(cfg, resolve=True), out / name, net
                        )
                    else:
                        summary = run(cfg, out_dir=out / name)
                    rows.append(row(summary))
                    print(
                        f"{name}: {rows[-1]['step_ms']} ms/step ({time.monotonic() - t:.0f} s)",
                        file=sys.stderr,
                    )
    add_ratios(rows)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    header = (
        f"dcoded bench: K={args.workers}, cluster={args.cluster}"
        + (
            f" at {args.bandwidth_mbit:g} Mbit/s per link ({args.topology})"
            if args.cluster == "netem"
            else ""
        )
        + f", synthetic 1x28x28, B={args.batch_size}, {args.steps} steps; times are medians "
        "per step; bytes per worker per step; vs_*: step time over that baseline's, same run"
    )
    text = markdown(rows, header)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
