"""A first comparison, in about a minute: is coding worth it on this network?

    python -m dcoded -m experiment=compare     # or: make compare
    python -m dcoded.compare SWEEP_DIR         # the same comparison again, from its saved runs

``conf/experiment/compare.yaml`` runs one job per option of the config group ``compare``:
``ddp`` (PyTorch DDP, the baseline), ``cdc_r1`` (cdc at r = 1: no redundancy, no coding),
``cdc_best`` (cdc's coded shuffle at its best coded r, below) and
``pieces_best`` (the XOR-free control at that r: the coded shuffle's pieces sent plain,
``coding.shuffle=pieces``), on an emulated bus of 100 Mbit/s links with multicast
(``cluster=netem``), or on loopback where the emulated network cannot be made (not root, no
iproute2: ``cluster.fallback=local``), which the output says. When the sweep ends,
:class:`dcoded.callbacks.Comparison` prints :func:`report`: the bench's columns
(:func:`dcoded.bench.row`) for those runs, each ratio with a line on what it means, and what
they say.

The best coded r is chosen before anything runs, from the configuration alone: of the coded
layouts ``1 < r < g`` (``g`` the group size, or K; at ``r = K`` nothing is sent and every worker
computes the whole batch), the r whose step :func:`dcoded.predict.predict` predicts least on
this network (:mod:`dcoded.predict.best`, ``${dcoded_best_redundancy:}`` in
``conf/compare/cdc_best.yaml``). Any other r:
``python -m dcoded -m experiment=compare +compare=cdc_best,pieces_best coding.redundancy=2``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from dcoded import bench
from dcoded.predict.best import best_of, coded_steps
from dcoded.results import load_sweep

#: What :class:`dcoded.callbacks.Comparison` writes into the sweep folder: :func:`report`.
REPORT_FILE = "compare.md"
#: The comparison's columns: the bench's, and the exchange's bytes beside the closed form's.
COLUMNS = [
    "run",
    "r",
    "shuffle",
    "transport",
    "step_ms",
    "p25_ms",
    "p75_ms",
    "vs_ddp",
    "comm_bound_ms",
    "step_x",
    "predicted_ms",
    "sent_B",
    "theory_B",
    "bytes_x",
]

#: One line on what each ratio (or column) means, printed under the table where it is shown.
MEANING = {
    "vs_ddp": "the run's median step over DDP's in this sweep (below 1: faster than DDP).",
    "step_x": "the median step over comm_bound_ms, the least time the step's exchange needs "
    "on these links (its bytes at the links' rate, compute aside): near 1 the links are the "
    "cost; far above, the rest of the step is (compute, per-message and per-step costs).",
    "bytes_x": "the gradient exchange's bytes a worker sent per step (sent_B: a multicast "
    "counted once, a TCP message once per receiver) over the closed form's (theory_B): 1 is "
    "what the scheme should send. DDP's ring is not counted message by message (its theory_B: "
    "2(K-1)/K of the gradient).",
    "predicted_ms": "the step `python -m dcoded.predict` predicts from the configuration alone "
    "(costs fitted on earlier runs), to set each measured step against.",
}


# --------------------------------------------------------------------------- the comparison


def label(summary: Mapping) -> str:
    """What a run is in the comparison (its group size where it is not K).

    >>> runs = [("ddp", None, None, None), ("cdc", 1, "coded", 4), ("cdc", 3, "coded", 4),
    ...         ("cdc", 3, "pieces", 4), ("cdc", 2, "coded", 2)]
    >>> [label({"algorithm": a, "redundancy": r, "shuffle": s, "group_size": g, "n_workers": 4})
    ...  for a, r, s, g in runs]
    ['DDP', 'cdc r=1', 'cdc r=3 coded', 'cdc r=3 XOR-free', 'cdc r=2 g=2 coded']
    """
    algorithm, r = summary["algorithm"], summary.get("redundancy")
    if algorithm == "ddp":
        return "DDP"
    if algorithm != "cdc":
        return str(algorithm)
    g = summary.get("group_size")
    head = f"cdc r={r}" + (f" g={g}" if g not in (None, summary["n_workers"]) else "")
    if r == 1:
        return head
    return f"{head} " + ("XOR-free" if summary.get("shuffle") == "pieces" else summary["shuffle"])


def exchange_bytes(summary: Mapping) -> tuple[float | None, float | None]:
    """``(sent, theory)``: the gradient exchange's bytes a worker sent per step, as its
    transport moved them (multicast once, TCP once per receiver), and the closed form's; DDP's
    ring is not counted message by message (``sent`` is ``None``)."""
    b = summary["bytes_per_worker"]
    if summary["algorithm"] == "ddp":
        return None, b.get("theory_unicast")
    kind = "multicast" if summary.get("transport") == "multicast" else "unicast"
    return b.get(kind), b.get(f"theory_{kind}")


def rows(summaries: Sequence[Mapping]) -> list[dict]:
    """The comparison's rows: the bench's row of each finished run (:func:`dcoded.bench.row`,
    with its ratio to DDP's step), its ``run`` label and its exchange's bytes beside theory's;
    DDP first, then cdc by r, the coded shuffle before its XOR-free control."""
    out = []
    for s in summaries:
        row = bench.row(s)
        sent, theory = exchange_bytes(s)
        row.update(
            run=label(s),
            g=s.get("group_size"),
            sent_B=sent,
            theory_B=theory,
            bytes_x=round(sent / theory, 3) if sent and theory else None,
        )
        out.append(row)
    bench.add_ratios(out)
    out.sort(
        key=lambda r: (r["algorithm"] != "ddp", r["r"] or 0, r["shuffle"] == "pieces", r["g"] or 0)
    )
    return out


def _spread(a: Mapping, b: Mapping) -> str:
    """Whether run ``a``'s steps are faster or slower than ``b``'s beyond their spread (the
    interquartile ranges apart), or not told apart."""
    if None in (a.get("p25_ms"), a.get("p75_ms"), b.get("p25_ms"), b.get("p75_ms")):
        return "its spread unknown"
    if a["p75_ms"] < b["p25_ms"]:
        return "faster beyond the steps' spread"
    if a["p25_ms"] > b["p75_ms"]:
        return "slower beyond the steps' spread"
    return "not told apart, their steps' interquartile ranges overlapping"


def _ratio_line(a: Mapping, b: Mapping, name: str) -> str:
    x = a["step_ms"] / b["step_ms"]
    return (
        f"{a['run']}: {x:.2f}x {name}'s step ({a['step_ms']:g} against {b['step_ms']:g} ms: "
        f"{_spread(a, b)})"
    )


def verdicts(table: Sequence[Mapping], best: Mapping | None = None) -> list[str]:
    """What the rows say, one line each: the best coded r and how it was chosen (``best``:
    ``{"r", "steps", "K", "g"}``), cdc at that r and at r = 1 against DDP, and the coded shuffle
    against its XOR-free control at the same r (steps and bytes)."""
    ddp = next((r for r in table if r["algorithm"] == "ddp"), None)
    r1 = next((r for r in table if r["algorithm"] == "cdc" and r["r"] == 1), None)
    coded = [r for r in table if r["algorithm"] == "cdc" and r["shuffle"] == "coded" and r["r"] > 1]
    lines = _best_lines(best, sorted({r["r"] for r in coded})) if best else []
    for row in coded:
        if ddp:
            lines.append(_ratio_line(row, ddp, "DDP"))
        same = [r for r in table if (r["algorithm"], r["r"], r["g"]) == ("cdc", row["r"], row["g"])]
        control = next((r for r in same if r["shuffle"] == "pieces"), None)
        if control:
            lines.append(_control_line(row, control))
    if r1 and ddp:
        lines.append(_ratio_line(r1, ddp, "DDP"))
    return lines


def _best_lines(best: Mapping, ran: Sequence[int]) -> list[str]:
    """How the best coded r was chosen, and the r that ran where an override chose another."""
    predicted = ", ".join(
        f"r={r}: {'impossible' if isinstance(t, str) else f'{1e3 * t:.1f} ms'}"
        for r, t in best["steps"].items()
    )
    lines = [
        f"best coded r = {best['r']}: of the coded layouts 1 < r < {best['g']}, the least "
        f"step dcoded.predict predicts on this network ({predicted}), chosen from the "
        f"configuration before any run (r = {best['g']} sends nothing: every worker "
        "computes the whole batch)"
    ]
    if ran and best["r"] not in ran:
        lines.append(f"(these runs are at r = {', '.join(map(str, ran))}, as their configs say)")
    return lines


def _control_line(row: Mapping, control: Mapping) -> str:
    """The coded shuffle against its XOR-free control: steps, and the bytes each sent."""
    line = _ratio_line(row, control, "its XOR-free control")
    if row.get("sent_B") and control.get("sent_B"):
        line += (
            f", sending {row['sent_B'] / control['sent_B']:.2f}x its bytes "
            f"({row['sent_B']:,.0f} against {control['sent_B']:,.0f} B)"
        )
    return line


def network_line(summaries: Sequence[Mapping]) -> str:
    """Where the runs ran: the emulated links, or loopback (and why, where the emulated network
    was asked for and cannot be made here)."""
    from dcoded.netem import loopback_reason

    s = summaries[0]
    net = s["environment"].get("netem") or {}
    where = f"K={s['n_workers']}, {s['model']} on {s['dataset']}, B={s['batch_size']}, "
    where += f"{s['steps']} steps a run (one run each; times are medians per step)"
    if net:
        links = f"an emulated {net['topology']} of {net['bandwidth_mbit']:g} Mbit/s links"
        cluster = (s.get("config") or {}).get("cluster") or {}
        cores = s["environment"].get("cores")
        hosts = (
            "; each worker an emulated machine of its own (cluster.scale_model=true)"
            if cluster.get("scale_model")
            else f"; the {s['n_workers']} workers share this machine's {cores} cores, so compute "
            "is slower than on K machines (cluster.scale_model=true emulates them: slower to run)"
        )
        return f"compare: {where}, on {links} (cluster=netem){hosts}"
    asked = (s.get("config") or {}).get("cluster") or {}
    why = loopback_reason({**asked, "kind": "netem", "fallback": "local"})
    return (
        f"compare: {where}, on LOOPBACK (cluster=local)"
        + (f": the emulated network cannot be made here ({why})" if why else "")
        + ". No link is emulated: a byte costs almost nothing, there is no bound, and a scheme "
        "that sends fewer bytes need not be faster; these ratios measure compute and per-message "
        "costs, not a network (as root, with iproute2, the same command runs the emulated links)"
    )


def best_choice(summaries: Sequence[Mapping]) -> dict | None:
    """How the best coded r was chosen, recomputed from a coded run's own configuration:
    ``{"r", "steps", "K", "g"}`` (``None`` without a coded run, or a coded r to choose)."""
    coded = [
        s
        for s in summaries
        if s["algorithm"] == "cdc" and (s.get("redundancy") or 1) > 1 and s.get("config")
    ]
    if not coded:
        return None
    s = max(coded, key=lambda s: s.get("group_size") or s["n_workers"])  # g = K where it ran
    emulated = bool(s["environment"].get("netem"))
    cores = s["environment"].get("cores")
    steps = coded_steps(s["config"], s["n_params"], emulated, cores)
    K, best = s["n_workers"], best_of(steps)
    return {"r": best, "steps": steps, "K": K, "g": s.get("group_size") or K} if best else None


def comparison(summaries: Sequence[Mapping], missing: Sequence[str] = ()) -> str:
    """The comparison of these runs' summaries: where they ran, the table, what each ratio
    means and what the ratios say; ``missing``: a line each for runs that did not finish."""
    if not summaries:
        return "compare: no finished runs" + (f" ({'; '.join(missing)})" if missing else "") + "\n"
    table = rows(summaries)
    head = network_line(summaries)
    lines = [bench.markdown(table, head, columns=COLUMNS, notes="").rstrip()]
    shown = [c for c in MEANING if any(r.get(c) is not None for r in table)]
    lines += ["", "what the ratios mean:", *(f"  {c}: {MEANING[c]}" for c in shown)]
    lines += ["", "what they say:"]
    lines += [f"  {v}" for v in verdicts(table, best_choice(summaries))]
    lines += [f"  did not finish: {m}" for m in missing]
    return "\n".join(lines) + "\n"


def report(sweep_dirs: Sequence[str | Path]) -> str:
    """The :func:`comparison` of the runs in these sweep folders (the jobs that did not
    finish named at its end)."""
    jobs = [j for d in sweep_dirs for j in load_sweep(d)]
    summaries = [j["summary"] for j in jobs if j["status"] == "finished"]
    missing = [f"{j['dir'].name}: {j['status']}" for j in jobs if j["status"] != "finished"]
    return comparison(summaries, missing)


# --------------------------------------------------------------------------- from Python


def jobs(overrides: Sequence[str] = ()) -> list:
    """The configs of ``python -m dcoded -m experiment=compare OVERRIDES``'s jobs, as its
    multirun composes them (:func:`dcoded.config.sweep_jobs`), for :func:`run_all`."""
    from hydra import initialize_config_module

    from dcoded.config import CONFIG_MODULE, check_overrides, multirun_master, sweep_jobs

    check_overrides(["experiment=compare", *overrides])  # a typo: one ConfigError line
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        master = multirun_master(["experiment=compare", *overrides])  # as -m: they may sweep
        return [cfg for _, cfg in sweep_jobs(master)]


def run_all(configs: Sequence, out_dir: str | Path | None = None) -> list[dict]:
    """Run ``configs`` one after another on one cluster, as a multirun's jobs share one (local,
    or emulated), closed at the end; each run into ``out_dir/<i>`` (if given). Their
    summaries, in order.

    >>> summaries = run_all(jobs(["train.steps=3"]))  # doctest: +SKIP
    >>> print(comparison(summaries))  # doctest: +SKIP
    """
    from dcoded import netem
    from dcoded.cluster import close_kept_cluster
    from dcoded.run import run

    where = [None if out_dir is None else Path(out_dir) / str(i) for i in range(len(configs))]
    try:
        return [run(c, out_dir=d, reuse_cluster=True) for c, d in zip(configs, where, strict=True)]
    finally:
        close_kept_cluster()
        netem.release_shared()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dcoded.compare",
        description="Print the comparison of an experiment=compare sweep (reads, writes nothing).",
    )
    p.add_argument("sweep_dirs", nargs="+", type=Path, metavar="SWEEP_DIR")
    args = p.parse_args(argv)
    for d in args.sweep_dirs:
        if not d.is_dir():
            print(f"error: {d} is not a folder (a multirun's sweep dir)", file=sys.stderr)
            return 2
    print(report(args.sweep_dirs), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
