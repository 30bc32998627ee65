"""``paper/REPORT.md``: every reproduced number beside the paper's, the conditions, and where
the paper's claims hold here, where they do not, and why. Generated from the results only."""

from __future__ import annotations

import datetime as dt
import itertools
import sys
from pathlib import Path

from dcoded import files
from dcoded.coding import load_table
from dcoded.topology import EMULATED
from paper import (
    figure_accuracy,
    figure_bandwidth,
    figure_hybrid,
    figure_loads,
    figure_phases,
    figure_scaling,
    figure_stragglers,
    figure_topology,
    output,
    paths,
    table_time,
    table_to_accuracy,
    tuning,
)
from paper.cache import SKIPPED
from paper.results import MissingResults, Run, load, meta, stale


def _less(pct: float) -> str:
    return f"{pct:.1f}% less time than SSGD" if pct >= 0 else f"{-pct:.1f}% *more* time than SSGD"


def verdict(ours: float, paper: float, lo: float | None = None, hi: float | None = None) -> str:
    """How a measured reduction (percent) compares with the paper's. With the 95% interval
    of the reduction over seeds (``lo``, ``hi``), the verdict is only what the interval
    supports: an interval that holds 0 is "within noise", whatever its mean."""
    if lo is not None and hi is not None:
        if hi < 0:
            return (
                f"**does not hold here**: cdc takes {-ours:.1f}% *more* time [{lo:.1f}, {hi:.1f}]"
            )
        if lo <= 0:
            return f"**within noise**: the interval of the reduction, [{lo:.1f}, {hi:.1f}], holds 0"
        if lo <= paper <= hi or abs(ours - paper) <= 10:
            return (
                f"**holds**: the paper's figure lies within 10 points of ours or inside its "
                f"interval [{lo:.1f}, {hi:.1f}]"
            )
        if hi < paper:
            return (
                f"**holds in direction**, but the saving is smaller than the paper's (its interval "
                f"[{lo:.1f}, {hi:.1f}])"
            )
        return (
            "**holds**, and the saving is larger than the paper's (its interval "
            f"[{lo:.1f}, {hi:.1f}])"
        )
    if ours <= 0:
        return f"**does not hold here**: cdc takes {-ours:.1f}% *more* time"
    if abs(ours - paper) <= 10:
        return "**holds**, within 10 points of the paper's figure"
    if ours < paper:
        return "**holds in direction**, but the saving is smaller than the paper's"
    return "**holds**, and the saving is larger than the paper's"


def not_coding(row: dict) -> list[tuple[str, str, bool]]:
    """The ends r = 1 and r = K that are faster than cdc's coded best beyond noise (the 95%
    interval of their reduction against it, over seeds, above 0; with one seed, its mean
    above 0): any saving is not coding's. Each as ``(name, how much faster, one seed)``."""
    out = []
    for end, name in (("r1_ahead", "r = 1"), ("rK_ahead", f"r = K = {row['K']}")):
        s = row["_stats"].get(end)
        if s and s["lo"] is not None and s["lo"] > 0:
            band = f"[{s['lo']:.1f}, {s['hi']:.1f}]"
            out.append((name, f"{s['mean']:.1f}% less time than the coded best {band}", False))
        elif s and s["lo"] is None and s["mean"] > 0:
            out.append((name, f"{s['mean']:.1f}% less time than the coded best; one seed", True))
    return out


def by_coding(said: str, faster: list[tuple[str, str, bool]], why: str) -> str:
    """A verdict that holds, but where an r without coding is faster still: its bold moves to
    "**but not by coding**", followed by ``why``."""
    if not faster or not said.startswith("**holds"):
        return said
    return said.replace("**holds", "holds", 1).replace("**", "", 1) + why


