"""Reading what runs wrote: one run's folder, every job of a sweep, one table of a sweep.

    python -m dcoded.results multirun/2026-01-01/12-00-00    # writes and prints its table
    python -m dcoded.results outputs/2026-01-01/12-00-00-cdc # one run: prints its row

A Hydra multirun writes each job into a folder of the sweep directory: ``summary.json`` and
``history.csv`` (:func:`dcoded.run.run`), ``.hydra/`` (the job's number and overrides), and
``error.txt`` where the job failed. :func:`load_sweep` reads them all, :func:`sweep_table`
makes one row per job (the overrides that vary, time per step, bytes, accuracy) and
:func:`write_sweep_table` writes it as ``results.csv`` and ``results.md`` into the sweep
folder, which every multirun does when it ends (``hydra.callbacks`` in ``conf/config.yaml``).

A sweep over seeds (``train.seed``: the initialisation and the sample order) is also read as
groups: :func:`by_seed` groups the jobs by every override except the seed, :func:`seed_table`
gives each group's mean, standard deviation and 95% interval (``results_by_seed.md``, written
beside ``results.md`` when the seed varies), and :func:`paired` the difference of two groups
paired by seed. :func:`time_to_accuracy` reads a run's history for the first evaluation at a
target accuracy. Notebooks, ``paper/`` and users read results through here. Nothing here
imports torch or Dask.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from dcoded import files

#: What a job that failed leaves in its folder: the error (a traceback for a bug).
ERROR_FILE = "error.txt"
#: ``results.csv`` and ``results.md``: a sweep's table, in its folder.
TABLE_STEM = "results"

#: The phases of a step, in order: ``summary.json``'s ``time_s`` and ``history.csv``'s
#: ``<phase>_s`` columns name them so (``docs/measurement.md`` says what each one times).
PHASES = ("map", "encode", "shuffle", "decode", "update", "params")

#: The columns after the overrides that vary: ``(name, where in summary.json, scale)``.
MEASURED = (
    ("step_ms", ("time_s", "step_median"), 1e3),
    *((f"{p}_ms", ("time_s", p), 1e3) for p in PHASES),
    ("total_s", ("time_s", "total"), 1.0),
    ("unicast_bytes", ("bytes_per_worker", "unicast"), 1.0),
    ("multicast_bytes", ("bytes_per_worker", "multicast"), 1.0),
    ("params_bytes", ("bytes_per_worker", "params"), 1.0),
    ("dask_bytes", ("bytes_per_worker", "dask_transfer"), 1.0),
    ("test_accuracy", ("final", "test_accuracy"), 1.0),
)

#: The column that says which runs ended with the same parameters, bit for bit.
SHA = "param_sha256"
#: The override that names a repeat of the same run (:func:`by_seed`), and its table's stem.
SEED = "train.seed"
SEED_STEM = "results_by_seed"
#: What :func:`seed_table` gives for each group: these columns of :data:`MEASURED`.
SEED_MEASURED = ("step_ms", "total_s", "test_accuracy")
#: Of these, the ones that are positive and skewed (times): their interval is taken on the log
#: scale (:func:`log_interval`), so that it never reaches below zero.
LOG_SCALE = ("step_ms", "total_s")
#: Of these, the fractions (accuracies): their interval is clamped to [0, 1], where the values
#: lie (Student's t of two seeds reaches far past both ends).
FRACTIONS = ("test_accuracy",)
#: The confidence of every interval here.
CONFIDENCE = 0.95


def run_name(summary: Mapping, sep: str = " ") -> str:
    """A run's algorithm and layout, as its summary has them (``sep`` after the algorithm).

    >>> run_name({"algorithm": "cdc", "n_workers": 4, "redundancy": 2, "group_size": 4,
    ...           "shuffle": "coded", "hybrid_m": None, "transport": "direct"})
    'cdc K=4 r=2 g=4 coded via direct'
    """
    head = f"{summary['algorithm']}{sep}K={summary['n_workers']}"
    if summary.get("redundancy") is not None:
        head += f" r={summary['redundancy']} g={summary['group_size']} {summary['shuffle']}"
        if summary.get("hybrid_m"):
            head += f" m={summary['hybrid_m']}"
    if summary.get("transport"):
        head += f" via {summary['transport']}"
    return head


def parse_overrides(lines: Sequence[str]) -> dict[str, str]:
    """``["model=cnn", "coding.redundancy=2"]`` as ``{key: value}`` (values as typed).

    >>> parse_overrides(["model=cnn", "coding.redundancy=2", "+extra=a=b"])
    {'model': 'cnn', 'coding.redundancy': '2', '+extra': 'a=b'}
    """
    return dict(line.split("=", 1) for line in lines if "=" in line)


def times(summary: Mapping) -> Mapping:
    """The run's times as the cluster it stands for sees them: under the scale model the wall
    times divided by its TDF (``time_s_undilated``), else ``time_s``.

    >>> times({"time_s": {"total": 10.0}, "time_s_undilated": {"total": 2.0}})
    {'total': 2.0}
    """
    return summary.get("time_s_undilated") or summary["time_s"]


def dilation(summary: Mapping) -> float:
    """The run's time dilation factor: its history's times over the cluster's (1 outside the
    scale model)."""
    return float((summary.get("scale_model") or {}).get("tdf") or 1.0)


def read_history(run_dir: str | Path) -> list[dict]:
    """A run's ``history.csv``, one dict per row (values as written: strings, ``""`` where
    a value does not apply)."""
    with open(Path(run_dir) / "history.csv", newline="") as f:
        return list(csv.DictReader(f))


def load_run(run_dir: str | Path) -> dict:
    """One run's folder: ``{"dir", "job", "overrides", "status", "summary", "error"}``.

    ``status`` is the summary's (``finished``, or ``interrupted`` by Ctrl-C or SIGTERM),
    ``failed`` when the job left ``error.txt``, and ``missing`` when it left neither (killed,
    or still running). ``job`` is Hydra's job number (``None`` outside a multirun).
    """
    run_dir = Path(run_dir)
    hydra_dir = run_dir / ".hydra"
    overrides, job = {}, None
    if (hydra_dir / "overrides.yaml").exists():
        overrides = parse_overrides(yaml.safe_load((hydra_dir / "overrides.yaml").read_text()))
    if overrides and (hydra_dir / "config.yaml").exists():
        overrides = typed(overrides, yaml.safe_load((hydra_dir / "config.yaml").read_text()))
    if (hydra_dir / "hydra.yaml").exists():
        job = yaml.safe_load((hydra_dir / "hydra.yaml").read_text())["hydra"]["job"].get("num")
        job = job if isinstance(job, int) else None  # a single run's is ??? (not a job)
    if job is None and re.match(r"\d+-", run_dir.name):
        job = int(run_dir.name.split("-", 1)[0])
    summary, error = None, None
    if (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
        status = summary.get("status", "finished")
    elif (run_dir / ERROR_FILE).exists():
        error = (run_dir / ERROR_FILE).read_text().strip()
        status = "failed"
    else:
        status = "missing"
    return {
        "dir": run_dir,
        "job": job,
        "overrides": overrides,
        "status": status,
        "summary": summary,
        "error": error,
    }


def typed(overrides: Mapping[str, str], config: Mapping) -> dict:
    """The overrides with the values the composed ``config`` gave them (``2``, not ``"2"``),
    where the key names one value of it; a group's option (``model=cnn``) stays its name.

    >>> typed({"coding.redundancy": "2", "model": "cnn", "+tag": "a"},
    ...       {"coding": {"redundancy": 2}, "model": {"name": "cnn"}, "tag": "a"})
    {'coding.redundancy': 2, 'model': 'cnn', '+tag': 'a'}
    """
    out = {}
    for key, raw in overrides.items():
        value = config
        for part in key.lstrip("+~").split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        out[key] = value if value is not None and not isinstance(value, Mapping) else raw
    return out


def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` holds one run (its Hydra record, summary or error), not a sweep."""
    return any(
        (folder / name).exists() for name in (".hydra/overrides.yaml", "summary.json", ERROR_FILE)
    )


