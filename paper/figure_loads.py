"""Figure 2: communication per worker per step against r, closed forms beside measurements.

Reads ``paper_loads`` (cdc at every r, coded and uncoded) and ``paper_time`` (the baselines'
measured bytes). Everything is in units of ``d`` float32 values (bytes / 4d) per worker per
step. Left: the gradient exchange, every closed form of ``dcoded.coding.load_table`` with the
measured multicast and unicast counts. Right: all a worker sends, Dask's transfers and the
wire, against the closed form of shuffle plus all-gather (unicast).
"""

from __future__ import annotations

import sys
from pathlib import Path

from dcoded import bench, plots
from dcoded.coding import load_table
from paper import output, paths
from paper.results import load

COLUMNS = [
    "run",
    "r",
    "shuffle",
    "multicast",
    "theory_multicast",
    "unicast",
    "theory_unicast",
    "params",
    "moved",
    "wire",
    "multicast_d",
    "unicast_d",
    "moved_d",
    "wire_d",
    "theory_sent_d",
]


#: The byte fields as the benchmark flattens them from a summary (``dcoded.bench.row``).
BYTE_COLUMNS = COLUMNS[3:10]


def sent(K: int, r: int, shuffle: str) -> float:
    """What a worker sends per step in units of d, unicast: the shuffle and the all-gather of
    θ, except at r = K, where every worker computes the whole batch and updates all of θ
    itself, and nothing is sent (``load_table``'s ``allgather_uc`` counts the all-gather at
    every r; the engine skips it there).

    >>> sent(4, 2, "coded"), sent(4, 4, "coded")
    (1.5, 0.0)
    """
    if r == K:
        return 0.0
    t = load_table(K)[r - 1]
    return (t["coded_uc"] if shuffle == "coded" else t["uncoded_uc"]) + t["allgather_uc"]


def compute(results: Path, size: str) -> list[dict]:
    """One row per run, in bytes and in units of ``d``; the baselines last."""
    cdc = load(results, size, "paper_loads")
    model = cdc[0]["model"]
    base = [r for r in load(results, size, "paper_time") if r["model"] == model]
    rows = []
    for r in [*cdc, *base]:
        b, d = r["bytes_per_worker"], 4 * r["n_params"]
        theory = None
        if r["algorithm"] == "cdc":
            theory = sent(r["n_workers"], r["redundancy"], r["shuffle"])
        rows.append(
            {
                "run": r.label,
                "r": r["redundancy"] if r["algorithm"] == "cdc" else None,
                "shuffle": r["shuffle"] if r["algorithm"] == "cdc" else None,
                **{k: v for k, v in bench.row(r.summary).items() if k in BYTE_COLUMNS},
                **{
                    f"{k}_d": (b[src] / d if b.get(src) is not None else None)
                    for k, src in [
                        ("multicast", "multicast"),
                        ("unicast", "unicast"),
                        ("moved", "transport"),
                        ("wire", "wire"),
                    ]
                },
                "theory_sent_d": theory,
            }
        )
    return rows


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    plt = output.pyplot()
    cdc = load(results, size, "paper_loads")
    K, d = cdc[0]["n_workers"], 4 * cdc[0]["n_params"]
    coded = [r for r in cdc if r["shuffle"] == "coded"]
    uncoded = [r for r in cdc if r["shuffle"] == "uncoded"]

    def per_d(runs, key):
        return [r["redundancy"] for r in runs], [r["bytes_per_worker"][key] / d for r in runs]

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    plots.loads(K, left)
    left.plot(
        *per_d(coded, "multicast"), "kD", mfc="none", ms=9, label="measured: coded, multicast"
    )
    left.plot(*per_d(coded, "unicast"), "kx", ms=9, label="measured: coded, unicast")
    left.plot(*per_d(uncoded, "unicast"), "k+", ms=11, label="measured: uncoded, unicast")
    left.set_title(f"gradient exchange per worker, K={K}: closed forms (lines), measured (marks)")
    left.legend(fontsize="x-small")
    table = load_table(K)
    r = [t["r"] for t in table]
    right.plot(
        r, [sent(K, x, "coded") for x in r], "o-", label="theory: coded shuffle + all-gather"
    )
    right.plot(
        r, [sent(K, x, "uncoded") for x in r], "s--", label="theory: uncoded shuffle + all-gather"
    )
    right.plot(*per_d(coded, "transport"), "kx", ms=9, label="moved by the transport (coded)")
    right.plot(*per_d(uncoded, "transport"), "k+", ms=11, label="moved (uncoded)")
    if all(x["bytes_per_worker"]["wire"] is not None for x in cdc):
        right.plot(*per_d(coded, "wire"), "rv", label="wire (coded)")
        right.plot(*per_d(uncoded, "wire"), "r^", mfc="none", label="wire (uncoded)")
    right.set_xticks(r)
    right.set_xlabel("redundancy r")
    right.set_ylabel("sent per worker per step (units of d)")
    right.set_title("all a worker sends per step")
    right.legend(fontsize="x-small")
    output.save_figure(fig, paths.figures(out) / "fig2_loads.png")
    output.write_table(
        compute(results, size),
        COLUMNS,
        paths.tables(out) / "fig2_loads",
        f"Figure 2: bytes per worker per step (K={K}, d={d // 4:,}); *_d in units of d values; "
        "theory_sent_d: shuffle + all-gather, unicast. ddp: theory_unicast is the ring all-reduce; "
        "its bytes bypass Dask and show on the wire only.",
    )


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_loads"))
