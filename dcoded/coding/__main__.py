"""Print the closed-form load tables: ``python -m dcoded.coding --workers 4 [--group-size g]``.

The first table gives every scheme's counts in units of ``d``; the second sets the coded,
summed and hybrid shuffles side by side, each with its egress, ingress and bus total, and
names the best per ``r`` on a switch and on a bus.
"""

from __future__ import annotations

import argparse
import sys

from dcoded.coding.helptext import help_text
from dcoded.coding.hybrid import hybrid_plan
from dcoded.coding.loads import exchange_table, load_table, step_bounds

COLUMNS = [
    ("r", "r", "{:d}"),
    ("compute", "compute", "{:.3f}"),
    ("coded_mc", "coded mc", "{:.4f}"),
    ("coded_uc", "coded uc", "{:.4f}"),
    ("uncoded_mc", "uncoded mc", "{:.4f}"),
    ("uncoded_uc", "uncoded uc", "{:.4f}"),
    ("reduce_scatter", "summed", "{:.4f}"),
    ("hybrid_mc", "hybrid mc", "{:.4f}"),
    ("hybrid_uc", "hybrid uc", "{:.4f}"),
    ("allgather_uc", "all-gather uc", "{:.4f}"),
    ("ring_allreduce", "ring AR", "{:.4f}"),
    ("param_server_up", "PS up", "{:.4f}"),
]


def format_table(n_workers: int, group_size: int | None = None, n_params: int | None = None) -> str:
    """The load table as markdown, in units of ``d`` (or in bytes when ``n_params`` is given)."""
    rows = load_table(n_workers, group_size)
    scale = 4 * n_params if n_params else 1
    unit = f"bytes for d={n_params}" if n_params else "units of d float32 values"
    lines = [
        f"Per worker per step, K={n_workers}, g={group_size or n_workers} ({unit}; "
        "mc: each packet once, uc: once per receiver; compute: fraction of the batch)",
        "",
        "| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
        "|" + "|".join("---:" for _ in COLUMNS) + "|",
    ]
    for row in rows:
        cells = []
        for key, _, fmt in COLUMNS:
            v = row[key]
            if key in ("r", "compute") or not n_params:
                cells.append(fmt.format(v))
            else:
                cells.append(f"{v * scale:,.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_exchanges(
    n_workers: int, group_size: int | None = None, n_params: int | None = None
) -> str:
    """The coded, summed and hybrid shuffles side by side (:func:`exchange_table`), in units
    of ``d/g`` (or bytes for ``n_params``)."""
    g = group_size or n_workers
    rows = exchange_table(n_workers, group_size)
    unit = f"bytes for d={n_params}" if n_params else f"units of d/{g}, one segment"

    def num(x) -> str:
        return f"{float(x) * 4 * n_params / g:,.0f}" if n_params else f"{float(x):.2f}"

    head = ["r"]
    for name in ("coded", "summed"):
        head += [f"{name} out", f"{name} in", f"{name} bus"]
    head += ["m", "groups", "hybrid out (max)", "hybrid in (max)", "hybrid bus", "switch", "bus"]
    lines = [
        f"Gradient exchange inside a cluster of g={g}, per worker ({unit}; out: what a worker "
        "sends, each multicast packet once; in: what it receives; bus: all workers' out, one "
        "shared medium; best on a switch: least max(out, in) at the busiest worker, on a bus: "
        "least bus; hybrid at the m of least bus among the cached families: every m for "
        "g <= 9, only m = r, CDC's own, beyond)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" for _ in head) + "|",
    ]
    for row in rows:
        cells = [str(row["r"])]
        for name in ("coded", "summed"):
            p = row[name]
            cells += [num(p.egress_mean), num(p.ingress_mean), num(p.bus)]
        h, m = row["hybrid"], row["hybrid_m"]
        cells += [
            str(m),
            str(len(hybrid_plan(g, row["r"], m).family)),
            f"{num(h.egress_mean)} ({num(h.egress_max)})",
            f"{num(h.ingress_mean)} ({num(h.ingress_max)})",
            num(h.bus),
            row["best_switch"],
            row["best_bus"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_bounds(n_workers: int) -> str:
    """Per step, what each scheme needs on a switch and on a bus (:func:`step_bounds`)."""
    lines = [
        f"One step on each topology, K={n_workers}, units of d (gradient exchange and "
        "distribution of θ; switch: the busiest host's max(sent, received); bus: all sent, a "
        "multicast once; over a link's rate in d per second, each is the time bound)",
        "",
        "| r | scheme | sent per worker | switch | bus |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in range(1, n_workers + 1):
        for row in step_bounds(n_workers, r):
            if r > 1 and row["scheme"] in ("DDP ring all-reduce", "parameter server"):
                continue  # they do not depend on r
            lines.append(
                f"| {r} | {row['scheme']} | {row['sent']:.2f} | {row['switch']:.2f} | "
                f"{row['bus']:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dcoded.coding",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workers", "-K", type=int, default=4, help="number of workers K")
    parser.add_argument("--group-size", "-g", type=int, default=None, help="group size g")
    parser.add_argument("--params", "-d", type=int, default=None, help="print bytes for d")
    args = parser.parse_args(argv)
    try:
        print(format_table(args.workers, args.group_size, args.params))
        print()
        print(format_exchanges(args.workers, args.group_size, args.params))
        if args.group_size in (None, args.workers):
            print()
            print(format_bounds(args.workers))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