def load_sweep(sweep_dir: str | Path) -> list[dict]:
    """Every job of a sweep (:func:`load_run` of each job folder), in job order."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir} is not a folder (a multirun's hydra.sweep.dir)")
    jobs = [load_run(f) for f in sorted(sweep_dir.iterdir()) if f.is_dir() and is_run_folder(f)]
    return sorted(jobs, key=lambda j: (j["job"] is None, j["job"] or 0, j["dir"].name))


def varying(jobs: Sequence[Mapping]) -> list[str]:
    """The override keys whose values differ between jobs, in the order first seen.

    >>> varying([{"overrides": {"a": "1", "b": "x"}}, {"overrides": {"a": "2", "b": "x"}}])
    ['a']
    """
    keys = dict.fromkeys(k for j in jobs for k in j["overrides"])
    return [k for k in keys if len({repr(j["overrides"].get(k)) for j in jobs}) > 1]


def _get(summary: Mapping | None, path: Sequence[str]):
    if path and path[0] == "time_s" and isinstance(summary, Mapping):
        if summary.get("time_s_undilated"):  # the scale model: the emulated cluster's times
            path = ("time_s_undilated", *path[1:])
    value = summary
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def sweep_table(jobs: Sequence[Mapping]) -> tuple[list[dict], list[str]]:
    """``(rows, columns)``: one row per job with the overrides that vary, its status, time
    per step (median, ms) and in all (s), bytes per worker per step (the gradient exchange
    counted once per receiver and per packet, the parameters, all that Dask moved) and the
    final test accuracy; ``error`` is the first line of a failed job's error.

    >>> rows, columns = sweep_table([
    ...     {"job": 0, "overrides": {"coding.redundancy": "1"}, "status": "finished",
    ...      "summary": {"time_s": {"step_median": 0.25, "total": 5.0},
    ...                  "final": {"test_accuracy": 0.9}}, "error": None},
    ...     {"job": 1, "overrides": {"coding.redundancy": "5"}, "status": "failed",
    ...      "summary": None, "error": "coding.redundancy=5 is not allowed"}])
    >>> columns[:4]
    ['job', 'coding.redundancy', 'status', 'step_ms']
    >>> [(r["coding.redundancy"], r["step_ms"], r["error"]) for r in rows]
    [('1', 250.0, None), ('5', None, 'coding.redundancy=5 is not allowed')]
    """
    keys = varying(jobs)
    # under the scale model each run says whether it kept fidelity: the table marks it
    scaled = any(_get(j["summary"], ("fidelity",)) for j in jobs)
    columns = [
        "job",
        *keys,
        "status",
        *(name for name, _, _ in MEASURED),
        SHA,
        *(["fidelity"] if scaled else []),
        "error",
    ]
    rows = []
    for j in jobs:
        row = {"job": j["job"], **{k: j["overrides"].get(k) for k in keys}, "status": j["status"]}
        for name, path, scale in MEASURED:
            value = _get(j["summary"], path)
            row[name] = value * scale if isinstance(value, int | float) else None
        row[SHA] = _get(j["summary"], (SHA,))
        if scaled:
            held = _get(j["summary"], ("fidelity", "ok"))
            row["fidelity"] = None if held is None else ("held" if held else "outside")
        row["error"] = j["error"].splitlines()[0] if j["error"] else None
        rows.append(row)
    return rows, columns


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict:
    """``{"n", "mean", "std", "lo", "hi"}``: the mean of ``values``, their standard deviation
    (``n - 1`` in the denominator) and Student's t interval of the mean at ``confidence``;
    ``std``, ``lo`` and ``hi`` are ``None`` for fewer than two values.

    >>> iv = interval([1.0, 2.0, 3.0])
    >>> iv["mean"], iv["std"], round(iv["lo"], 3), round(iv["hi"], 3)
    (2.0, 1.0, -0.484, 4.484)
    >>> interval([5.0])["lo"] is None
    True
    """
    from scipy import stats

    xs = [float(v) for v in values]
    n = len(xs)
    if not n:
        return {"n": 0, "mean": None, "std": None, "lo": None, "hi": None}
    mean = sum(xs) / n
    if n < 2:
        return {"n": n, "mean": mean, "std": None, "lo": None, "hi": None}
    std = (sum((x - mean) ** 2 for x in xs) / (n - 1)) ** 0.5
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / n**0.5
    return {"n": n, "mean": mean, "std": std, "lo": mean - half, "hi": mean + half}


def log_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict:
    """:func:`interval`'s mean and standard deviation, with the interval taken on the log
    scale: Student's t interval of the mean of ``log(values)``, mapped back by ``exp`` (an
    interval of the geometric mean). For positive, right-skewed values (times) with few
    seeds, where the t interval of the values reaches below zero; it needs every value
    ``> 0`` (``lo`` and ``hi`` are ``None`` otherwise).

    >>> xs = [1.2, 1.3, 30.0]
    >>> round(interval(xs)["lo"], 2), [round(log_interval(xs)[k], 2) for k in ("lo", "hi")]
    (-30.4, [0.04, 344.54])
    """
    import math

    out = interval(values, confidence)
    if out["lo"] is None or min(values) <= 0:
        return {**out, "lo": None, "hi": None}
    logs = interval([math.log(v) for v in values], confidence)
    return {**out, "lo": math.exp(logs["lo"]), "hi": math.exp(logs["hi"])}


def by_seed(jobs: Sequence[Mapping], seed: str = SEED) -> list[dict]:
    """The finished jobs grouped by every override but ``seed``, in the order first seen:
    ``{"overrides", "seeds", "jobs"}`` per group, ``overrides`` holding the keys that vary
    between groups.

    >>> jobs = [{"overrides": {"algorithm": a, "train.seed": s}, "status": "finished"}
    ...         for s in (0, 1) for a in ("ssgd", "cdc")]
    >>> [(g["overrides"], g["seeds"]) for g in by_seed(jobs)]
    [({'algorithm': 'ssgd'}, [0, 1]), ({'algorithm': 'cdc'}, [0, 1])]
    """
    done = [j for j in jobs if j["status"] == "finished"]
    keys = [k for k in varying(done) if k != seed]
    groups: dict[tuple, dict] = {}
    for j in done:
        o = j["overrides"]
        key = tuple(repr(o.get(k)) for k in keys)
        g = groups.setdefault(
            key, {"overrides": {k: o.get(k) for k in keys}, "seeds": [], "jobs": []}
        )
        g["seeds"].append(o.get(seed))
        g["jobs"].append(j)
    return list(groups.values())


def measured(job: Mapping, name: str):
    """One :data:`MEASURED` column of a job (``step_ms``, ``test_accuracy``...), scaled."""
    path, scale = next((p, sc) for n, p, sc in MEASURED if n == name)
    value = _get(job.get("summary"), path)
    return value * scale if isinstance(value, int | float) else None


def seed_table(jobs: Sequence[Mapping], seed: str = SEED) -> tuple[list[dict], list[str]]:
    """``(rows, columns)``: one row per :func:`by_seed` group, its number of seeds and, for
    each of :data:`SEED_MEASURED`, the mean, the standard deviation across seeds and the 95%
    interval (``_mean``, ``_std``, ``_lo``, ``_hi``): of the mean, or for :data:`LOG_SCALE`'s
    times of the geometric mean (:func:`log_interval`); :data:`FRACTIONS`' (accuracies) clamped
    to [0, 1].

    >>> jobs = [{"overrides": {"algorithm": g, "train.seed": s}, "status": "finished",
    ...          "summary": {"final": {"test_accuracy": a}}}
    ...         for g in ("ssgd", "cdc") for s, a in enumerate([.8, .9])]
    >>> rows, columns = seed_table(jobs)
    >>> columns[:3], rows[1]["algorithm"], rows[1]["n"], round(rows[1]["test_accuracy_mean"], 3)
    (['algorithm', 'n', 'seeds'], 'cdc', 2, 0.85)
    """
    groups = by_seed(jobs, seed)
    keys = list(groups[0]["overrides"]) if groups else []
    stats = [f"{m}_{s}" for m in SEED_MEASURED for s in ("mean", "std", "lo", "hi")]
    rows = []
    for g in groups:
        row = {**g["overrides"], "n": len(g["jobs"]), "seeds": ",".join(map(str, g["seeds"]))}
        for m in SEED_MEASURED:
            values = [v for v in (measured(j, m) for j in g["jobs"]) if v is not None]
            iv = (log_interval if m in LOG_SCALE else interval)(values)
            if m in FRACTIONS and iv["lo"] is not None:
                iv = {**iv, "lo": max(0.0, iv["lo"]), "hi": min(1.0, iv["hi"])}
            row.update({f"{m}_{s}": iv[s] for s in ("mean", "std", "lo", "hi")})
        rows.append(row)
    return rows, [*keys, "n", "seeds", *stats]


def paired(a: Mapping, b: Mapping) -> dict:
    """``a - b`` paired by seed: two ``{seed: value}`` maps, the seeds both have;
    :func:`interval` of the differences plus ``seeds``.

    >>> d = paired({0: 0.80, 1: 0.75, 2: 0.70}, {0: 0.79, 1: 0.74, 2: 0.71})
    >>> d["seeds"], round(d["mean"], 4)
    ([0, 1, 2], 0.0033)
    """
    seeds = [s for s in a if s in b and a[s] is not None and b[s] is not None]
    return {**interval([a[s] - b[s] for s in seeds]), "seeds": seeds}


def time_to_accuracy(history: Sequence[Mapping], target: float) -> dict | None:
    """The first evaluation of a run's history (:func:`read_history`) at ``target`` test
    accuracy or above: ``{"wall_s", "step", "test_accuracy"}`` (``step`` counts from 1), or
    ``None`` if the run never reached it. ``wall_s`` is the training loop's, evaluation
    paused out of it.

    >>> h = [{"step": "4", "wall_s": "1.5", "test_accuracy": "0.5"},
    ...      {"step": "5", "wall_s": "1.9", "test_accuracy": ""},
    ...      {"step": "9", "wall_s": "3.0", "test_accuracy": "0.71"}]
    >>> time_to_accuracy(h, 0.7)
    {'wall_s': 3.0, 'step': 10, 'test_accuracy': 0.71}
    >>> time_to_accuracy(h, 0.9) is None
    True
    """
    for h in history:
        acc = h.get("test_accuracy")
        if acc not in (None, "") and float(acc) >= target:
            return {
                "wall_s": float(h["wall_s"]),
                "step": int(h["step"]) + 1,
                "test_accuracy": float(acc),
            }
    return None


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def markdown(rows: Sequence[Mapping], columns: Sequence[str]) -> str:
    """A markdown table of ``rows``; floats rounded to 4 digits, ``-`` where there is none.

    >>> print(markdown([{"a": 1, "b": 1234.5}, {"a": None, "b": 0.123456}], ["a", "b"]), end="")
    | a | b |
    |---|---|
    | 1 | 1,234 |
    | - | 0.1235 |
    """
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_sweep_table(sweep_dir: str | Path) -> list[dict]:
    """Write ``results.csv`` (full precision) and ``results.md`` into the sweep folder; return
    the rows."""
    sweep_dir = Path(sweep_dir)
    rows, columns = sweep_table(load_sweep(sweep_dir))
    with files.create(sweep_dir / f"{TABLE_STEM}.csv", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    files.write_text(sweep_dir / f"{TABLE_STEM}.md", table_text(sweep_dir, rows, columns))
    jobs = load_sweep(sweep_dir)
    if SEED in varying(jobs):
        seeded, seed_columns = seed_table(jobs)
        with files.create(sweep_dir / f"{SEED_STEM}.csv", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=seed_columns)
            writer.writeheader()
            writer.writerows(seeded)
        files.write_text(sweep_dir / f"{SEED_STEM}.md", seed_text(sweep_dir, seeded, seed_columns))
    return rows


def seed_text(where: Path, rows: Sequence[Mapping], columns: Sequence[str]) -> str:
    """``results_by_seed.md``: the groups of :func:`seed_table`, mean ± std and interval."""
    keys = columns[: columns.index("n")]
    shown = [*keys, "n", *(f"{m}" for m in SEED_MEASURED)]
    lines = []
    for r in rows:
        out = {k: r.get(k) for k in (*keys, "n")}
        for m in SEED_MEASURED:
            mean, std, lo, hi = (r.get(f"{m}_{s}") for s in ("mean", "std", "lo", "hi"))
            out[m] = (
                None
                if mean is None
                else f"{mean:.4g}"
                + (f" ± {std:.2g} [{lo:.4g}, {hi:.4g}]" if std is not None else "")
            )
        lines.append(out)
    return (
        f"Sweep {where} by seed ({SEED}): {len(rows)} groups of the same overrides; mean ± "
        f"standard deviation across seeds [{100 * CONFIDENCE:.0f}% interval: Student's t of the "
        f"mean; for {' and '.join(LOG_SCALE)}, of the geometric mean, on the log scale, as "
        f"times are positive and skewed; for {' and '.join(FRACTIONS)}, clamped to [0, 1]]."
        "\n\n" + markdown(lines, shown)
    )


def table_text(
    where: Path, rows: Sequence[Mapping], columns: Sequence[str], one_run: bool = False
) -> str:
    """``results.md``: what the table is, then the table (``param_sha256`` to 12 digits); with
    ``one_run``, titled as the run it is rather than as a sweep.

    >>> row = {"job": None, "status": "finished", SHA: None}
    >>> table_text(Path("out/run"), [row], list(row), one_run=True).splitlines()[0]
    'Run out/run: bytes per worker per step, times in ms (medians per step) and s (total).'
    """
    per = "bytes per worker per step, times in ms (medians per step) and s (total)"
    short = [{**r, SHA: r[SHA][:12] + "…" if r.get(SHA) else None} for r in rows]
    title = f"Run {where}:" if one_run else f"Sweep {where}: {len(rows)} jobs;"
    return f"{title} {per}.\n\n{markdown(short, columns)}"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcoded.results SWEEP_DIR``: write and print the sweep's table. Given one
    run's folder instead, print its row and write nothing. Exits 1 if a job did not finish,
    2 where the folder holds no run."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m dcoded.results SWEEP_DIR (or one RUN_DIR)"
    if args in (["-h"], ["--help"]):
        print(
            f"{usage}\n\nWrite the sweep's tables ({TABLE_STEM}.md and .csv, and "
            f"{SEED_STEM}.md where it has seeds) and print them; given one run's folder, print "
            "its row and write nothing.\nExit status: 0, 1 if a job did not finish, 2 where "
            "the folder holds no run."
        )
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        print(usage, file=sys.stderr)
        return 2
    where = Path(args[0])
    try:
        if where.is_dir() and is_run_folder(where):  # one run: read it, write nothing into it
            rows, columns = sweep_table([load_run(where)])
            print(table_text(where, rows, columns, one_run=True), end="")
        else:
            jobs = load_sweep(where)
            if not jobs:
                raise FileNotFoundError(
                    f"{where} holds no run: give a multirun's folder (hydra.sweep.dir) or one "
                    "run's (with summary.json, error.txt or .hydra/)"
                )
            rows = write_sweep_table(where)
            print((where / f"{TABLE_STEM}.md").read_text(), end="")
            if (where / f"{SEED_STEM}.md").exists():
                print("\n" + (where / f"{SEED_STEM}.md").read_text(), end="")
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1 if any(r["status"] != "finished" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