def _config(run: Run) -> dict:
    """The run's composed config as Hydra saved it, interpolations resolved."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(run.dir / ".hydra" / "config.yaml"), resolve=True)


def conditions(results: Path, size: str) -> str:
    m = meta(results, size, "paper_time")
    runs = load(results, size, "paper_time")
    first, cfg = runs[0], _config(runs[0])
    env = first["environment"]
    if env.get("netem"):
        net = env["netem"]
        link = (
            f"emulated network (`cluster=netem`): every host in its own network namespace, "
            f"every link capped by `tc tbf` at {net['bandwidth_mbit']:g} Mbit/s both ways, the "
            f"driver's (the parameter server's) link at {net['driver_bandwidth_mbit']:g} Mbit/s"
        )
    else:
        link = f"local Dask cluster, no emulated links ({m['cluster_note']})"
    models = {}
    for r in runs:
        models.setdefault(r["model"], r["n_params"])
    opt = cfg["optimizer"]
    lines = [
        f"- size: `{size}` (`make paper SIZE={size}`); results of {m['finished'][:10]}",
        f"- workers: K = {first['n_workers']} Dask worker processes, one thread and "
        f"{env['torch_threads']} torch thread each, on a machine with {env['cores']} cores "
        "(the workers share them: redundant compute costs more here than on K machines)",
        f"- network: {link}",
        f"- data: {m['data']}",
        "- models: "
        + "; ".join(
            f"`{name}` (d = {d:,} float32 parameters, {4 * d / 1e6:.2f} MB)"
            for name, d in models.items()
        ),
        f"- training: batch B = {first['batch_size']}, {first['steps']} steps per run in Table 1 "
        f"and Figure 3, optimizer {opt['_target_'].rsplit('.', 1)[-1]} "
        f"({', '.join(f'{k} {v}' for k, v in opt.items() if not k.startswith('_'))}) in Table "
        f"1, each algorithm's tuned rate in Figure 4 and Table 1b; seeds "
        f"{', '.join(str(s) for s in sorted({r['seed'] for r in runs}))} in Table 1 (each "
        "time the median over them), five in Figure 4 and Table 1b",
        f"- software: python {env['python']}, torch {env['torch']}, dask {env['dask']}, "
        f"distributed {env['distributed']}, numpy {env['numpy']}",
    ]
    return "\n".join(lines)


def provenance(results: Path, size: str) -> str:
    """One line per finished sweep: the commit it ran at, and whether it is stale."""
    lines = []
    for e in paths.EXPERIMENTS:
        try:
            m = meta(results, size, e)
        except MissingResults:
            continue
        why = stale(results, size, e)
        lines.append(
            f"- `{e}`: commit `{m.get('commit') or 'unknown'}`, {m['jobs']} jobs, finished "
            f"{m.get('finished', '?')[:16].replace('T', ' ')} UTC"
            + (f"; **stale**: {why}" if why else "; fresh (same job configs and code)")
        )
    return "\n".join(lines)


def result_time(results: Path, size: str) -> str:
    rows = table_time.compute(results, size)
    phases = {}
    for rs in figure_phases.runs(results, size).values():
        seed = min(r["seed"] for r in rs)  # the seed Figure 3 draws
        phases.update({(r["model"], r.label): r for r in rs if r["seed"] == seed})
    out = [output.markdown(rows, table_time.COLUMNS)]
    seeds = rows[0]["seeds"] if rows else 0
    out.append(
        "Training time is the wall time of the training loop for the same samples "
        f"(`time_s.total`), the median of {seeds} seeds (the seeds the sweep's outer loop, so "
        "that the repeats interleave and the machine's drift hits every algorithm alike; every "
        "run, with its step's interquartile range: `tables/table1_every_run.md`). Reductions are "
        "`100 (1 - cdc / baseline)` per seed, their mean and [95% interval] over the seeds "
        "(Student's t); a verdict is stated only where the interval supports it. The paper's "
        "claim is about coding, so it is judged on the fastest r with coding in play "
        "(1 < r < K); r = 1 (no packet is coded: a plain reduce-scatter) and r = K (every "
        "worker computes the whole batch, nothing is shuffled) are beside it as what they are, "
        "and where one of them is faster beyond noise the saving is not coding's.\n"
    )
    for row in rows:
        model = row["model"]
        ssgd = phases[(model, "ssgd")]
        K = row["K"]
        r = row["coded_best_r"]
        if r is None:
            out.append(
                f"**{model.upper()}**: the paper's claim cannot be judged here: no run has "
                f"coding in play (1 < r < K = {K}).\n"
            )
        else:
            out.append(f"**{model.upper()}** (coding in play: cdc at r = {r}, K = {K}):\n")
        faster = not_coding(row) if r is not None else []
        for base in ("ssgd", "asgd") if r is not None else ():
            ours, paper = row[f"less_than_{base}_pct"], row[f"paper_less_than_{base}_pct"]
            if ours is None:
                continue
            s = row["_stats"][f"less_than_{base}"]
            here = f"{ours:.1f}% less time" if ours >= 0 else f"{-ours:.1f}% *more* time"
            ends = " and ".join(f"{name} ({how})" for name, how, _ in faster)
            verb = "is" if len(faster) == 1 else "are"
            said = by_coding(
                verdict(ours, paper, s["lo"], s["hi"]),
                faster,
                f"; **but not by coding**: {ends} {verb} faster still",
            )
            out.append(
                f"- against {base.upper()}: {here} here, {paper:.2f}% less in the paper: {said}."
            )
        out.append(_uncoded_beside(row, K))
        if r is not None:
            out.append(_why(ssgd, phases[(model, f"cdc r={r}")], r))
        if r is not None and row["ddp_s"]:
            s = row["_stats"].get("coded_over_ddp", {})
            band = f" [{s['lo']:.2f}, {s['hi']:.2f}]" if s.get("lo") is not None else ""
            ddps = ", ".join(f"{lab} {t:.2f} s" for lab, t in row["ddps"].items())
            out.append(
                f"- against DDP (not in the paper; what a user would run instead), the fastest "
                f"of its bucket sizes ({ddps}; {row['ddp_run']} is the fastest): cdc takes "
                f"{row['coded_over_ddp']:.2f}×{band} DDP's time. DDP's ring all-reduce moves "
                "about as many bytes per worker as cdc at r = 1, but inside one long-lived "
                "process group with no Dask task, scheduler or serialisation per step."
            )
        out.append("")
    return "\n".join(out)


def _uncoded_beside(row: dict, K: int) -> str:
    """r = 1 and r = K beside the coded best, and where the saving against SSGD comes from."""
    beside = []
    if row["r1_less_than_ssgd_pct"] is not None:
        beside.append(
            f"r = 1, where no packet is coded, takes {_less(row['r1_less_than_ssgd_pct'])}"
        )
    if row["rK_less_than_ssgd_pct"] is not None:
        beside.append(
            f"r = K = {K}, where every worker computes the whole batch and only the all-gather "
            f"of θ remains, takes {_less(row['rK_less_than_ssgd_pct'])}"
        )
    if not beside:
        return "- no run at r = 1 or r = K to set beside it."
    line = "- beside it, without coding: " + "; ".join(beside) + "."
    faster = [
        f"r = {n}"
        for n, t in ((1, row["r1_s"]), (K, row["rK_s"]))
        if t is not None and row["coded_s"] is not None and t < row["coded_s"]
    ]
    beyond = not_coding(row) if row["coded_s"] is not None else []
    if beyond:
        one_seed = any(single for *_, single in beyond)
        line += (
            f" {' and '.join(name for name, *_ in beyond)} "
            f"{'is' if len(beyond) == 1 else 'are'} faster than any coded r here"
            + (" (one seed: no interval)" if one_seed else ", beyond noise")
            + ": that saving is not coding's."
        )
    elif faster:
        line += (
            f" {' and '.join(faster)} {'has' if len(faster) == 1 else 'have'} a shorter median "
            "time than the coded best, within noise."
        )
    if row["coded_s"] is not None and row["r1_less_than_ssgd_pct"] is not None:
        ahead = row["less_than_ssgd_pct"] - row["r1_less_than_ssgd_pct"]
        line += (
            " Much of any saving against SSGD is the parameter server's single link taken out of "
            f"the path, which a reduce-scatter already does; the best coded r is {abs(ahead):.1f} "
            f"points {'ahead of' if ahead > 0 else 'behind'} r = 1 here."
        )
    return line


def _why(ssgd: Run, best: Run, r: int) -> str:
    """Where the time of a step goes, ssgd against cdc at ``r``."""
    t, b = ssgd["time_s"], ssgd["bytes_per_worker"]
    bw = (ssgd.summary["environment"].get("netem") or {}).get("driver_bandwidth_mbit")
    link = ""
    if bw:
        K = ssgd["n_workers"]
        link_ms = 1e3 * K * b["unicast"] * 8 / (bw * 1e6)
        link = (
            f"; the {K} gradients of {b['unicast']:,.0f} B all cross the "
            f"driver's one link, {link_ms:.0f} ms at {bw:g} Mbit/s by the rate alone, and θ "
            "goes back the same way"
        )
    bt = best["time_s"]
    return (
        f"- why: ssgd's median step is {1e3 * t['step_median']:.0f} ms, of which "
        f"{1e3 * t['map']:.0f} ms is computing, {1e3 * t['shuffle']:.0f} ms sending "
        f"gradients to the server and {1e3 * t['params']:.0f} ms getting θ back{link}. "
        f"cdc at r = {r} has no server: its step is "
        f"{1e3 * bt['step_median']:.0f} ms, {1e3 * bt['map']:.0f} ms computing "
        f"({r}× the samples of an ssgd worker), "
        f"{1e3 * bt['shuffle']:.0f} ms shuffling and "
        f"{1e3 * bt['params']:.0f} ms gathering θ."
    )


def result_loads(results: Path, size: str) -> str:
    rows = figure_loads.compute(results, size)
    cdc = [r for r in rows if r["r"] is not None]
    shown = ["run", "multicast_d", "unicast_d", "moved_d", "wire_d", "theory_sent_d"]
    out = [output.markdown(rows, shown)]
    runs = load(results, size, "paper_loads")
    K = runs[0]["n_workers"]
    table = {t["r"]: t for t in load_table(K)}
    worst_mc = max(
        abs(r["multicast"] - r["theory_multicast"]) / max(r["theory_multicast"], 1)
        for r in cdc
        if r["theory_multicast"]
    )
    worst_uc = max(
        abs(r["unicast"] - r["theory_unicast"]) / max(r["theory_unicast"], 1)
        for r in cdc
        if r["theory_unicast"]
    )
    out.append(
        f"In units of d float32 values per worker per step (K = {K}). Every closed form is drawn "
        "in `figures/fig2_loads.png` (coded and uncoded shuffle, summed reduce-scatter, ring "
        "all-reduce, parameter server).\n"
    )
    out.append(
        f"- The measured counts match the closed forms: multicast within {100 * worst_mc:.3f}%, "
        f"unicast within {100 * worst_uc:.3f}% (the difference is the zero padding of pieces "
        "to whole 4-byte words)."
    )
    pairs = []
    for r in range(2, K):
        c = next((x for x in cdc if x["r"] == r and x["shuffle"] == "coded"), None)
        u = next((x for x in cdc if x["r"] == r and x["shuffle"] == "uncoded"), None)
        if c and u:
            pairs.append(
                f"r = {r}: coded multicast {c['multicast_d']:.3f} d against uncoded "
                f"{u['multicast_d']:.3f} d ({u['multicast'] / c['multicast']:.2f}× fewer), "
                f"unicast {c['unicast_d']:.3f} d against {u['unicast_d']:.3f} d"
            )
    if pairs:
        out.append(
            "- Coding divides the *multicast* count by r, as the paper says: "
            + "; ".join(pairs)
            + ". Over TCP (the direct transport), a packet for r receivers is sent r times, so the "
            "*unicast* bytes of coded and uncoded are the same: the r-fold saving needs a "
            "broadcast medium this fabric does not have."
        )
    rs = table[1]["reduce_scatter"]
    out.append(
        f"- A reduce-scatter that sums before sending ({rs:.3f} d at r = 1, "
        f"{table[2]['reduce_scatter']:.3f} d at r = 2) sends less than the coded shuffle's "
        f"unicast ({table[1]['coded_uc']:.3f} d, {table[2]['coded_uc']:.3f} d) because it uses "
        "that gradients add up; CDC's shuffle, built for arbitrary reduce functions, does not."
    )
    wire = [r for r in cdc if r["wire_d"] is not None and r["moved_d"]]
    if wire:
        over = [r["wire_d"] / r["moved_d"] - 1 for r in wire]
        out.append(
            f"- The wire carries {100 * min(over):.0f}–{100 * max(over):.0f}% more than the "
            "transport's own count: TCP/IP headers, Dask's control messages and the heartbeats."
        )
    return "\n".join(out) + "\n"


def result_phases(results: Path, size: str) -> str:
    rows = figure_phases.compute(results, size)
    out = [output.markdown(rows, figure_phases.COLUMNS)]
    for model, runs in figure_phases.runs(results, size).items():
        seed = min(r["seed"] for r in runs)  # the figure's seed
        cdc = [r for r in runs if r["algorithm"] == "cdc" and r["seed"] == seed]
        if not cdc:
            continue
        lo, hi = cdc[0], cdc[-1]
        best = min(cdc, key=lambda r: r["time_s"]["step_median"])
        K = lo["n_workers"]
        gathered = [1e3 * r["time_s"]["params"] for r in cdc if r["redundancy"] < K]
        theta = (
            f"the all-gather of θ takes {min(gathered):.0f}–{max(gathered):.0f} ms at every r < K"
            if gathered
            else "no run gathers θ"
        )
        out.append(
            f"- {model} (seed {seed}): from r = {lo['redundancy']} to r = {hi['redundancy']} "
            "computing goes "
            f"from {1e3 * lo['time_s']['map']:.0f} to {1e3 * hi['time_s']['map']:.0f} ms and "
            f"the shuffle from {1e3 * lo['time_s']['shuffle']:.0f} to "
            f"{1e3 * hi['time_s']['shuffle']:.0f} ms; {theta}"
            + (
                f", and none at r = K = {K}, where every worker updates all of θ itself"
                if any(r["redundancy"] == K for r in cdc)
                else ""
            )
            + f". The fastest step is at r = {best['redundancy']} "
            f"({1e3 * best['time_s']['step_median']:.0f} ms)."
        )
    return "\n".join(out) + "\n"


def accuracy_sentence(row: dict, ssgd: dict) -> str:
    """One algorithm's final accuracy against ssgd's and the verdict of the stated rule, from
    its row of Figure 4's table alone."""
    said = {
        "same": "by the rule",
        "differs": "by the rule",
        "undecided": "the seeds cannot tell it from ssgd's within one point",
    }[row["same_as_ssgd"]]
    return (
        f"- {row['model']} on {row['data']}: {row['run']} ends at {row['test_accuracy']:.4f} ± "
        f"{row['accuracy_std']:.4f} ({row['seeds']} seeds), {row['minus_ssgd']:+.4f} from ssgd's "
        f"{ssgd['test_accuracy']:.4f} ± {ssgd['accuracy_std']:.4f} (95% interval of the paired "
        f"difference {row['minus_ssgd_ci']}): **{row['same_as_ssgd']}**, {said}."
    )


