"""Figure 6: where coding pays. Time per step against r on a switch, a bus and racks, for the
coded and the summed shuffle over TCP (``transport=direct``) and as UDP multicast, beside DDP
on the same topology, every exchange beside its bound there; each configuration over its
seeds, and every verdict on a ratio paired by seed (:func:`paper.verdicts.pays`).

Reads ``paper_topology`` (cdc) and ``paper_topology_base`` (ddp). The bounds are those of
:func:`dcoded.topology.phase_bounds`: the busiest shared link's bytes at its rate.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from dcoded.results import interval
from dcoded.topology import EMULATED, phase_bounds
from paper import output, paths
from paper.results import Run, load
from paper.table_time import ci, ratio, versus
from paper.verdicts import pays

COLUMNS = [
    "topology",
    "algorithm",
    "shuffle",
    "transport",
    "r",
    "seeds",
    "step_ms",
    "step_ci_ms",
    "vs_ddp",
    "vs_ddp_ci",
    "shuffle_ms",
    "shuffle_bound_ms",
    "params_ms",
    "params_bound_ms",
    "comm_bound_ms",
    "moved_bytes",
]
STYLES = {
    ("coded", "multicast"): ("C0", "-", "o"),
    ("coded", "direct"): ("C0", "--", "o"),
    ("summed", "multicast"): ("C1", "-", "s"),
    ("summed", "direct"): ("C1", "--", "s"),
}


#: Its section of the report: the title, the sweeps it reads (the section says "not run" where
#: one has not) and the figures it shows.
TITLE = "Beyond the paper (Figure 6): where coding pays, by topology"
READS = ("paper_topology", "paper_topology_base")
FIGURES = ("fig6_topology.png",)


def topology_of(run: Run) -> str:
    return run.summary["environment"]["netem"].get("topology", "switch")


def configuration(run: Run) -> tuple:
    """What a run's seeds repeat: its topology, algorithm, and cdc's shuffle, transport and r."""
    cdc = run["algorithm"] == "cdc"
    return (
        topology_of(run),
        run["algorithm"],
        run["shuffle"] if cdc else None,
        run.summary.get("transport") if cdc else None,
        run["redundancy"] if cdc else None,
    )


def steps_of(by_seed: dict[int, Run]) -> dict[int, float]:
    """Each seed's median step (s)."""
    return {s: r["time_s"]["step_median"] for s, r in by_seed.items()}


def compute(results: Path, size: str) -> list[dict]:
    """One row per configuration, in topology order: its step, the mean over its seeds with
    their 95% interval, its ratio to DDP's on the same topology paired by seed, and its
    phases (the median over the seeds) beside their bounds. ``_steps``: each seed's step."""
    groups: dict[tuple, dict[int, Run]] = {}
    for run in [
        *load(results, size, "paper_topology_base"),
        *load(results, size, "paper_topology"),
    ]:
        groups.setdefault(configuration(run), {})[run["seed"]] = run
    ddp = {k[0]: steps_of(g) for k, g in groups.items() if k[1] == "ddp"}
    rows = []
    for (where, algorithm, shuffle, transport, r), by_seed in groups.items():
        steps = steps_of(by_seed)
        spread = interval(list(steps.values()))
        vs = versus(steps, ddp[where], "ratio") if where in ddp else None
        limits = phase_bounds(next(iter(by_seed.values())).summary)

        def median(f, by_seed=by_seed):
            values = [f(run) for run in by_seed.values()]
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None

        rows.append(
            {
                "topology": where,
                "algorithm": algorithm,
                "shuffle": shuffle,
                "transport": transport,
                "r": r,
                "K": next(iter(by_seed.values()))["n_workers"],
                "mbit": next(iter(by_seed.values())).bandwidth_mbit,
                "_net": next(iter(by_seed.values())).summary.get("environment", {}).get("netem"),
                "seeds": len(steps),
                "step_ms": 1e3 * spread["mean"],
                "step_lo_ms": 1e3 * spread["lo"] if spread["lo"] is not None else None,
                "step_hi_ms": 1e3 * spread["hi"] if spread["hi"] is not None else None,
                "step_ci_ms": ci(
                    *(1e3 * v if v is not None else None for v in (spread["lo"], spread["hi"])), 0
                ),
                "vs_ddp": vs["mean"] if vs else None,
                "vs_ddp_ci": ci(vs["lo"], vs["hi"], 2) if vs else None,
                "shuffle_ms": 1e3 * median(lambda x: x["time_s"]["shuffle"]),
                "shuffle_bound_ms": 1e3 * limits["shuffle"],
                "params_ms": 1e3 * median(lambda x: x["time_s"]["params"]),
                "params_bound_ms": 1e3 * limits["params"],
                "comm_bound_ms": 1e3 * limits["comm"],
                "moved_bytes": median(lambda x: x["bytes_per_worker"].get("transport")),
                "_steps": steps,
                "_vs_ddp": vs,
            }
        )
    order = {name: i for i, name in enumerate(EMULATED)}
    rows.sort(
        key=lambda x: (
            order[x["topology"]],
            x["algorithm"] == "cdc",
            x["r"] or 0,
            x["shuffle"] or "",
            x["transport"] or "",
        )
    )
    return rows


