"""The report's first section: one screen of where coding pays here, by how much against DDP,
and where it does not (by model, network, K and straggler), each with its interval and the
table or figure behind it.

Every line is computed from the same results and by the same functions as the section it
points to (nothing is restated by hand); a part whose sweeps have not run says so. A ratio to
DDP is judged by its 95% interval over the seeds: wholly below 1, cdc is faster; wholly
above, slower; else the seeds cannot tell them apart.
"""

from __future__ import annotations

from pathlib import Path

from dcoded.topology import EMULATED
from paper import (
    figure_scaling,
    figure_stragglers,
    figure_topology,
    table_ddp,
    table_time,
    table_to_accuracy,
)
from paper.results import MissingResults, seeded
from paper.verdicts import not_coding

TITLE = "Summary"


def judged(mean: float, lo: float | None, hi: float | None) -> str:
    """A ratio to DDP in words, by its interval.

    >>> judged(0.72, 0.67, 0.77), judged(1.19, 1.11, 1.26), judged(1.0, 0.9, 1.1)
    ('**faster** than DDP', '**slower** than DDP', 'not told apart from DDP')
    >>> judged(0.5, None, None)
    'faster than DDP (one seed: no interval)'
    """
    if lo is None or hi is None:
        return f"{'faster' if mean < 1 else 'slower'} than DDP (one seed: no interval)"
    if hi < 1:
        return "**faster** than DDP"
    if lo > 1:
        return "**slower** than DDP"
    return "not told apart from DDP"


def whose_saving(ends: list, best: dict) -> str:
    """What the uncoded ends (:func:`~paper.verdicts.not_coding`) say of cdc's ratio to DDP:
    a saving they beat beyond noise is not coding's.

    >>> print(whose_saving([("r = 1", "", False), ("r = K", "", False)], {"hi": 1.2}))
    ; r = 1 and r = K, where nothing is coded, are faster beyond noise
    >>> print(whose_saving([("r = 1", "", False)], {"hi": 0.8}))
    ; r = 1, where nothing is coded, is faster beyond noise: **the saving is not coding's**
    >>> whose_saving([], {"hi": 0.8})
    "; no uncoded r is faster beyond noise: **coding's saving**"
    """
    faster = [name for name, *_ in ends]
    saves = best.get("hi") is not None and best["hi"] < 1
    if faster:
        verb = "are" if len(faster) > 1 else "is"
        said = f"; {' and '.join(faster)}, where nothing is coded, {verb} faster beyond noise"
        return said + (": **the saving is not coding's**" if saves else "")
    return "; no uncoded r is faster beyond noise: **coding's saving**" if saves else ""


def table_1(results: Path, size: str) -> list[str]:
    """Per model: cdc at its best coded r, and the uncoded ends r = 1 and r = K, against DDP,
    paired by seed."""
    rows = table_time.compute(results, size)
    every = table_time.runs(results, size)
    by, first = seeded(every), every[0]
    net = (first["environment"].get("netem") or {}).get("bandwidth_mbit")
    where = f"a switch of {net:g} Mbit/s links" if net else "this host's loopback"
    scaled = "under the scale model" if first.summary.get("scale_model") else "on shared cores"
    out = []
    for row in rows:
        K, model = row["K"], row["model"]
        ddp = by[(model, row["ddp_run"])]

        def against(label, model=model, ddp=ddp):
            mine = by.get((model, label))
            return table_time.compare(mine, ddp, "ratio") if mine else None

        best = row["_stats"]["coded_over_ddp"]
        ends = {"r = 1": against("cdc r=1"), f"r = K = {K}": against(f"cdc r={K}")}
        whose = whose_saving(not_coding(row), best)
        out.append(
            f"- **{model}, K = {K}, {where}, {scaled}** (Table 1, {row['seeds']} seeds): cdc at "
            f"its best coded r = {row['coded_best_r']} takes {table_time.ratio(best)} DDP's time, "
            f"{judged(best['mean'], best['lo'], best['hi'])}{whose}. Without coding: "
            + ", ".join(f"{name} {table_time.ratio(s)}" for name, s in ends.items())
            + "."
        )
    return out


def table_1b(results: Path, size: str) -> list[str]:
    """Per data set and model: cdc's time to the target accuracy against DDP's."""
    out = []
    rows = table_to_accuracy.compute(results, size)
    ends_of = table_to_accuracy.uncoded_ends(results, size)
    for row in rows:
        s = row["_stats"].get("ddp")
        if not row["coded_best"] or not s:
            continue
        mine = [x for x in rows if (x["data"], x["model"]) == (row["data"], row["model"])]
        ends = {
            name: end["_stats"].get("ddp")
            for r, name in ((1, "r = 1"), (row["K"], f"r = K = {row['K']}"))
            if (end := table_to_accuracy.end_row(mine, r))
        }
        out.append(
            f"- **{row['model']} on {row['data']}, to {100 * table_to_accuracy.TARGET:.0f}% of "
            f"ssgd's final accuracy** (Table 1b, {row['reached']} of {row['seeds']} seeds "
            f"reached it): cdc at its best coded {row['run'].removeprefix('cdc ')} takes "
            f"{table_time.ratio(s)} DDP's time, {judged(s['mean'], s['lo'], s['hi'])}"
            + whose_saving(ends_of.get((row["data"], row["model"]), []), s)
            + (
                ". Without coding: "
                + ", ".join(f"{n} {table_time.ratio(e)}" for n, e in ends.items())
                if ends
                else ""
            )
            + "."
        )
    return out