def result_accuracy(results: Path, size: str) -> str:
    rows = figure_accuracy.compute(results, size)
    out = [output.markdown(rows, figure_accuracy.COLUMNS)]
    out.append(
        "The same-accuracy rule: the difference of the final test accuracy to ssgd's, paired "
        "by seed, has a 95% interval (Student's t over the seeds) within ±"
        f"{figure_accuracy.SAME:g} (one point): **same**; wholly outside it: **differs**; "
        "otherwise **undecided**. ssgd, ddp and cdc compute the same update from the same "
        "samples at the same rate (only the order of float sums differs), so a difference "
        "between them is the float order's, or a different tuned rate; asgd applies gradients "
        "K - 1 steps stale.\n"
    )
    for where in dict.fromkeys((r["data"], r["model"]) for r in rows):
        mine = [r for r in rows if (r["data"], r["model"]) == where]
        ssgd = next((r for r in mine if r["run"] == "ssgd"), None)
        if ssgd is None:
            continue
        out.append(
            f"- {where[1]} on {where[0]}: the seed-to-seed standard deviation of the final "
            f"accuracy is {ssgd['accuracy_std']:.4f} for ssgd, "
            + ", ".join(f"{r['run']} {r['accuracy_std']:.4f}" for r in mine if r["run"] != "ssgd")
            + "."
        )
        for r in mine:
            if r["run"] != "ssgd" and r["minus_ssgd_ci"]:
                out.append(accuracy_sentence(r, ssgd))
    return "\n".join(out) + "\n"


