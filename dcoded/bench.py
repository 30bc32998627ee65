"""Side-by-side benchmark: ``python -m dcoded.bench`` (or ``make bench``).

On one emulated cluster (``cluster=netem``; ``--cluster local`` where there is no root) it runs
``ssgd``, ``asgd``, ``ddp`` and ``cdc`` at every redundancy (coded, and uncoded, summed and hybrid
where they differ), over each transport, for each model, on MNIST-sized synthetic data, then prints
its table: time per batch and per phase, each exchange phase beside its bound on the run's
topology, bytes per worker (measured multicast and unicast, what the transport moved, wire)
beside the closed forms, and every time as a ratio to ``ssgd`` and to ``ddp`` measured in the
same sweep. Speed is judged here, never by timed assertions in tests.

The runs are Hydra multiruns of three experiment files (Hydra sweeps products, and the bench's
runs are not one): ``bench`` (its conditions and the baselines), ``bench_cdc`` (``1 < r < K``,
every shuffle) and ``bench_cdc_ends`` (``r = 1`` and ``r = K``, the coded shuffle), each
``python -m dcoded -m experiment=<name> hydra.sweep.dir=<out> ...`` with the overrides the
flags ask for, all into one sweep folder; the table is then read from its jobs'
``summary.json`` and written beside them (``bench.md``, ``bench.csv``, ``bench.json``).
``--read SWEEP_DIR`` only reads, any sweep folder of those experiments (or of other runs with
the summaries it needs), and prints the table, writing nothing (``--out DIR`` writes it there
too), for instance one run by hand::

    python -m dcoded -m experiment=bench cluster=local hydra.sweep.dir=bench/mine
    python -m dcoded.bench --read bench/mine
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from dcoded import files
from dcoded.coding.helptext import help_text
from dcoded.coding.shuffles import SHUFFLES
from dcoded.results import PHASES, load_sweep, times
from dcoded.topology import TOPOLOGIES, phase_bounds

#: The experiment files of the bench, in the order it runs them (``conf/experiment/``).
EXPERIMENTS = ("bench", "bench_cdc", "bench_cdc_ends")
#: The bench's table in the sweep folder: ``bench.md``, ``bench.csv`` and ``bench.json``.
TABLE_STEM = "bench"
BASELINES = ("ssgd", "asgd", "ddp")

COLUMNS = [
    "topology",
    "model",
    "algorithm",
    "r",
    "shuffle",
    "transport",
    "straggle",
    "s",
    "steps",
    "repeats",
    "step_ms",
    "p25_ms",
    "p75_ms",
    "mean_ms",
    "p95_ms",
    "vs_clean",
    "vs_ssgd",
    "vs_ssgd_lo",
    "vs_ssgd_hi",
    "vs_ddp",
    "vs_ddp_lo",
    "vs_ddp_hi",
    "comm_bound_ms",
    "step_x",
    "predicted_ms",
    "predicted_err",
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


#: What ``bench.md`` leaves out of :data:`COLUMNS` (``bench.csv`` and ``bench.json`` have
#: them all), and :data:`SHOWN`, what it shows; a column no row has a value in is left out too.
CSV_ONLY = (
    "steps", "mean_ms", "encode_ms", "decode_ms", "update_ms", "multicast", "theory_multicast",
    "params", "dask", "moved", "wire", "shuffle_bound_ms", "params_bound_ms",
    "vs_ssgd_lo", "vs_ssgd_hi", "vs_ddp_lo", "vs_ddp_hi",
)  # fmt: skip
SHOWN = [c for c in COLUMNS if c not in CSV_ONLY]

#: Below the table: what its ratios to the bounds say, and what they do not.
NOTES = (
    "step_ms is the median step, p25_ms and p75_ms its interquartile range over the steps. "
    "With --repeats N the bench runs every sweep N times, the repeats interleaved (all of "
    "repeat 1, then all of repeat 2...) so that drift on the machine hits every algorithm "
    "alike; a row's times are then the medians over its repeats, and vs_ssgd, vs_ddp the mean "
    "over repeats of the ratio to the baseline of the same repeat, [its 95% interval] (Student's "
    "t over the repeats). "
    "step_x: the median step over comm_bound_ms, the least time the step's exchange (both "
    "phases, compute aside) needs on the run's topology; an exchange far above its bound "
    "measures the transport, not the scheme. "
    "shuffle_x, params_x: the phase's time over its bound on the run's topology (the least "
    "time its bytes need on those links). With transport.overlap=true (the default) a message "
    "leaves as soon as its sub-batches are computed, inside map: part of the exchange is done "
    "before the shuffle phase starts, so shuffle_x can be below 1 (set transport.overlap=false "
    "to time the whole exchange against its bound). ddp's shuffle is its all-reduce window, "
    "which runs inside its backward pass: it overlaps map_ms, which includes it. csv and json "
    "have every column (phases encode, decode and update, mean_ms, bytes multicast, params, "
    "dask, moved and wire). predicted_ms: the step `python -m dcoded.predict` predicts from "
    "the run's configuration alone (dcoded/calibration.json), predicted_err its error as a "
    "fraction of step_ms."
)


def _ints(text: str | None) -> list[int] | None:
    return [int(x) for x in text.split(",")] if text else None


def sweeps(args: argparse.Namespace, n_workers: int) -> list[list[str]]:
    """The multiruns the flags ask for, each as the arguments after ``python -m dcoded -m``
    (without ``hydra.sweep.dir``). A flag left out keeps the experiment file's value; ``K`` is
    ``n_workers``: the ends ``r = 1`` and ``r = K`` run the coded shuffle only, unless
    ``--shuffles`` is given (then every ``r`` runs those)."""
    common = []
    for flag, key in [
        ("cluster", "cluster"),
        ("workers", "cluster.n_workers"),
        ("bandwidth_mbit", "cluster.bandwidth_mbit"),
        ("queue_ms", "cluster.queue_ms"),
        ("rack_size", "cluster.rack_size"),
        ("uplink_mbit", "cluster.uplink_mbit"),
        ("models", "model"),
        ("steps", "train.steps"),
        ("batch_size", "train.batch_size"),
        ("samples", "dataset.n_samples"),
    ]:
        value = getattr(args, flag)
        if value is not None:
            common.append(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}")
    if args.topology and args.cluster != "local":  # no links to shape on a local cluster
        common.append(f"cluster.topology={args.topology}")
    if args.straggle:
        common.append(f"straggle={args.straggle}")
    common += args.overrides
    runs = []
    if args.baselines is None:
        runs.append(["experiment=bench", *common])
    elif args.baselines:
        runs.append(["experiment=bench", f"algorithm={args.baselines}", *common])
    cdc = [f"transport={args.transports}"] if args.transports else []
    if args.tolerant:  # cdc waiting for every map, and not waiting for the r - 1 slowest
        cdc.append("coding.stragglers=0,max")
    redundancies = _ints(args.redundancies) or list(range(1, n_workers + 1))
    if args.shuffles:
        joined = ",".join(map(str, redundancies))
        cdc += [f"coding.redundancy={joined}", f"coding.shuffle={args.shuffles}"]
        return [*runs, ["experiment=bench_cdc", *cdc, *common]]
    middle = [r for r in redundancies if 1 < r < n_workers]
    ends = [r for r in redundancies if r in (1, n_workers)]
    for name, rs in [("bench_cdc", middle), ("bench_cdc_ends", ends)]:
        if rs:
            joined = ",".join(map(str, rs))
            runs.append([f"experiment={name}", *cdc, f"coding.redundancy={joined}", *common])
    return runs


def row(summary: dict) -> dict:
    """One bench row from a run's summary; on the emulated network, each exchange phase
    beside its bound on that topology and their ratio (``*_x``)."""
    t, b = times(summary), summary["bytes_per_worker"]

    def ms(x):
        return None if x is None else round(1e3 * x, 2)

    limits = phase_bounds(summary)

    def ratio(phase, timed=None):
        bound, took = limits.get(phase), t.get(timed or phase)
        return round(took / bound, 3) if bound and took else None

    net = summary["environment"].get("netem") or {}
    predicted = _predicted(summary)
    return {
        "topology": net.get("topology"),
        "model": summary["model"],
        "algorithm": summary["algorithm"],
        "r": summary["redundancy"],
        "shuffle": summary["shuffle"],
        "transport": summary.get("transport"),
        "straggle": (summary.get("straggle") or {}).get("model", "none"),
        "s": summary.get("stragglers"),
        "steps": summary["steps"],
        "repeats": 1,
        "step_ms": ms(t["step_median"]),
        "p25_ms": ms(t.get("step_p25")),
        "p75_ms": ms(t.get("step_p75")),
        "mean_ms": ms(t.get("step_mean")),
        "p95_ms": ms(t.get("step_p95")),
        **{f"{p}_ms": ms(t.get(p)) for p in PHASES},
        **{f"{p}_bound_ms": ms(v) for p, v in limits.items()},
        "predicted_ms": ms(predicted),
        "predicted_err": (
            round((predicted - t["step_median"]) / t["step_median"], 3)
            if predicted and t.get("step_median")
            else None
        ),
        "step_x": ratio("comm", "step_median"),
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


def _predicted(summary: dict) -> float | None:
    """The step :mod:`dcoded.predict` predicts from the run's configuration (``None`` off
    the emulated network, where it knows no link, for a layout it cannot model, or a model
    or family the calibration has no rate or costs for)."""
    from dcoded.errors import ConfigError
    from dcoded.predict import ImpossibleLayout, predict, scenario_of

    if not summary["environment"].get("netem"):
        return None
    try:
        return predict(scenario_of(summary)).step_s
    except (ImpossibleLayout, ConfigError):
        return None


#: What makes two rows the same run but for the straggler model (``vs_clean``).
_SAME_RUN = ("topology", "model", "algorithm", "r", "shuffle", "transport", "s")


def add_ratios(rows: list[dict]) -> None:
    """Each step time over ``ssgd``'s and ``ddp``'s for the same model on the same topology
    under the same stragglers, and over its own step without stragglers (``vs_clean``), from
    this run."""
    clean = {
        tuple(r.get(k) for k in (*_SAME_RUN, "repeat")): r["step_ms"]
        for r in rows
        if r.get("straggle", "none") == "none"
    }
    for r in rows:
        ref = clean.get(tuple(r.get(k) for k in (*_SAME_RUN, "repeat")))
        r["vs_clean"] = round(r["step_ms"] / ref, 3) if ref and r["step_ms"] else None

    def place(r):
        return r["model"], r.get("topology"), r.get("straggle"), r.get("repeat")

    for where in {place(r) for r in rows}:
        same = [r for r in rows if place(r) == where]
        base = {r["algorithm"]: r["step_ms"] for r in same if r["algorithm"] in ("ssgd", "ddp")}
        for r in same:
            for name in ("ssgd", "ddp"):
                ref = base.get(name)
                r[f"vs_{name}"] = round(r["step_ms"] / ref, 3) if ref and r["step_ms"] else None


#: What the same run is across repeats: every column a run's configuration sets.
_SAME = (*_SAME_RUN, "straggle")
#: The ratios that get an interval over repeats; every other number is their median.
_RATIOS = ("vs_clean", "vs_ssgd", "vs_ddp")


def combine(rows: list[dict]) -> list[dict]:
    """One row per run of the bench over its repeats (rows with a ``repeat``): its times and
    bytes the medians over the repeats, ``vs_ssgd`` and ``vs_ddp`` the mean of the repeats'
    ratios with a 95% interval (``_lo``, ``_hi``; Student's t over the repeats).

    >>> rows = [{"model": "dnn", "algorithm": "cdc", "repeat": i, "step_ms": t, "vs_ddp": v}
    ...         for i, (t, v) in enumerate([(10.0, 0.9), (12.0, 1.0), (11.0, 0.95)])]
    >>> (one,) = combine(rows)
    >>> one["repeats"], one["step_ms"], one["vs_ddp"], one["vs_ddp_lo"] < 0.95 < one["vs_ddp_hi"]
    (3, 11.0, 0.95, True)
    """
    from statistics import median

    from dcoded.results import interval

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in _SAME), []).append(r)
    out = []
    for same in groups.values():
        if len(same) == 1:
            one = {k: v for k, v in same[0].items() if k != "repeat"}
            out.append({**one, **{f"{k}_{e}": None for k in _RATIOS[1:] for e in ("lo", "hi")}})
            continue
        row = {"repeats": len(same)}
        for k in dict.fromkeys(k for r in same for k in r):
            values = [r.get(k) for r in same]
            numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            if k == "repeat":
                continue
            if k in _RATIOS and len(numbers) > 1:
                iv = interval(numbers)
                row[k] = round(iv["mean"], 3)
                row[f"{k}_lo"], row[f"{k}_hi"] = round(iv["lo"], 3), round(iv["hi"], 3)
            elif k in _SAME or k == "repeats" or len(numbers) != len(values) or not numbers:
                row.setdefault(k, values[0])
            else:
                row[k] = round(median(numbers), 3)
        row["repeats"] = len(same)
        out.append(row)
    return out


def markdown(
    rows: list[dict], header: str, columns: Sequence[str] = SHOWN, notes: str = NOTES
) -> str:
    """``header``, then a markdown table of ``rows`` in these ``columns`` (those no row has a
    value in left out), then ``notes`` (none where empty)."""

    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"
        return str(v)

    def shown_cell(r, c):
        lo, hi = r.get(f"{c}_lo"), r.get(f"{c}_hi")
        if lo is not None and hi is not None and r.get(c) is not None:
            return f"{cell(r[c])} [{cell(lo)}, {cell(hi)}]"
        return cell(r.get(c))

    shown = [c for c in columns if any(r.get(c) is not None for r in rows)]
    lines = [header, "", "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(shown_cell(r, c) for c in shown) + " |" for r in rows]
    return "\n".join([*lines, *(["", notes] if notes else [])]) + "\n"


def _order(rows: list[dict]):
    """Topology, model and transport in the order first seen; the baselines first, then cdc
    by transport, r and shuffle."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    transports = list(dict.fromkeys(r["transport"] for r in rows))

    def key(r):
        topology = r["topology"]
        return (
            TOPOLOGIES.index(topology) if topology in TOPOLOGIES else len(TOPOLOGIES),
            str(topology),
            models.index(r["model"]),
            BASELINES.index(r["algorithm"]) if r["algorithm"] in BASELINES else len(BASELINES),
            r["algorithm"],
            transports.index(r["transport"]),
            r["r"] or 0,
            r.get("s") or 0,
            str(r.get("straggle")),
            SHUFFLES.index(r["shuffle"]) if r["shuffle"] in SHUFFLES else len(SHUFFLES),
        )

    return key


def _shape(run_dir: Path) -> str | None:
    """The dataset's sample shape from the job's ``.hydra/config.yaml`` (``1x28x28``)."""
    try:
        cfg = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
        return "x".join(str(n) for n in cfg["dataset"]["shape"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None


def _values(items) -> str:
    return ",".join(str(v) for v in dict.fromkeys(items))


def read(sweep_dirs: list[Path]) -> tuple[list[dict], str, list[str]]:
    """``(rows, header, unfinished)`` of the jobs of these sweep folders (read by
    :func:`dcoded.results.load_sweep`): a row per finished job, in the bench's order, with
    the ratios to the baselines of the same model and topology among them, and a line per job
    that did not finish."""
    jobs, repeat_of = [], {}
    for d in sweep_dirs:
        for i, where in enumerate(repeat_dirs(d)):
            for j in load_sweep(where):
                jobs.append(j)
                repeat_of[id(j)] = i
    done = [j for j in jobs if j["status"] == "finished"]
    unfinished = [
        f"{j['dir']}: {j['status']}" + (f" ({j['error'].splitlines()[0]})" if j["error"] else "")
        for j in jobs
        if j["status"] != "finished"
    ]
    rows = [{**row(j["summary"]), "repeat": repeat_of[id(j)]} for j in done]
    add_ratios(rows)
    rows = combine(rows)
    rows.sort(key=_order(rows))
    return rows, _header(done, rows, len(set(repeat_of.values()))), unfinished


def _header(done: list[dict], rows: list[dict], repeats: int) -> str:
    """The line above the table: what the finished jobs (``done``) ran, on which network and
    data, over how many repeats."""
    summaries = [j["summary"] for j in done]
    nets = [s["environment"].get("netem") or {} for s in summaries]
    rates = _values(f"{n['bandwidth_mbit']:g}" for n in nets if n)
    shapes = _values(filter(None, (_shape(j["dir"]) for j in done)))
    return (
        f"dcoded bench: K={_values(s['n_workers'] for s in summaries)}, "
        f"cluster={_values(s['environment'].get('cluster') for s in summaries)}"
        + (f" at {rates} Mbit/s per link ({_values(r['topology'] for r in rows)})" if rates else "")
        + f", {_values(s['dataset'] for s in summaries)} {shapes}".rstrip()
        + f", B={_values(s['batch_size'] for s in summaries)}"
        + f", {_values(s['steps'] for s in summaries)} steps"
        + (f", {repeats} repeats" if repeats > 1 else "")
        + "; times are medians per step; bytes per worker per step; vs_*: step time over that "
        "baseline's, same sweep"
    )


#: A repeat's own sweep folder inside the bench's (``--repeats``): ``repeat-1``, ``repeat-2``...
REPEAT = "repeat-"


def repeat_dirs(sweep_dir: Path) -> list[Path]:
    """The repeats' folders of a bench run with ``--repeats`` (in order), else the folder."""
    found = sorted(
        (p for p in Path(sweep_dir).glob(f"{REPEAT}*") if p.is_dir()),
        key=lambda p: int(p.name[len(REPEAT) :]) if p.name[len(REPEAT) :].isdigit() else 0,
    )
    return found or [Path(sweep_dir)]


def write(rows: list[dict], header: str, out: Path) -> str:
    """``bench.csv``, ``bench.md`` and ``bench.json`` into ``out``; the markdown."""
    with files.create(out / f"{TABLE_STEM}.csv", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    text = markdown(rows, header)
    files.write_text(out / f"{TABLE_STEM}.md", text)
    files.write_text(out / f"{TABLE_STEM}.json", json.dumps(rows, indent=1))
    return text


def run_sweep(args: list[str], out: Path) -> int:
    """``python -m dcoded -m ARGS hydra.sweep.dir=OUT``, its output into ``out/<experiment>.log``
    and each job's launch line to stderr; returns its exit status."""
    cmd = [sys.executable, "-m", "dcoded", "-m", *args, f"hydra.sweep.dir={out}"]
    name = args[0].split("=", 1)[1]
    with files.append(out / f"{name}.log") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        print(f"{name}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if re.search(r"\t#\d+ : ", line) or line.startswith("error:"):
                    print(f"  {name}: {line.split('] ', 1)[-1].strip()}", file=sys.stderr)
            return proc.wait()
        except BaseException:
            proc.terminate()  # Ctrl-C: the multirun removes its emulated cluster on exit
            proc.wait()
            raise


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dcoded.bench",
        description=help_text(__doc__.split("\n\n")[1]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="A flag left out keeps the value of conf/experiment/bench.yaml (shown in brackets).",
    )
    p.add_argument(
        "--read",
        nargs="+",
        type=Path,
        metavar="SWEEP_DIR",
        help="only read these and print their table (written nowhere unless --out is given)",
    )
    p.add_argument("--cluster", choices=["netem", "local"], help="[netem]")
    p.add_argument("--workers", type=int, help="K [4]")
    p.add_argument("--bandwidth-mbit", type=float, help="each link's rate [100]")
    p.add_argument("--topology", help="e.g. switch,bus,racks [switch]")
    p.add_argument("--rack-size", type=int, help="racks: workers per rack [2]")
    p.add_argument("--uplink-mbit", type=float, help="racks: each uplink [the links' rate]")
    p.add_argument("--queue-ms", type=float, help="queue of every link [cluster=netem's: 20]")
    p.add_argument("--models", help="[dnn,cnn]")
    p.add_argument("--redundancies", help="e.g. 1,2 [1..K]")
    p.add_argument("--transports", help="cdc's [dask,direct]")
    p.add_argument("--shuffles", help="e.g. coded,summed, at every r [all where they differ]")
    p.add_argument("--baselines", help="'' for none [ssgd,asgd,ddp]")
    p.add_argument("--straggle", help="straggler models to sweep, e.g. none,slow,stall [none]")
    p.add_argument(
        "--tolerant",
        action="store_true",
        help="cdc both waiting for every map and not waiting for the r-1 slowest "
        "(coding.stragglers=0,max)",
    )
    p.add_argument("--steps", type=int, help="[30]")
    p.add_argument("--batch-size", type=int, help="[240]")
    p.add_argument("--samples", type=int, help="synthetic training samples [4096]")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every sweep this many times, interleaved, each into repeat-<i>/; ratios get "
        "a 95%% interval over the repeats [1]",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="the sweep folder [bench/<date>_<time>]; with --read, where to write the table",
    )
    p.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    return p


def main(argv: list[str] | None = None) -> int:
    """The bench's command line: run its sweeps, then write and print its table; or only
    ``--read`` some and print it (written only with ``--out``). Exits 2 on a bad flag or
    folder; 1 where a sweep failed, a job did not finish or none did."""
    args = parser().parse_args(argv)
    if args.read:
        out = args.out  # reading writes nothing unless told where
        missing = [d for d in args.read if not d.is_dir()]
        if missing:
            print(f"error: {missing[0]} is not a folder (a multirun's sweep dir)", file=sys.stderr)
            return 2
        failed = 0
    else:
        out = (args.out or Path("bench", dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))).resolve()
        if out.is_dir() and load_sweep(out):
            print(
                f"error: {out} already holds runs: --read it, or give another --out",
                file=sys.stderr,
            )
            return 2
        out.mkdir(parents=True, exist_ok=True)
        from dcoded.config import compose_config

        n_workers = args.workers or compose_config(["experiment=bench"]).cluster.n_workers
        if args.repeats < 1:
            print(f"error: --repeats {args.repeats}: give 1 or more", file=sys.stderr)
            return 2
        failed = _run_sweeps(args, n_workers, out)
    return _report(args.read or [out], out, failed)


def _run_sweeps(args: argparse.Namespace, n_workers: int, out: Path) -> int:
    """Every sweep the flags ask for, ``--repeats`` times, into ``out``; the last non-zero
    status of a sweep (0 where none failed)."""
    failed = 0
    for i in range(1, args.repeats + 1):  # interleaved: all of repeat 1, then 2...
        where = out / f"{REPEAT}{i}" if args.repeats > 1 else out
        where.mkdir(parents=True, exist_ok=True)
        for sweep in sweeps(args, n_workers):
            code = run_sweep(sweep, where)
            if code:
                failed = code
                print(
                    f"error: {sweep[0]} ended with status {code}; its log: "
                    f"{where / sweep[0].split('=')[1]}.log",
                    file=sys.stderr,
                )
    return failed


def _report(sweep_dirs: list[Path], out: Path | None, failed: int) -> int:
    """The table of these sweep folders printed (and written into ``out``, if given), with a
    note for each job that did not finish and each baseline missing; the exit status: 1 where a
    sweep ``failed``, a job did not finish or none did, else 0."""
    rows, header, unfinished = read(sweep_dirs)
    for line in unfinished:
        print(f"note: did not finish: {line}", file=sys.stderr)
    for name in ("ssgd", "ddp"):
        if rows and not any(r["algorithm"] == name for r in rows):
            print(f"note: no {name} run: vs_{name} is blank", file=sys.stderr)
    if not rows:
        print(f"error: no finished runs in {', '.join(map(str, sweep_dirs))}", file=sys.stderr)
        return 1
    if out is None:
        print(markdown(rows, header), end="")
    else:
        out.mkdir(parents=True, exist_ok=True)
        print(write(rows, header, out), end="")
        print(f"table: {out / TABLE_STEM}.md", file=sys.stderr)
    return 1 if failed or unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