def ddp_baseline(results: Path, size: str) -> list[str]:
    record = table_ddp.read(results, size)
    if record is None:
        return ["- DDP as users run it: not run in this build."]
    _, v = table_ddp.compute(record)
    return [
        f"- **The DDP every ratio is against** (DDP as users run it): dcoded's DDP takes "
        f"{table_time.ratio(v['ratio'], 3)} a plain torchrun script's step; {v['said']}."
    ]


def _against_ddp(s: dict, what: str) -> str:
    """``0.71× [0.68, 0.74] DDP's time, **faster** than DDP``: a ratio to DDP and its verdict."""
    return f"{table_time.ratio(s)} DDP's {what}, {judged(s['mean'], s['lo'], s['hi'])}"


def topologies(results: Path, size: str) -> list[str]:
    """Per topology (Figure 6): cdc's fastest coded layout against DDP, paired by seed."""
    rows = figure_topology.compute(results, size)
    out = []
    for where in EMULATED:
        coded = [
            x
            for x in rows
            if x["topology"] == where and x["algorithm"] == "cdc" and 1 < (x["r"] or 0) < x["K"]
        ]
        coded = [x for x in coded if x["_vs_ddp"] and x["_vs_ddp"].get("mean") is not None]
        if not coded:
            continue
        best = min(coded, key=lambda x: x["step_ms"])
        s = best["_vs_ddp"]
        out.append(
            f"- **{where}, {figure_topology.conditions([best])}** (Figure 6, {best['seeds']} "
            "seeds): cdc's "
            f"fastest coded layout ({best['shuffle']} shuffle, {best['transport']}, r = "
            f"{best['r']}) takes {_against_ddp(s, 'time')}."
        )
    return out


def stragglers(results: Path, size: str) -> list[str]:
    """Per straggler model (Figure 8): cdc not waiting for its r - 1 slowest against DDP."""
    rows = figure_stragglers.compute(results, size)
    said = figure_stragglers.conditions(results, size)
    out = []
    for x in rows:
        tolerant = x["run"].startswith("cdc") and not x["run"].endswith("s=0")
        s = x["_stats"]["vs_ddp"]
        if not tolerant or x["straggle"] == "none" or not s or s.get("mean") is None:
            continue
        what, _, terms = said.get(x["straggle"], x["straggle"]).partition(" (")
        terms = f"{terms.rstrip(')')}; " if terms else ""
        out.append(
            f"- **{x['model']}, {what}** (Figure 8, {terms}{said['where']}, {x['seeds']} "
            f"seeds): {x['run']}, not "
            f"waiting for its slowest, takes {_against_ddp(s, 'step')}."
        )
    return out


def scaling(results: Path, size: str) -> list[str]:
    """Per network (Figure 9): cdc's best layout against DDP at each K measured, paired by
    seed."""
    table = figure_scaling.best_rows(
        figure_scaling.measured_rows(figure_scaling.runs(results, size))
    )
    out = []
    for network in dict.fromkeys(x["network"] for x in table):
        best: dict[int, dict] = {}
        for x in table:
            if x["network"] == network and x["scheme"] != "ddp" and x["vs_ddp"] is not None:
                if x["K"] not in best or x["step_ms"] < best[x["K"]]["step_ms"]:
                    best[x["K"]] = x
        if best:
            seeds = max(x["seeds"] for x in best.values())
            out.append(
                f"- **K = {min(best)} to {max(best)}, {network}** (Figure 9, {seeds} "
                f"seed{'s' if seeds > 1 else ''}): cdc's best layout over DDP's step, "
                + "; ".join(
                    f"{table_time.ratio(x['_vs_ddp'])} at K = {K} (r = {x['best_r']}, "
                    f"{judged(x['_vs_ddp']['mean'], x['_vs_ddp']['lo'], x['_vs_ddp']['hi'])})"
                    for K, x in sorted(best.items())
                )
                + "."
            )
    return out


#: The parts in their order: (what it covers, the function that writes its lines).
PARTS = (
    ("Table 1", table_1),
    ("Table 1b", table_1b),
    ("the DDP baseline", ddp_baseline),
    ("Figure 6 (topologies)", topologies),
    ("Figure 8 (stragglers)", stragglers),
    ("Figure 9 (K)", scaling),
)


def section(results: Path, size: str) -> str:
    out = [
        "Where coding pays here, by how much against DDP, and where it does not: each ratio is "
        "cdc's time over DDP's, paired by seed, mean [95% interval]; the sections below hold "
        "every number and its conditions.",
        "",
    ]
    for what, part in PARTS:
        try:
            out += part(results, size)
        except MissingResults:
            out.append(f"- {what}: not run in this build")
    out.append(
        "- Figure 5 (the links' rate) is one run per configuration and is not summarised here; "
        "its section states what it shows."
    )
    return "\n".join(out)