def result_to_accuracy(results: Path, size: str) -> str:
    rows = table_to_accuracy.compute(results, size)
    out = [output.markdown(rows, table_to_accuracy.COLUMNS)]
    out.append(
        f"The target of a seed is {100 * table_to_accuracy.TARGET:.0f}% of ssgd's final test "
        "accuracy at that seed, the same for every algorithm; the time is the training wall "
        "time of the first evaluation at or above it (evaluations every 5 steps; evaluation "
        "time kept out). Reductions are per seed, mean [95% interval over the seeds that both "
        "reached the target]. Only cdc at r = 2 runs here; whether an r without coding is "
        "faster still is Table 1's question.\n"
    )
    try:  # Table 1's finding, on the same data: is an r without coding faster still?
        data = figure_accuracy.data_name(table_time.runs(results, size)[0])
        uncoded = {(r["model"], data): not_coding(r) for r in table_time.compute(results, size)}
    except MissingResults:
        uncoded = {}
    for row in rows:
        if not row["run"].startswith("cdc"):
            continue
        where = f"{row['model']} on {row['data']}"
        faster = uncoded.get((row["model"], row["data"]))
        if not row["reached"]:
            out.append(f"- {where}: cdc never reached the target in {row['seeds']} seeds.")
            continue
        parts = []
        for base in ("ssgd", "asgd"):
            s = row["_stats"].get(base)
            if not s:
                continue
            paper = row[f"paper_less_than_{base}_pct"]
            names = " and ".join(name for name, *_ in faster or [])
            said = by_coding(
                verdict(s["mean"], paper, s["lo"], s["hi"]) if paper else "",
                faster,
                f", **but not by coding** (Table 1: {names} is faster than any coded r)",
            )
            here = f"{s['mean']:.1f}%" if s["mean"] >= 0 else f"{-s['mean']:.1f}% *more*"
            parts.append(
                f"{here} less time than {base.upper()} to the target"
                + (f" (the paper: {paper:.2f}%): {said}" if paper else "")
            )
        for base in ("ssgd", "asgd"):
            other = next(
                (
                    x
                    for x in rows
                    if (x["data"], x["model"], x["run"]) == (row["data"], row["model"], base)
                ),
                None,
            )
            if other is not None and not other["reached"]:
                parts.append(
                    f"{base.upper()} never reached it (0 of {other['seeds']} seeds): no "
                    "reduction against it"
                )
        ddp = row["_stats"].get("ddp")
        if ddp:
            band = f" [{ddp['lo']:.2f}, {ddp['hi']:.2f}]" if ddp["lo"] is not None else ""
            parts.append(f"{ddp['mean']:.2f}×{band} DDP's time to it")
        out.append(
            f"- {where}: cdc reaches {row['target']:.3f} in {row['to_target_s']:.1f} s "
            f"({row['reached']} of {row['seeds']} seeds, median); " + "; ".join(parts) + "."
        )
    return "\n".join(out) + "\n"


def result_tuning(results: Path, size: str) -> str:
    table, columns = tuning.grid_table(tuning.compute(results, size))
    out = [output.markdown(table, columns)]
    chosen = tuning.picks(results, size)
    out.append(
        "Held-out accuracy (a fifth of the training samples, `dataset.validation=0.2`; the "
        "test set unseen) after the accuracy runs' steps at seed 0; `*` marks each "
        "algorithm's pick, the best of its grid (asgd's grid twice: with momentum 0.9 and "
        "without, the usual remedy for K - 1 stale steps adding up). Figure 4 and Table 1b run "
        "at these picks: "
        + "; ".join(
            f"{m} {a} lr {p['lr']:g}" + (f" momentum {p['momentum']:g}" if a == "asgd" else "")
            for (m, a), p in sorted(chosen.items())
        )
        + "."
    )
    return "\n".join(out) + "\n"


