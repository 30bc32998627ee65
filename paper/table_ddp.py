"""DDP as users run it: dcoded's ``algorithm=ddp`` beside a plain ``torchrun`` DDP script.

Every "x DDP" ratio in the report is against dcoded's DDP; a referee asks whether that DDP is
as fast as DDP run the usual way. Stage 1 runs :mod:`paper.ddp_plain` (``--compare``): the
plain script and ``python -m dcoded algorithm=ddp`` of the same model (the dnn), batch,
optimizer and threads, alternately, on this host's loopback, and writes both medians of every
run. This table pairs them by run: the ratio dcoded / plain per pair, its mean and 95%
interval, and which way a gap leans the other tables' "x DDP" ratios.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from dcoded.results import interval
from paper import output, paths
from paper.table_time import ci

#: Where stage 1 writes the comparison, under ``paper/results/<size>/``.
NAME = "ddp_plain"
RECORD = "compare.json"
#: The issue's bar: within this fraction of the plain script, DDP is DDP as users run it.
WITHIN = 0.05

TITLE = "DDP as users run it: dcoded's DDP beside a plain torchrun script"
READS = ()
FIGURES = ()
COLUMNS = ["run", "plain_ms", "dcoded_ms", "dcoded_over_plain"]


def record_path(results: Path, size: str) -> Path:
    return Path(results) / size / NAME / RECORD


def read(results: Path, size: str) -> dict | None:
    f = record_path(results, size)
    return json.loads(f.read_text()) if f.exists() else None


def compute(record: dict) -> tuple[list[dict], dict]:
    """``(rows, verdict)``: a row per alternating pair, and the ratio's interval over them."""
    pairs = list(zip(record["plain_ms"], record["dcoded_ms"], strict=True))
    rows = [
        {"run": i, "plain_ms": p, "dcoded_ms": q, "dcoded_over_plain": q / p}
        for i, (p, q) in enumerate(pairs)
    ]
    ratio = interval([r["dcoded_over_plain"] for r in rows])
    plain = statistics.median(record["plain_ms"])
    dcoded = statistics.median(record["dcoded_ms"])
    lo, hi = ratio["lo"], ratio["hi"]
    if lo is not None and lo >= 1 - WITHIN and hi <= 1 + WITHIN:
        said = f"**within {100 * WITHIN:.0f}%**: dcoded's DDP is DDP as users run it"
    elif lo is not None and hi < 1:
        said = (
            '**dcoded\'s DDP is faster** than the plain script beyond noise: every "x DDP" '
            "ratio in this report is against the faster of the two, so it leans against cdc"
        )
    elif lo is not None and lo > 1:
        said = (
            '**dcoded\'s DDP is slower** than the plain script beyond noise: every "x DDP" '
            "ratio in this report leans towards cdc by as much"
        )
    else:
        said = (
            f"**within noise but not shown within {100 * WITHIN:.0f}%**: the interval holds "
            "1 and reaches past the bar; more runs would settle it"
        )
    return rows, {
        "plain_ms": plain,
        "dcoded_ms": dcoded,
        "ratio": ratio,
        "said": said,
    }


def section(results: Path, size: str) -> str:
    record = read(results, size)
    if record is None:
        return (
            f"not run: `python -m paper.sweep --size {size} --only {NAME}` (or `make paper`) "
            "runs it"
        )
    rows, v = compute(record)
    r = v["ratio"]
    interval_text = ci(r["lo"], r["hi"], 3) or "one run: no interval"
    return "\n".join(
        [
            f"The same MLP (d = 109,386), B = {record['batch']} over K = {record['workers']} "
            f"ranks, gloo on loopback, one torch thread each, SGD with momentum, "
            f"{record['steps']} steps (the first {record['warmup']} left out); "
            f"`python paper/ddp_plain.py --compare --runs {len(rows)} --steps {record['steps']}`"
            ", the two run in turn. Each time is the median step, the slowest rank's.",
            "",
            f"- median over {len(rows)} runs: plain torchrun DDP {v['plain_ms']:.2f} ms a step, "
            f"dcoded `algorithm=ddp` {v['dcoded_ms']:.2f} ms",
            f"- dcoded / plain, paired by run: {r['mean']:.3f} {interval_text}; {v['said']}",
            "- this host's loopback, not the emulated links: what it settles is dcoded's own "
            "overhead around DDP (its Dask tasks, the step's timing), not the network's",
            "",
            output.markdown(rows, COLUMNS),
        ]
    )


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    record = read(results, size)
    if record is None:
        print(f"{TITLE}: not run", file=sys.stderr)
        return
    rows, _ = compute(record)
    output.write_table(rows, COLUMNS, paths.tables(out) / "ddp_plain", TITLE)


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.table_ddp"))