def conditions(rows: list[dict]) -> str:
    """K and the links the runs had, read from them: ``K = 4, 100 Mbit/s links, racks of two
    behind 100 Mbit/s uplinks``."""
    first = rows[0]
    said = f"K = {first['K']}, " + (
        f"{first['mbit']:g} Mbit/s links" if first["mbit"] else "loopback"
    )
    racks = next((x["_net"] for x in rows if x["topology"] == "racks" and x["_net"]), None)
    if racks and racks.get("rack_size") and racks.get("uplink_mbit"):
        said += f", racks of {racks['rack_size']} behind {racks['uplink_mbit']:g} Mbit/s uplinks"
    return said


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    rows = compute(results, size)
    plt = output.pyplot()
    shown = [t for t in EMULATED if any(x["topology"] == t for x in rows)]  # the sweep's
    fig, axes = plt.subplots(
        1, len(shown), figsize=(4.3 * len(shown), 4.4), layout="constrained", squeeze=False
    )
    seeds = max(x["seeds"] for x in rows)
    fig.suptitle(
        f"dnn, K = {rows[0]['K']}: ms per step against r, mean of {seeds} seeds (bars and "
        "band: 95% "
        "interval; dotted: the communication bound)",
        fontsize=10,
    )
    for ax, where in zip(axes[0], shown, strict=True):
        mine = [x for x in rows if x["topology"] == where]
        for (shuffle, transport), (color, line, marker) in STYLES.items():
            pts = sorted(
                (x["r"], x["step_ms"], x["step_lo_ms"], x["step_hi_ms"], x["comm_bound_ms"])
                for x in mine
                if (x["shuffle"], x["transport"]) == (shuffle, transport)
            )
            if not pts:
                continue
            rs, ms, lo, hi, bound = zip(*pts, strict=True)
            below = [m - low if low is not None else 0 for m, low in zip(ms, lo, strict=True)]
            above = [high - m if high is not None else 0 for m, high in zip(ms, hi, strict=True)]
            ax.errorbar(
                rs,
                ms,
                yerr=[below, above],
                color=color,
                ls=line,
                marker=marker,
                capsize=3,
                label=f"cdc {shuffle}, {transport}",
            )
            ax.plot(rs, bound, color=color, ls=":", lw=1, alpha=0.7)
        for x in mine:
            if x["algorithm"] != "cdc":
                ax.axhline(x["step_ms"], color="k", lw=1.2, label=x["algorithm"])
                if x["step_lo_ms"] is not None:
                    ax.axhspan(x["step_lo_ms"], x["step_hi_ms"], color="k", alpha=0.12, lw=0)
        ax.set_title(where)
        ax.set_xlabel("redundancy r")
        ax.set_ylabel("ms per step")
        ax.set_xticks(sorted({x["r"] for x in mine if x["r"]}))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8.5, loc="lower left")
    output.save_figure(fig, paths.figures(out) / "fig6_topology.png")
    output.write_table(
        rows,
        COLUMNS,
        paths.tables(out) / "fig6_topology",
        f"Figure 6: ms per step on each topology (dnn, {conditions(rows)}), the mean of each "
        "seed's median step with its 95% "
        "interval over the seeds; vs_ddp: over DDP's on the same topology, paired by seed; "
        "each exchange (the median over the seeds) beside its bound on that topology; moved: "
        "bytes per worker per step the transport moved (multicast counted once).",
    )


def section(results: Path, size: str) -> str:
    """Where coding pays: every topology's fastest coded runs, and the paper's claim on each,
    judged over the seeds."""
    rows = compute(results, size)
    out = [output.markdown(rows, COLUMNS)]
    for where in EMULATED:
        mine = [r for r in rows if r["topology"] == where]
        ddp = next((r for r in mine if r["algorithm"] == "ddp"), None)
        coded = [r for r in mine if r["algorithm"] == "cdc" and 1 < (r["r"] or 0) < r["K"]]
        if not ddp or not coded:
            continue

        def best(shuffle, transport, rows=coded):
            pick = [r for r in rows if (r["shuffle"], r["transport"]) == (shuffle, transport)]
            return min(pick, key=lambda r: r["step_ms"]) if pick else None

        def at(shuffle, transport, r, rows=coded):
            return next(
                (
                    x
                    for x in rows
                    if (x["shuffle"], x["transport"], x["r"]) == (shuffle, transport, r)
                ),
                None,
            )

        cm, cd = best("coded", "multicast"), best("coded", "direct")
        line = (
            f"- **{where}**: DDP takes {ddp['step_ms']:.0f} ms a step {ddp['step_ci_ms'] or ''}"
            f" ({ddp['seeds']} seeds)."
        )
        over_tcp = None
        if cm:
            line += (
                f" The coded shuffle as multicast, at its best r = {cm['r']} (1 < r < K), takes "
                f"{cm['step_ms']:.0f} ms, {ratio(cm['_vs_ddp'], mark='x')} DDP's"
            )
            if cd:
                same = at("coded", "direct", cm["r"])
                line += f"; over TCP at its best r = {cd['r']}, {cd['step_ms']:.0f} ms"
                if same:
                    over_tcp = versus(cm["_steps"], same["_steps"], "ratio")
                    line += f" (multicast over TCP at r = {cm['r']}: {ratio(over_tcp, mark='x')})"
            summed = at("summed", "multicast", cm["r"])
            if summed:
                line += f"; the summed shuffle at the same r, {summed['step_ms']:.0f} ms"
            line += "."
        out.append(line.replace(" )", ")").replace("  ", " "))
        if cm:
            out.append("  Coding with real multicast " + pays(cm["_vs_ddp"], over_tcp))
    out.append(
        "- On a switch each host has its own link: a multicast frame still has to reach each "
        "receiver through that receiver's own link, so it saves a sender's link and not a "
        "receiver's, and the summed shuffle already gives every receiver the least it can get. "
        "On a bus (CDC's own model) a frame is paid once, whoever receives it; on racks the "
        "uplinks are shared, and a multicast crosses each once."
    )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.figure_topology"))