def result_bandwidth(results: Path, size: str) -> str:
    rows, columns = figure_bandwidth.compute(results, size)
    out = [output.markdown(rows, columns)]
    grid = figure_bandwidth.grid(results, size)
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = sorted((r for r in rows if r["model"] == model), key=lambda r: r["mbit_s"])
        best = [r["best_r"] for r in mine]
        if len(set(best)) == 1:
            trend = (
                f"the best r stays at {best[0]} over the whole range swept; the cross-over lies "
                "outside it"
            )
        elif all(a >= b for a, b in itertools.pairwise(best)):
            trend = "the best r rises as the links get slower, as the trade-off predicts"
        else:
            trend = "the best r does not move steadily with the rate here (noise, or a tie)"
        out.append(
            f"- {model}: best r "
            + ", ".join(f"{r['best_r']} at {r['mbit_s']:g} Mbit/s" for r in mine)
            + f": {trend}."
        )
        rates = grid[model]
        slow, fast = min(rates), max(rates)
        lo, hi = min(rates[fast]), max(rates[fast])
        if lo != hi:
            extra = 1e3 * (rates[fast][hi]["time_s"]["map"] - rates[fast][lo]["time_s"]["map"])
            K = rates[fast][lo]["n_workers"]
            gathered = [1e3 * run["time_s"]["params"] for r, run in rates[slow].items() if r < K]
            theta = (
                f"; the all-gather of θ ({min(gathered):.0f}–{max(gathered):.0f} ms at "
                f"{slow:g} Mbit/s) is paid at every r < K and not at r = K = {K}, where every "
                "worker updates all of θ itself"
                if gathered
                else ""
            )
            out.append(
                f"  Going from r = {lo} to r = {hi} costs {extra:.0f} ms more computing per step "
                f"and saves the shuffle, {1e3 * rates[slow][lo]['time_s']['shuffle']:.0f} ms at "
                f"{slow:g} Mbit/s and {1e3 * rates[fast][lo]['time_s']['shuffle']:.0f} ms at "
                f"{fast:g} Mbit/s{theta}."
            )
    return "\n".join(out) + "\n"


def apart(a: dict, b: dict) -> int:
    """Whether run ``a``'s steps are faster than ``b``'s beyond the spread of one run: ``1``
    where ``a``'s interquartile range over its steps lies wholly below ``b``'s, ``-1`` wholly
    above, ``0`` where they overlap (within noise).

    >>> apart({"p25_ms": 50, "p75_ms": 55}, {"p25_ms": 58, "p75_ms": 62})
    1
    >>> apart({"p25_ms": 50, "p75_ms": 60}, {"p25_ms": 58, "p75_ms": 62})
    0
    """
    if None in (a.get("p25_ms"), a.get("p75_ms"), b.get("p25_ms"), b.get("p75_ms")):
        return 0
    if a["p75_ms"] < b["p25_ms"]:
        return 1
    if a["p25_ms"] > b["p75_ms"]:
        return -1
    return 0


def pays(cm: dict, ddp: dict, cd: dict | None) -> str:
    """Whether coding as multicast pays on a topology, from one run each: only where its
    steps' interquartile range lies below DDP's and below the same shuffle's over TCP."""
    against = [("DDP", apart(cm, ddp))] + (
        [("the same shuffle over TCP", apart(cm, cd))] if cd else []
    )
    if all(v == 1 for _, v in against):
        return (
            "**pays** here: its steps' interquartile range lies below DDP's and below the same "
            "shuffle's over TCP."
        )
    faster = [name for name, v in against if v == 1]
    slower = [name for name, v in against if v == -1]
    noise = [name for name, v in against if v == 0]
    parts = []
    if faster:
        parts.append(f"it is faster than {' and '.join(faster)} beyond the steps' spread")
    if noise:
        parts.append(
            f"within noise of {' and '.join(noise)} (their steps' interquartile ranges overlap)"
        )
    if slower:
        parts.append(f"slower than {' and '.join(slower)}")
    verdict_word = "**does not pay**" if slower else "is **within noise**"
    return f"{verdict_word} here: {'; '.join(parts)}."


def result_topology(results: Path, size: str) -> str:
    """Where coding pays: every topology's fastest runs, and the paper's claim on each."""
    rows = figure_topology.compute(results, size)
    out = [output.markdown(rows, figure_topology.COLUMNS)]
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


def result_hybrid(results: Path, size: str) -> str:
    """What the hybrid shuffle adds to the paper (closed forms of the families the runs use)."""
    rows = figure_hybrid.compute()
    shown = ["r", "hybrid_m", "coded_bus", "summed_bus", "hybrid_bus", "best_switch", "best_bus"]
    out = [output.markdown(rows, shown)]
    five = next(x for x in rows if x["r"] == 5)
    out.append(
        f"- CDC codes single sub-batch gradients and never adds them, so its traffic grows like "
        f"C(K-1, r): at K = {figure_hybrid.K}, r = 5 its packets carry {five['coded_bus']:.1f} "
        f"units of d/{figure_hybrid.K} on a shared medium, more than the summed shuffle's "
        f"{five['summed_bus']:.1f}. The hybrid codes over pre-added parts in groups of "
        f"m + 1 = {five['hybrid_m'] + 1} and carries {five['hybrid_bus']:.1f}: "
        f"{five['hybrid_vs_coded_bus']:.2f}x CDC's and {five['hybrid_vs_summed_bus']:.2f}x the "
        "summed shuffle's. No receiver gets less than the summed shuffle's (K - r)/K, so on a "
        "switch the hybrid ties it at best; it wins where sending is the cost (a bus)."
    )
    return "\n".join(out) + "\n"


