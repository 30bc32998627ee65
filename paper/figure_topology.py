"""Figure 6: where coding pays. Time per step against r on a switch, a bus and racks, for the
coded and the summed shuffle over TCP (``transport=direct``) and as UDP multicast, beside DDP
and the parameter server on the same topology, every exchange beside its bound there.

Reads ``paper_topology`` (cdc) and ``paper_topology_base`` (ddp, ssgd). The bounds are those of
:func:`dcoded.topology.phase_bounds`: the busiest shared link's bytes at its rate.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dcoded.topology import EMULATED, phase_bounds
from paper import output, paths
from paper.results import Run, load
from paper.verdicts import pays

COLUMNS = [
    "topology",
    "algorithm",
    "shuffle",
    "transport",
    "r",
    "step_ms",
    "p25_ms",
    "p75_ms",
    "vs_ddp",
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


def compute(results: Path, size: str) -> list[dict]:
    """One row per run, in topology order: step time beside DDP's, phases beside bounds."""
    base = load(results, size, "paper_topology_base")
    cdc = load(results, size, "paper_topology")
    ddp = {topology_of(r): r["time_s"]["step_median"] for r in base if r["algorithm"] == "ddp"}
    rows = []
    for run in [*base, *cdc]:
        t, where = run["time_s"], topology_of(run)
        limits = phase_bounds(run.summary)
        cdc_run = run["algorithm"] == "cdc"
        rows.append(
            {
                "topology": where,
                "algorithm": run["algorithm"],
                "shuffle": run["shuffle"] if cdc_run else None,
                "transport": run.summary.get("transport") if cdc_run else None,
                "r": run["redundancy"] if cdc_run else None,
                "step_ms": 1e3 * t["step_median"],
                "p25_ms": 1e3 * t["step_p25"] if t.get("step_p25") is not None else None,
                "p75_ms": 1e3 * t["step_p75"] if t.get("step_p75") is not None else None,
                "vs_ddp": t["step_median"] / ddp[where] if where in ddp else None,
                "shuffle_ms": 1e3 * t["shuffle"],
                "shuffle_bound_ms": 1e3 * limits["shuffle"],
                "params_ms": 1e3 * t["params"],
                "params_bound_ms": 1e3 * limits["params"],
                "comm_bound_ms": 1e3 * limits["comm"],
                "moved_bytes": run["bytes_per_worker"].get("transport"),
            }
        )
    order = {name: i for i, name in enumerate(EMULATED)}
    rows.sort(key=lambda x: (order[x["topology"]], x["algorithm"] == "cdc", x["r"] or 0))
    return rows


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    rows = compute(results, size)
    plt = output.pyplot()
    shown = [t for t in EMULATED if any(x["topology"] == t for x in rows)]  # the sweep's
    fig, axes = plt.subplots(
        1, len(shown), figsize=(16, 4.8), sharey=False, layout="constrained", squeeze=False
    )
    fig.suptitle("dnn, K = 4: time per step against r (dotted: its communication bound)")
    for ax, where in zip(axes[0], shown, strict=True):
        mine = [x for x in rows if x["topology"] == where]
        for (shuffle, transport), (color, line, marker) in STYLES.items():
            pts = sorted(
                (x["r"], x["step_ms"], x["comm_bound_ms"])
                for x in mine
                if (x["shuffle"], x["transport"]) == (shuffle, transport)
            )
            if not pts:
                continue
            rs, ms, bound = zip(*pts, strict=True)
            ax.plot(rs, ms, color=color, ls=line, marker=marker, label=f"{shuffle}, {transport}")
            ax.plot(rs, bound, color=color, ls=":", lw=1, alpha=0.7)
        for x in mine:
            if x["algorithm"] in ("ddp", "ssgd"):
                ax.axhline(x["step_ms"], color="k" if x["algorithm"] == "ddp" else "grey")
                ax.annotate(x["algorithm"], (1, x["step_ms"]), va="bottom", fontsize=8)
        ax.set_title(where)
        ax.set_xlabel("redundancy r")
        ax.set_ylabel("ms per step")
        ax.set_xticks(range(1, 5))
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=8)
    output.save_figure(fig, paths.figures(out) / "fig6_topology.png")
    output.write_table(
        rows,
        COLUMNS,
        paths.tables(out) / "fig6_topology",
        "Figure 6: median ms per step on each topology (dnn, K = 4, 100 Mbit/s links, racks of "
        "two behind 100 Mbit/s uplinks); each exchange beside its bound on that topology; "
        "moved: bytes per worker per step the transport moved (multicast counted once).",
    )


def section(results: Path, size: str) -> str:
    """Where coding pays: every topology's fastest runs, and the paper's claim on each."""
    rows = compute(results, size)
    out = [output.markdown(rows, COLUMNS)]
    for where in EMULATED:
        mine = [r for r in rows if r["topology"] == where]
        ddp = next((r for r in mine if r["algorithm"] == "ddp"), None)
        coded = [r for r in mine if r["algorithm"] == "cdc" and 1 < (r["r"] or 0) < 4]
        if not ddp or not coded:
            continue

        def best(shuffle, transport, rows=coded):
            pick = [r for r in rows if (r["shuffle"], r["transport"]) == (shuffle, transport)]
            return min(pick, key=lambda r: r["step_ms"]) if pick else None

        cm, cd = best("coded", "multicast"), best("coded", "direct")
        sm = best("summed", "multicast")
        line = f"- **{where}**: DDP takes {ddp['step_ms']:.0f} ms a step."
        if cm:
            line += (
                f" The coded shuffle as multicast, at its best r = {cm['r']} (1 < r < K), takes "
                f"{cm['step_ms']:.0f} ms ({cm['vs_ddp']:.2f}x DDP's)"
            )
            if cd:
                line += f"; over TCP at its best r = {cd['r']}, {cd['step_ms']:.0f} ms"
            if sm:
                same = next(
                    (
                        r
                        for r in coded
                        if (r["shuffle"], r["transport"], r["r"])
                        == ("summed", "multicast", cm["r"])
                    ),
                    None,
                )
                if same:
                    line += f"; the summed shuffle at the same r, {same['step_ms']:.0f} ms"
            line += "."
        out.append(line)
        if cm:
            out.append("  Coding with real multicast " + pays(cm, ddp, cd))
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
