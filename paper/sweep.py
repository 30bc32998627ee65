"""Stage 1: run every experiment's sweep (a Hydra multirun), caching the results.

    python -m paper.sweep [--size small|full] [--mnist DIR] [--cluster auto|netem|local]
                          [--beyond] [--only EXPERIMENT ...]
                          [--force | --reuse-stale | --check] [-- OVERRIDE ...]

Without ``--beyond`` (``make paper BEYOND=1``) the studies beyond the paper (Figures 6 to 10,
``paths.BEYOND``) are left out: the paper's own tables and figures take about 66 minutes on
two cores from a fresh clone, and those studies, under the scale model, 77 minutes more.

Each experiment ``conf/experiment/<name>.yaml`` runs as ``python -m dcoded -m
experiment=<name> size=<size>`` into ``paper/results/<size>/<name>/``. The cache is keyed on
what determines the results (:mod:`paper.cache`): every job's composed config and the code. A
finished sweep (``complete.json``) whose key matches is skipped unless ``--force``; one whose key
differs is stale: it is moved aside to ``<name>.stale-<time>`` and run again, or kept with a
warning with ``--reuse-stale``. A sweep that did not finish is moved aside to
``<name>.incomplete-<time>`` and run again, so nothing already written is lost. ``--check`` runs
nothing and says, per experiment, fresh, stale (why), missing or incomplete.

Data: MNIST from the IDX files in ``--mnist DIR`` when given (checked before anything runs),
MNIST-sized synthetic data otherwise (the digits' sweeps, ``paths.OWN_DATA``, keep their
digits and take no ``dataset.*`` override given for every experiment). The accuracy
sweeps run at each algorithm's learning rate picked by the tuning sweeps (:mod:`paper.tuning`),
which run before them. Cluster: the emulated network when this machine can build
it (root and iproute2), else ``cluster=local`` with a note, and the experiments that sweep the
links' rate are skipped. Everything after ``--`` goes to every multirun as more overrides;
``EXPERIMENT:KEY=VALUE`` goes to that experiment's only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from dcoded import files
from dcoded.coding.helptext import help_text
from paper import cache, paths, table_ddp, tuning
from paper.cache import COMPLETE, SKIPPED
from paper.results import MissingResults

#: A job folder named by its model, algorithm and seed: with the rates of every algorithm
#: among its overrides, Hydra's default (every override) is longer than a file name may be.
SHORT = "hydra.sweep.subdir=${hydra.job.num}-${model.name}-${algorithm.name}-seed${train.seed}"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def choose_cluster(wanted: str) -> tuple[str, str | None]:
    """``(cluster, note)``: the emulated network where it can be built, else the local one."""
    if wanted == "local":
        return "local", "cluster=local was asked for: no links are emulated"
    from dcoded.netem import NetemUnavailable, check_available

    try:
        check_available()
    except NetemUnavailable as e:
        if wanted == "netem":
            raise SystemExit(f"error: {e}") from None
        return "local", f"the emulated network is not available here ({e})"
    return "netem", None


def choose_scale(cluster: str) -> tuple[list[str], str | None]:
    """``(overrides, note)``: on the emulated network the experiments run under the scale model
    (their configs ask for it); where host cgroups cannot be made here, without it, with a
    note (every time is then measured on hosts that share this machine's cores freely)."""
    if cluster != "netem":
        return [], None
    from dcoded.scale import usable

    why = usable()
    if why is None:
        return [], None
    return ["++cluster.scale_model=false"], f"the scale model {why}: the hosts share the cores"


def choose_data(mnist: str | None) -> tuple[list[str], str]:
    """The dataset overrides and how to describe the data; a bad MNIST folder fails here."""
    if mnist is None:
        return [], "synthetic, MNIST-sized (1x28x28, 10 classes): no MNIST IDX files were given"
    from dcoded.data import DatasetError, load_dataset

    try:
        data = load_dataset({"name": "mnist", "path": mnist})
    except DatasetError as e:
        raise SystemExit(f"error: {e}") from None
    where = Path(mnist).resolve()
    return (
        ["dataset=mnist", f"dataset.path={where}"],
        f"MNIST from the IDX files in {where} ({len(data.y_train)} train, {len(data.y_test)} test)",
    )


def split_overrides(overrides: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``(for every experiment, {experiment: its own})``: ``paper_phases:coding.redundancy=1,2``
    goes to ``paper_phases`` only (a sweep on the command line replaces the config's)."""
    shared, own = [], {}
    for o in overrides:
        name, sep, rest = o.partition(":")
        if sep and name in paths.EXPERIMENTS:
            own.setdefault(name, []).append(rest)
        elif sep and name.startswith("paper_") and "=" not in name:
            raise SystemExit(
                f"error: no experiment {name!r}; they are {', '.join(paths.EXPERIMENTS)}"
            )
        else:
            shared.append(o)
    return shared, own


def run_sweep(experiment: str, dest: Path, overrides: list[str]) -> int:
    """One multirun; its output goes to ``dest/sweep.log``. Returns the number of jobs."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "dcoded",
        "-m",
        f"experiment={experiment}",
        *overrides,
        f"hydra.sweep.dir={dest}",
    ]
    jobs = 0
    with files.create(dest / "sweep.log") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=paths.ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # progress as it happens
        )
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                launching = re.search(r"Launching (\d+) jobs", line)
                if launching:
                    jobs += int(launching.group(1))
                if re.search(r"\t#\d+ : ", line) or line.startswith("error:"):
                    print(f"  {experiment}: {line.split('] ', 1)[-1].strip()}", flush=True)
            code = proc.wait()
        except BaseException:
            proc.terminate()  # Ctrl-C: the multirun removes its emulated cluster on exit
            proc.wait()
            raise
    if code:
        tail = (dest / "sweep.log").read_text().splitlines()[-15:]
        raise SystemExit(
            f"error: the sweep of {experiment} failed (status {code}); its log is "
            f"{dest / 'sweep.log'}:\n" + "\n".join(tail)
        )
    return jobs


def sweep_overrides(
    size: str, cluster: str, data: list[str], shared: list[str], own: list[str]
) -> list[str]:
    """What an experiment's multirun gets after ``experiment=<name>``."""
    return [
        f"size={size}",
        *([] if cluster == "netem" else ["cluster=local"]),
        *data,
        *shared,
        *own,
    ]


def state(dest: Path, now: cache.Plan | None) -> tuple[str, str | None]:
    """``(state, why)``: ``fresh``, ``stale`` (why), ``missing`` or ``incomplete``. ``now``,
    the sweep's plan, is read only where ``dest`` holds a finished sweep's record."""
    record = cache.read_record(dest)
    if record is not None:
        if now is None:
            raise ValueError(f"{dest} holds a finished sweep: its state needs the plan")
        why = cache.stale_reason(record, now)
        return ("stale", why) if why else ("fresh", None)
    if not dest.exists():
        return "missing", None
    if (dest / SKIPPED).exists() and len(list(dest.iterdir())) == 1:
        return "missing", "skipped earlier: it needs cluster=netem"
    return "incomplete", None


def _plan(experiment: str, overrides: list[str], code: str, jobs: bool = True) -> cache.Plan | None:
    """The sweep's plan, every job composed; with ``jobs=False``, ``None`` once its master
    config composes (:func:`cache.composes`): all ``--check`` needs of a sweep with no results,
    which has no key to compare (composing every job of every sweep took it 20 s)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        if not jobs:
            cache.composes(experiment, overrides)
            return None
        return cache.plan(experiment, overrides, code=code)
    except (HydraException, OmegaConfBaseException) as e:
        raise SystemExit(
            f"error: the sweep of {experiment} does not compose with {' '.join(overrides)}: {e}"
        ) from None


def _needs_netem(dest: Path, experiment: str, note: str | None, check: bool) -> None:
    """An experiment that sweeps the links' rate, where cluster=netem cannot run: a finished
    sweep is kept as it is (it cannot run again here), else it is marked skipped."""
    if (dest / COMPLETE).exists():
        why = cache.check_finished(dest)
        print(
            f"{experiment}: {'stale (' + why + ')' if why else 'fresh'}; kept, it needs "
            "cluster=netem to run again"
        )
        return
    if check:
        print(f"{experiment}: missing; it needs cluster=netem, which is not available here")
        return
    dest.mkdir(parents=True, exist_ok=True)
    files.write_text(dest / SKIPPED, json.dumps({"why": note, "at": _now()}))
    print(f"{experiment}: skipped, it sweeps the links' rate and needs cluster=netem")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paper.sweep", description=help_text(__doc__.split("\n")[0])
    )
    parser.add_argument("--size", choices=paths.SIZES, default="small")
    parser.add_argument("--mnist", default=None, help="a folder with the four MNIST IDX files")
    parser.add_argument("--cluster", choices=["auto", "netem", "local"], default="auto")
    parser.add_argument(
        "--only", nargs="+", choices=[*paths.EXPERIMENTS, table_ddp.NAME], default=None
    )
    parser.add_argument(
        "--beyond", action="store_true", help="also the studies beyond the paper (Figures 6-10)"
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--force", action="store_true", help="run finished sweeps again")
    what.add_argument(
        "--reuse-stale",
        action="store_true",
        help="keep a finished sweep whose configs or code changed since (with a warning)",
    )
    what.add_argument(
        "--check", action="store_true", help="run nothing: say which sweeps are fresh"
    )
    parser.add_argument("--results", type=Path, default=paths.RESULTS)
    parser.add_argument(
        "--ddp-plain-runs",
        type=int,
        default=5,
        help="runs of each DDP in the plain-DDP comparison (each in turn; default 5)",
    )
    parser.add_argument(
        "--ddp-plain-steps", type=int, default=300, help="steps of each of those runs"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="after --: more overrides for every run; EXPERIMENT:KEY=VALUE for one experiment's",
    )
    args = parser.parse_args(argv)
    shared, only_for = split_overrides(args.overrides)

    # the code the sweeps run, before anything can change it
    commit, code = cache.commit(), cache.code_identity()
    cluster, cluster_note = choose_cluster(args.cluster)
    scale_overrides, scale_note = choose_scale(cluster)
    data_overrides, data_note = choose_data(args.mnist)
    if cluster_note:
        print(f"note: {cluster_note}; running on cluster=local", file=sys.stderr)
    if scale_note:
        print(f"note: {scale_note}", file=sys.stderr)
    print(f"data: {data_note}", file=sys.stderr)
    chosen = [e for e in args.only or paths.EXPERIMENTS if e in paths.EXPERIMENTS]
    chosen = [e for e in chosen if args.only or args.beyond or e not in paths.BEYOND]
    for experiment in chosen:
        dest = paths.sweep_dir(args.results, args.size, experiment)
        if cluster != "netem" and experiment in paths.NEEDS_NETEM:
            _needs_netem(dest, experiment, cluster_note, args.check)
            continue
        own = only_for.get(experiment, [])
        if experiment in tuning.TUNED:
            try:
                own = [*tuning.overrides(tuning.picks(args.results, args.size)), SHORT, *own]
            except MissingResults as e:
                if args.check:
                    print(f"{experiment}: missing (its rates come from the tuning sweeps: {e})")
                    continue
                raise SystemExit(
                    f"error: {experiment} runs at the rates the tuning sweeps pick: {e}"
                ) from None
        data, common = data_overrides, [*scale_overrides, *shared]
        if experiment in paths.OWN_DATA:  # its own dataset: none of the others' data settings
            data = []
            common = [o for o in common if not o.lstrip("+~").startswith(("dataset.", "dataset="))]
        overrides = sweep_overrides(args.size, cluster, data, common, own)
        finished = cache.read_record(dest) is not None
        now = _plan(experiment, overrides, code, jobs=finished or not args.check)
        status, why = state(dest, now)
        if args.check:
            print(f"{experiment}: {status}" + (f" ({why})" if why else ""))
            continue
        if status == "fresh" and not args.force:
            print(f"{experiment}: fresh (same job configs and code), kept ({dest})")
            continue
        if status == "stale" and args.reuse_stale:
            print(f"warning: {experiment}: stale ({why}); reused as --reuse-stale asks ({dest})")
            continue
        if status == "stale" and not args.force:
            print(f"{experiment}: stale ({why}); running it again")
        if dest.exists():
            stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            kind = "previous" if args.force else "stale" if status == "stale" else "incomplete"
            aside = dest.with_name(f"{experiment}.{kind}-{stamp}")
            n = 1
            while aside.exists():  # two in the same second
                n += 1
                aside = dest.with_name(f"{experiment}.{kind}-{stamp}-{n}")
            dest.rename(aside)
            print(f"{experiment}: earlier results moved to {aside}")
        started, t0 = _now(), time.monotonic()
        print(f"{experiment}: {paths.EXPERIMENTS[experiment]}", flush=True)
        jobs = run_sweep(experiment, dest, overrides)
        seconds = time.monotonic() - t0
        if jobs != len(now.jobs):
            print(
                f"warning: {experiment}: Hydra launched {jobs} jobs, the key was computed over "
                f"{len(now.jobs)}",
                file=sys.stderr,
            )
        record = {
            "experiment": experiment,
            "size": args.size,
            "jobs": jobs,
            "cluster": cluster,
            "cluster_note": cluster_note,
            "scale_note": scale_note,
            "data": data_note,
            "overrides": overrides,
            "commit": commit,
            **now.record(),
            "host": {"cores": os.cpu_count(), "machine": platform.machine()},
            "started": started,
            "finished": _now(),
            "seconds": round(seconds, 1),
        }
        files.write_text(dest / COMPLETE, json.dumps(record, indent=1))
        print(f"{experiment}: {jobs} runs in {seconds:.0f} s -> {dest}", flush=True)
    if args.only is None or table_ddp.NAME in args.only:
        ddp_plain(
            args.results,
            args.size,
            code,
            commit,
            runs=args.ddp_plain_runs,
            steps=args.ddp_plain_steps,
            check=args.check,
            force=args.force,
        )
    return 0


def ddp_plain(
    results: Path,
    size: str,
    code: str,
    commit: str | None,
    runs: int = 5,
    steps: int = 300,
    check: bool = False,
    force: bool = False,
) -> None:
    """dcoded's DDP beside a plain torchrun DDP script (:mod:`paper.ddp_plain`), ``runs`` of
    each in turn, on this host's loopback; kept while the code and the runs are the same."""
    dest = table_ddp.record_path(results, size)
    record = json.loads(dest.read_text()) if dest.exists() else None
    same = record is not None and (
        record.get("code"),
        record.get("steps"),
        len(record.get("plain_ms", ())),
    ) == (code, steps, runs)
    status = "missing" if record is None else "fresh" if same else "stale"
    if check:
        print(f"{table_ddp.NAME}: {status}")
        return
    if status == "fresh" and not force:
        print(f"{table_ddp.NAME}: fresh (same code and runs), kept ({dest})")
        return
    print(f"{table_ddp.NAME}: dcoded's DDP beside a plain torchrun DDP script", flush=True)
    t0 = time.monotonic()
    tmp = dest.with_suffix(".running.json")
    cmd = [sys.executable, str(paths.PAPER / "ddp_plain.py"), "--compare", "--runs", str(runs)]
    done = subprocess.run(
        [*cmd, "--steps", str(steps), "--out", str(tmp)],
        cwd=paths.ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(
            f"error: {table_ddp.NAME} failed (status {done.returncode}):\n"
            + "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        )
    seconds = time.monotonic() - t0
    got = json.loads(tmp.read_text())
    files.write_text(
        dest,
        json.dumps(
            {**got, "code": code, "commit": commit, "finished": _now(), "seconds": seconds},
            indent=1,
        ),
    )
    tmp.unlink()
    print(f"{table_ddp.NAME}: {done.stdout.strip().splitlines()[-1]} ({seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