def result_stragglers(results: Path, size: str) -> str:
    """Not waiting for stragglers: what a slow worker and stalls cost each algorithm, what
    not waiting buys back, at what price in bytes, and that no bit changed."""
    rows = figure_stragglers.compute(results, size)
    shown = [
        "model",
        "run",
        "straggle",
        "step_ms",
        "p95_ms",
        "mean_ms",
        "vs_clean",
        "vs_ddp",
        "predicted_mean_ms",
        "mean_vs_predicted",
        "same_bits_as_clean",
    ]
    out = [output.markdown(rows, shown)]

    def find(model, run, straggle):
        return next(
            (x for x in rows if (x["model"], x["run"], x["straggle"]) == (model, run, straggle)),
            None,
        )

    for model in dict.fromkeys(x["model"] for x in rows):
        cdc = sorted({x["run"] for x in rows if x["model"] == model and x["run"].startswith("cdc")})
        tolerant = [run for run in cdc if not run.endswith("s=0")]
        ddp = find(model, "ddp", "slow")
        slow = [find(model, run, "slow") for run in tolerant]
        slow = [x for x in slow if x]
        if ddp and slow:
            best = min(slow, key=lambda x: x["step_ms"])
            waiting = find(model, best["run"].rsplit(" ", 1)[0] + " s=0", "slow")
            line = (
                f"- **{model}, one slow worker**: DDP takes {ddp['step_ms']:.0f} ms a step "
                f"({ddp['vs_clean']:.2f}x its own without it); {best['run']} takes "
                f"{best['step_ms']:.0f} ms ({best['vs_clean']:.2f}x its own, "
                f"{best['vs_ddp']:.2f}x DDP's)"
            )
            if waiting:
                line += f", where waiting for every map took {waiting['step_ms']:.0f} ms"
            out.append(line + ".")
        for run in tolerant:
            clean, zero = (
                find(model, run, "none"),
                find(model, run.rsplit(" ", 1)[0] + " s=0", "none"),
            )
            if clean and zero:
                out.append(
                    f"  - {run} with no straggler: {clean['step_ms']:.0f} ms against "
                    f"{zero['step_ms']:.0f} ms waiting for every map "
                    f"({clean['step_ms'] / zero['step_ms']:.2f}x): the cost of watching."
                )
        stalls = [x for x in rows if x["model"] == model and x["straggle"] == "stall"]
        judged = [x for x in stalls if x["mean_vs_predicted"] is not None]
        if judged:
            within = [x["run"] for x in judged if abs(x["mean_vs_predicted"] - 1) <= 0.2]
            out.append(
                f"  - Stalls (p = 0.1, 500 ms): the mean step is within 20% of the "
                f"order-statistics prediction for {len(within)} of {len(judged)} runs"
                + (
                    "; not for "
                    + ", ".join(
                        f"{x['run']} ({x['mean_vs_predicted']:.2f}x)"
                        for x in judged
                        if x["run"] not in within
                    )
                    if len(within) < len(judged)
                    else ""
                )
                + "."
            )
    changed = [x for x in rows if x["run"].startswith("cdc") and x["same_bits_as_clean"] is False]
    out.append(
        "- Not waiting changed no bit: every cdc run's `param_sha256` equals the same run's "
        "without stragglers, so its accuracy is unchanged."
        if not changed
        else f"- **Bits changed** in {len(changed)} cdc runs: a bug."
    )
    out.append(
        "- What a slow worker costs cdc when it is not waited for: the plain values it is sent "
        "for its own segment, `C(K-1, r-1)/K · d` more into its link than the usual exchange, "
        "and its own (slow) reduce and update. Where the step is its exchange (the dnn at "
        "100 Mbit/s) that transfer can cost what the wait saved; where it is compute (the cnn) "
        "not waiting pays."
    )
    return "\n".join(out) + "\n"


def _two_cores(every: list, cal) -> str:
    """What sharing two cores does to the compute side, and why the links' rate was chosen."""
    from dataclasses import replace

    from dcoded.predict import predict, scenario_of

    plain = [
        r
        for r in every
        if r["algorithm"] == "cdc"
        and r["redundancy"] == 1
        and figure_scaling.network_of(r.summary) == "switch"
        and r["group_size"] == r["n_workers"]
    ]
    ddp = [
        r
        for r in every
        if r["algorithm"] == "ddp" and figure_scaling.network_of(r.summary) == "switch"
    ]
    if not plain or not ddp:
        return ""
    lo = min(plain, key=lambda r: (r["n_workers"], r["time_s"]["map"]))
    hi = max(plain, key=lambda r: (r["n_workers"], -r["time_s"]["map"]))
    big = max(ddp, key=lambda r: r["n_workers"])
    shared = predict(scenario_of(big.summary), cal)
    alone = predict(replace(scenario_of(big.summary), cores=None), cal)
    rate = big.summary["environment"]["netem"]["bandwidth_mbit"]
    return (
        f"- The two cores: at r = 1 on the switch a worker's map takes "
        f"{1e3 * lo['time_s']['map']:.0f} ms at K = {lo['n_workers']} and "
        f"{1e3 * hi['time_s']['map']:.0f} ms at K = {hi['n_workers']}, with "
        f"{hi['n_workers'] // lo['n_workers']}x fewer samples each: the K processes take turns "
        "on two cores, and each spends CPU per step and per sub-batch whatever it computes. The "
        f"model's compute term for DDP at K = {big['n_workers']} is "
        f"{1e3 * shared.compute_s:.0f} ms here and {1e3 * alone.compute_s:.1f} ms on a machine "
        f"per worker. The links run at {rate:g} Mbit/s so that at K = {big['n_workers']} the "
        f"exchange still outweighs that: DDP's bound is {1e3 * shared.bound_s:.0f} ms."
        + "".join(
            f" cdc {r['shuffle']} at r = {r['redundancy']}, K = {r['n_workers']}: map (with what "
            "of the exchange overlaps it) "
            f"{1e3 * r['time_s']['map']:.0f} ms, shuffle and gather "
            f"{1e3 * (r['time_s']['shuffle'] + r['time_s']['params']):.0f} ms"
            + (
                " (the map outweighs the rest)."
                if r["time_s"]["map"] > r["time_s"]["shuffle"] + r["time_s"]["params"]
                else "."
            )
            for r in _largest(every, big["n_workers"])
        )
    )


def _largest(every: list, K: int) -> list:
    """The summed shuffle at every r on the switch at ``K`` (g = K), in r's order."""
    return sorted(
        (
            r
            for r in every
            if r["algorithm"] == "cdc"
            and r["n_workers"] == K
            and r["group_size"] == K
            and r["shuffle"] == "summed"
            and figure_scaling.network_of(r.summary) == "switch"
        ),
        key=lambda r: r["redundancy"],
    )


def result_scaling(results: Path, size: str) -> str:
    """How the trade-off moves with K: measured to 16 beside bound and model, predicted past."""
    from dcoded.predict import Calibration, stated_error

    cal = Calibration.load()
    measured = figure_scaling.runs(results, size)  # read once for the table and the text
    every = figure_scaling.measured_rows(measured, cal)
    best = figure_scaling.best_rows(every)
    out = []
    cdc = [x for x in best if x["scheme"] != "ddp"]
    pivot = []
    for network in figure_scaling.NETWORK_ORDER:
        for K in sorted({x["K"] for x in best if x["network"] == network}):
            here = [x for x in cdc if (x["network"], x["K"]) == (network, K)]
            ddp = next(
                (x for x in best if (x["network"], x["K"], x["scheme"]) == (network, K, "ddp")),
                None,
            )
            if not here:
                continue
            top = min(here, key=lambda x: x["step_ms"])
            pivot.append(
                {
                    "network": network,
                    "K": K,
                    "ddp_ms": ddp["step_ms"] if ddp else None,
                    "ddp_bound_ms": ddp["bound_ms"] if ddp else None,
                    "best_cdc": f"{top['scheme']} r={top['r']}",
                    "cdc_ms": top["step_ms"],
                    "cdc_bound_ms": top["bound_ms"],
                    "cdc_over_ddp": top["vs_ddp"],
                }
            )
    out.append(
        output.markdown(
            pivot,
            [
                "network",
                "K",
                "ddp_ms",
                "ddp_bound_ms",
                "best_cdc",
                "cdc_ms",
                "cdc_bound_ms",
                "cdc_over_ddp",
            ],
        )
    )
    out.append(
        "Every scheme at every K, at its fastest r: `tables/fig9_scaling.md`; every run: "
        "`tables/fig9_every_run.md`."
    )
    for network in figure_scaling.NETWORK_ORDER:
        mine = [x for x in pivot if x["network"] == network]
        if not mine:
            continue
        wins = [x["K"] for x in mine if x["cdc_over_ddp"] is not None and x["cdc_over_ddp"] < 1]
        first, last = mine[0], mine[-1]
        line = (
            f"- **{network}**: from K = {first['K']} to {last['K']}, DDP's step goes from "
            f"{first['ddp_ms']:.0f} to {last['ddp_ms']:.0f} ms and cdc's best from "
            f"{first['cdc_ms']:.0f} ({first['best_cdc']}) to {last['cdc_ms']:.0f} ms "
            f"({last['best_cdc']}); cdc's best is "
        )
        line += (
            f"faster than DDP at K = {', '.join(map(str, wins))}."
            if wins
            else "slower than DDP at every K measured."
        )
        out.append(line)
    out.append(_two_cores(measured, cal))
    for x in figure_scaling.failures(results, size):
        out.append(f"- failed, not in the table: `{x['experiment']}` {x['run']}: {x['error']}")
    rows = every
    costs = {f: c for f, c in cal.costs.items() if cal.fitted_on.get("runs", {}).get(f)}
    out.append("")
    out.append(
        "**The model** (`python -m dcoded.predict`): a step is compute + link time + messages + "
        "per-step costs, from the configuration alone. Compute: one worker's rate measured here "
        f"({cal.compute['dnn']['samples_per_s']:,.0f} samples/s and "
        f"{1e3 * cal.compute['dnn']['per_call_s']:.2f} ms a call, one torch thread, "
        "`--measure-rate`), times K / cores on this shared machine. Link time: the communication "
        "bound of every phase on the topology. Fitted once per family on the runs at K = "
        f"{', '.join(str(k) for k in sorted({x['K'] for x in rows if not x['held_out']}))} "
        f"(K = {', '.join(map(str, figure_scaling.HELD_OUT_K))} held out):"
    )
    for family, c in costs.items():
        out.append(
            f"  - {family} ({cal.fitted_on['runs'][family]} runs): link time "
            f"{c.link_overhead:.2f}x the bound, {1e3 * c.per_message_s:.3f} ms a message, "
            f"{1e3 * c.per_sub_batch_s:.2f} ms a sub-batch beyond its gradient, "
            f"{1e3 * c.per_step_cpu_s:.1f} ms of each worker's CPU a step, "
            f"{1e3 * c.per_step_s:.1f} ms a step"
        )

    groups: dict[tuple, list[float]] = {}
    for x in rows:
        # the model's own family (multicast on racks is held to an error of its own)
        mc_racks = x["family"] == "cdc-multicast" and x["topology"] == "racks"
        key = (x["family"], mc_racks, x["held_out"])
        groups.setdefault(key, []).append(abs(x["error_pct"]))
    for (family, mc_racks, held), errors in sorted(groups.items()):
        errors.sort()
        limit = stated_error(family, "racks" if mc_racks else "switch", held)
        out.append(
            f"  - {family}{' on racks' if mc_racks else ''}, "
            f"{'held-out K' if held else 'fitted K'}: median {errors[len(errors) // 2]:.1f}%, "
            f"worst {errors[-1]:.1f}% over {len(errors)} runs (held to {limit:g}%; the target "
            f"set for the model was {20 if not held else 25}%: "
            + ("met)" if errors[-1] <= (25 if held else 20) else "**missed**)")
        )
    out.append(
        "  A test keeps every run within the error stated for it (`tests/test_predict.py`). "
        "Multicast on racks is worst: its paced senders overrun the shared uplinks, and the "
        "runs repaired thousands of datagrams (`repaired_datagrams`), which no term models."
    )
    pred = figure_scaling.predicted_rows(cal)
    cross = figure_scaling.crossovers(pred)
    out.append("")
    out.append(
        "**Past one machine (Figure 10, predicted, not measured).** K = 16..1024; per worker: "
        + "; ".join(
            f"{name}: {w['samples_per_s']:,.0f} samples/s, {w['per_worker_batch']} samples a step"
            for name, w in figure_scaling.WORKLOADS.items()
        )
        + " (a GPU worker's order of magnitude, assumed); racks of 32 behind 4:1 uplinks, a fat "
        "tree of such racks 8 to a pod, 4:1 again to the core; DDP's buckets of 25 MB overlap "
        "the backward pass; the software costs are those fitted here, on Dask and two shared "
        "cores, so the per-message and per-step terms are this machine's, not a data centre's; "
        "no measured run shares these rates and sizes (they are at 25 Mbit/s, d = 0.1 M), so "
        "none is drawn in Figure 10. "
        "The least K at which cdc's best layout is predicted faster than DDP:"
    )
    out.append("")
    out.append(
        output.markdown(
            cross, ["workload", "network", "gbit", "first_K_cdc_wins", "cdc_over_ddp_at_1024"]
        )
    )
    return "\n".join(out) + "\n"


SECTIONS = [
    (
        "Tuning: every algorithm's learning rate, from the same grid",
        tuning.GRIDS,
        result_tuning,
        [],
    ),
    (
        "Result 1 (Table 1): training time",
        ("paper_time", "paper_time_ddp", "paper_phases"),
        result_time,
        [],  # its phases are Figure 3, shown with Result 3
    ),
    (
        "Result 1b (Table 1b): time to a target accuracy",
        figure_accuracy.EXPERIMENTS,
        result_to_accuracy,
        [],
    ),
    (
        "Result 2 (Figure 2): communication per worker against r",
        ("paper_loads",),
        result_loads,
        ["fig2_loads.png"],
    ),
    (
        "Result 3 (Figure 3): time per step by phase",
        ("paper_time", "paper_phases"),
        result_phases,
        ["fig3_phases.png"],
    ),
    (
        "Result 4 (Figure 4): accuracy against wall time, five seeds",
        figure_accuracy.EXPERIMENTS,
        result_accuracy,
        ["fig4_accuracy.png"],
    ),
    (
        "Result 5 (Figure 5): the best r against bandwidth",
        ("paper_bandwidth",),
        result_bandwidth,
        ["fig5_bandwidth.png"],
    ),
    (
        "Beyond the paper (Figure 6): where coding pays, by topology",
        ("paper_topology", "paper_topology_base"),
        result_topology,
        ["fig6_topology.png"],
    ),
    (
        "Beyond the paper (Figure 7): a coded shuffle that also sums",
        (),
        result_hybrid,
        ["fig7_hybrid.png"],
    ),
    (
        "Beyond the paper (Figure 8): not waiting for stragglers",
        ("paper_stragglers", "paper_stragglers_base"),
        result_stragglers,
        ["fig8_stragglers.png"],
    ),
    (
        "Beyond the paper (Figures 9 and 10): how the trade-off moves as K grows",
        figure_scaling.SWEEPS,
        result_scaling,
        ["fig9_scaling.png", "fig10_predicted.png"],
    ),
]


def _missing(results: Path, size: str, experiments) -> str | None:
    for e in experiments:
        if e in paths.BEYOND and not paths.sweep_dir(results, size, e).exists():
            return (
                f"not run: `{e}` is a study beyond the paper, left out of `make paper`; "
                "`make paper BEYOND=1` runs it"
            )
        skipped = paths.sweep_dir(results, size, e) / SKIPPED
        if skipped.exists():
            return f"not run: `{e}` needs the emulated network (`cluster=netem`)"
        try:
            meta(results, size, e)
        except MissingResults as err:
            return f"not run: {err}"
    return None


def main(results: Path = paths.RESULTS, size: str = "small", out: Path = paths.OUTPUT) -> None:
    parts = [
        "# dcoded: reproducing Li et al. 2021 (CDC-SSGD)",
        "",
        f"Generated by `python -m paper.draw --size {size}` on "
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC from `paper/results/{size}/`; do "
        "not edit by hand. The paper: LI Bowen et al., *A Synchronized Gradient Descent Algorithm "
        "Based on Distributed Coding*, Computer Engineering 47(4), 2021. Its claims: with a "
        "suitable redundancy, CDC-SSGD trains a DNN / a CNN in 53.97% / 26.89% less time than "
        "SSGD and 39.11% / 26.37% less than ASGD, at the same accuracy.",
        "",
        "## Conditions",
        "",
    ]
    try:
        parts.append(conditions(results, size))
    except MissingResults as e:
        parts.append(f"not known: {e}")
    sweeps = provenance(results, size)
    if sweeps:
        parts += ["", "Every sweep read, the commit it ran at:", "", sweeps]
    for title, experiments, body, figures in SECTIONS:
        parts += ["", f"## {title}", ""]
        missing = _missing(results, size, experiments)
        if missing:
            parts.append(missing)
            continue
        parts.append(body(results, size))
        parts += [f"![{f}](figures/{f})" for f in figures]
    parts += [
        "",
        "## What differs from the paper's setting",
        "",
        "- The paper ran on a physical cluster; here K workers share one machine's cores and "
        "the network is emulated with rate-capped links (no latency or loss is added). Redundant "
        "computation is therefore dearer here, and communication is exactly as slow as the "
        "rate says.",
        "- The paper's exact model sizes, cluster size and bandwidth are not in its abstract; "
        "the conditions above are ours and every one is an override away "
        "(`conf/experiment/paper_*.yaml`).",
        "- Table 1's times are for a fixed number of steps on the same samples; Table 1b's are "
        "to a target accuracy, the paper's sense of training time.",
        "",
        "## What changed since the first report",
        "",
        "- cdc's exchange runs over a direct data plane (`transport=direct`, the default): one "
        "Dask task per worker for every run of steps between evaluations, checkpoints and "
        "record pulls, and packets and segments pushed worker to worker over Dask comms opened "
        "once per run. The first report measured a per-step futures graph (about 20 tasks, 24 "
        "fetches and 3 scheduler hops a step) whose exchanges took 2-2.7x their bytes at the "
        "link rate; `transport=dask` keeps that graph as the reference, with the same bits.",
        "- At r = K every worker computes the whole batch and updates all of θ itself: nothing "
        "is sent (the first report still gathered θ there).",
        "- Every shaped queue holds 20 ms of traffic (`cluster.queue_ms`), not 100 ms: deep "
        "queues made every control message wait 30-40 ms behind data.",
        "- The uncoded shuffle's senders are balanced (each sends C(K-1, r) values; the lowest "
        "holder used to send 6/4/2/0 at K = 4, r = 2).",
        "- Figure 6 is new: the same code on a switch, a bus and racks, with the coded packets "
        "sent once as UDP multicast (`transport=multicast`).",
        "- Figure 8 is new: the same redundancy used a second time, a step that does not wait "
        "for its r - 1 slowest workers (`coding.stragglers`), bit for bit, beside DDP and the "
        "parameter servers under the same injected stragglers (`straggle`).",
        "- Figures 9 and 10 are new: the step against K = 4..16 on every topology beside its "
        "bound and the calibrated model (`python -m dcoded.predict`), and the model alone to "
        "K = 1024.",
        "- The paper's claims are judged on more than one run: Table 1 on three seeds (each "
        'reduction with its 95% interval, and "within noise" where the interval holds 0), '
        'Figure 4 and Table 1b on five, with a stated rule for "same accuracy"; Figure 6\'s '
        '"pays" needs the steps\' interquartile ranges apart. The first report judged the '
        "CNN's accuracy claim by one seed's 0.015, about the seed-to-seed spread. Figures 8 to "
        "10 still rest on one run each.",
        "- Every algorithm runs at its own learning rate, picked from the same grid on a "
        "held-out split (the tuning section); the first report ran all at 0.05, which left "
        "asgd's CNN at 0.24.",
        "- Table 1b is new: the time to a target accuracy, the paper's sense of training time.",
        "- DDP is run as one who knows it would: with buckets small enough to overlap the "
        "backward pass as well as with torch's default, and compared at the faster.",
        "- Figure 4 runs on the bundled handwritten digits as well as on MNIST-sized "
        "synthetic data.",
        "- `make paper` leaves the studies beyond the paper (Figures 6 to 10) out; `make paper "
        "BEYOND=1` runs them too.",
    ]
    target = paths.report(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(target, "\n".join(parts) + "\n")


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.report"))
