"""The scale model checked: invariance, an undilated truth, and Table 1 both ways.

    sudo .venv/bin/python -m paper.scale_check [--only invariance truth table1 calibration
                                                predict] [--steps N] [--out paper/scale]

Every run is Table 1's condition (MNIST-sized synthetic data, B = 240, links of 100 Mbit/s on
a switch, SGD) on the emulated network, for ``--steps`` steps; the median step is compared.

- ``invariance``: the same run at the least TDF this machine allows and at twice it, K = 4 and
  K = 8, for ddp, cdc r = 2 and cdc r = 3, dnn and cnn: the undilated median steps should agree
  within 10%. The run at the least TDF is made again after the one at twice it: the comparison
  is against the mean of the two, and their difference is the machine's own noise (it drifts
  by more than 10% over an hour).
- ``truth``: K = 2 workers, each pinned to a core of its own, without the scale model (with two
  cores the scheduler and the driver cannot be kept off the workers' cores: they are mostly
  idle while the workers compute, and they share what is left), against the same run under the
  scale model at two factors; the pinned run is made again after them, as above.
- ``table1``: K = 4, dnn and cnn, ssgd, ddp and cdc at r = 1..4, on the contended host (every
  host sharing the cores freely) and under the scale model.
- ``calibration``: more runs to fit ``dcoded.predict`` on: 400 Mbit/s (K = 4, 8), racks of 2
  and 3 (K = 4, 6), ssgd, ddp and cdc r = 2, dnn and cnn.
- ``predict``: ``dcoded.predict`` fitted on all these runs once per hold-out (K = 8, 400
  Mbit/s, racks of 3, each model), and its error on the runs held out.

Each part writes its rows to ``OUT/<part>.json`` as it goes (a part already there is read, not
run again, unless ``--force``), and ``OUT/SCALE.md`` is rewritten from all of them at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dcoded import files, scale
from dcoded.config import compose_config
from dcoded.netem import release_shared
from dcoded.run import run

BASE = [
    "cluster=netem",
    "dataset=synthetic",
    "cluster.bandwidth_mbit=100",
    "train.batch_size=240",
    "train.eval_every=0",
    "progress=false",
]
ALGORITHMS = {
    "ssgd": ["algorithm=ssgd"],
    "ddp": ["algorithm=ddp"],
    **{f"cdc r={r}": ["algorithm=cdc", f"coding.redundancy={r}"] for r in (1, 2, 3, 4)},
}
TOLERANCE = 0.10
KEEP_RUNS = False  # --keep-runs


def _slug(name: str) -> str:
    return name.replace(" ", "")


def _one(overrides: list[str], out: Path) -> dict:
    """One run; its undilated median step (ms), TDF and fidelity."""
    t0 = time.monotonic()
    done = out / "summary.json"
    if KEEP_RUNS and done.is_file() and json.loads(done.read_text()).get("status") == "finished":
        s = json.loads(done.read_text())  # --keep-runs: a run an interrupted check finished
    else:
        s = run(compose_config([*BASE, *overrides]), out_dir=out, reuse_cluster=True)
    times = s.get("time_s_undilated") or s["time_s"]
    fid = s.get("fidelity")
    row = {
        "overrides": overrides,
        "step_ms": 1e3 * times["step_median"],
        "map_ms": 1e3 * (times.get("map") or 0.0),
        "wall_step_ms": 1e3 * s["time_s"]["step_median"],
        "tdf": (s.get("scale_model") or {}).get("tdf", 1.0),
        "fidelity": None if fid is None else fid["ok"],
        "problems": None if fid is None else fid["problems"],
        "idle_median": None if fid is None else fid["idle"]["median"],
        "softirq_max": None if fid is None else fid["idle"]["softirq_max"],
        "speed": ((s.get("scale_model") or {}).get("compute") or {}).get("speed"),
        "param_sha256": s["param_sha256"],
        "run_s": round(time.monotonic() - t0, 1),
    }
    print(
        f"  {' '.join(overrides)}: {row['step_ms']:.1f} ms (TDF {row['tdf']:.2f}, fidelity "
        f"{row['fidelity']}) in {row['run_s']:.0f} s",
        flush=True,
    )
    return row


def invariance(out: Path, steps: int) -> list[dict]:
    rows = []
    for k in (4, 8):
        least = scale.plan(1, k + 2).tdf
        # x1 again after x2: the runs bracket x2 in time, and their difference is the noise
        for factor, again in ((1, False), (2, False), (1, True)):
            tdf = round(least * factor, 3) + 0.001  # above the least, whatever the rounding
            for model in ("dnn", "cnn"):
                for name in ("ddp", "cdc r=2", "cdc r=3"):
                    ov = [
                        f"cluster.n_workers={k}",
                        f"model={model}",
                        f"train.steps={steps}",
                        "cluster.scale_model=true",
                        f"cluster.dilation={tdf}",
                        *ALGORITHMS[name],
                    ]
                    tag = f"x{factor}{'-again' * again}"
                    row = _one(ov, out / "runs" / f"inv-K{k}-{tag}-{model}-{_slug(name)}")
                    rows.append(
                        {
                            "K": k,
                            "factor": factor,
                            "again": again,
                            "model": model,
                            "algorithm": name,
                            **row,
                        }
                    )
        release_shared()
    return rows


def truth(out: Path, steps: int) -> list[dict]:
    rows = []
    least = scale.plan(1, 4).tdf
    ways = {
        "pinned": ["cluster.pin_workers=true"],
        "scale x1": ["cluster.scale_model=true"],
        "scale x2": ["cluster.scale_model=true", f"cluster.dilation={2 * least + 0.001:.3f}"],
        # the truth again: the two bracket the scale runs in time, their difference is the noise
        "pinned again": ["cluster.pin_workers=true"],
    }
    for way, extra in ways.items():
        for model in ("dnn", "cnn"):
            for name in ("ddp", "cdc r=1", "cdc r=2"):
                ov = ["cluster.n_workers=2", f"model={model}", f"train.steps={steps}", *extra]
                row = _one(
                    [*ov, *ALGORITHMS[name]],
                    out / "runs" / f"truth-{way}-{model}-{name.replace(' ', '')}",
                )
                rows.append({"way": way, "model": model, "algorithm": name, **row})
        release_shared()
    return rows


def table1(out: Path, steps: int) -> list[dict]:
    rows = []
    for way, extra in {"contended": [], "scale model": ["cluster.scale_model=true"]}.items():
        for model in ("dnn", "cnn"):
            for name, ov in ALGORITHMS.items():
                ov = ["cluster.n_workers=4", f"model={model}", f"train.steps={steps}", *extra, *ov]
                row = _one(ov, out / "runs" / f"t1-{_slug(way)}-{model}-{name.replace(' ', '')}")
                rows.append({"way": way, "model": model, "algorithm": name, **row})
        release_shared()
    return rows


def calibration(out: Path, steps: int) -> list[dict]:
    """Runs for fitting ``dcoded.predict`` under the scale model beside the ones above (K = 4
    and 8 at 100 Mbit/s): the same at 400 Mbit/s (a rate four times faster, to hold out), and
    on racks of 2 and of 3 (K = 4 and 6, uplinks of 100 Mbit/s)."""
    rows = []
    shapes = [
        (k, [f"cluster.n_workers={k}", "cluster.bandwidth_mbit=400"], f"K{k}-400") for k in (4, 8)
    ]
    shapes += [
        (
            k,
            [
                f"cluster.n_workers={k}",
                "cluster.topology=racks",
                f"cluster.rack_size={k // 2}",
                "cluster.uplink_mbit=100",
            ],
            f"K{k}-racks{k // 2}",
        )
        for k in (4, 6)
    ]
    for _k, shape, tag in shapes:
        for model in ("dnn", "cnn"):
            for name in ("ssgd", "ddp", "cdc r=2"):
                ov = [*shape, f"model={model}", f"train.steps={steps}", "cluster.scale_model=true"]
                row = _one(
                    [*ov, *ALGORITHMS[name]], out / "runs" / f"cal-{tag}-{model}-{_slug(name)}"
                )
                rows.append({"shape": tag, "model": model, "algorithm": name, **row})
        release_shared()
    return rows


#: ``dcoded.predict``'s hold-outs: (name, the fit's keyword, the values left out).
HOLD_OUTS = [
    ("K = 8", "hold_out", [8]),
    ("400 Mbit/s", "hold_out_rate", [400.0]),
    ("racks of 3", "hold_out_rack", [3]),
    ("cnn", "hold_out_model", ["cnn"]),
    ("dnn", "hold_out_model", ["dnn"]),
]


def predict(out: Path, steps: int) -> list[dict]:
    """``dcoded.predict`` fitted on every run above (the scale model's and the contended
    host's), once per hold-out, and its error on the runs each left out; each model's rate
    measured here alone too (a model held out has only that). Writes the calibration fitted
    with K = 8 held out to ``OUT/predict_calibration.json``."""
    from dcoded.predict.calibrate import fit, load_summaries, measure_rate

    summaries = load_summaries([out / "runs"])
    compute = {}
    for model in ("dnn", "cnn"):
        rate = measure_rate(["dataset=synthetic", f"model={model}"])
        compute[model] = {k: rate[k] for k in ("samples_per_s", "per_call_s")}
    rows = []
    for name, keyword, values in HOLD_OUTS:
        cal = fit(summaries, compute, **{keyword: values})
        if keyword == "hold_out":
            cal.save(out / "predict_calibration.json")
        for family, e in sorted(cal.fitted_on["error_pct"].items()):
            by = next(iter((e.get("held_out_by") or {}).values()), None)
            rows.append(
                {
                    "held_out": name,
                    "family": family,
                    "fitted_runs": cal.fitted_on["runs"][family],
                    "fitted_mean": e["mean"]["fitted"],
                    "fitted_worst": e["fitted"],
                    "held_out_runs": by["runs"] if by else 0,
                    "held_out_mean": by["mean"] if by else None,
                    "held_out_worst": by["worst"] if by else None,
                    "compute": {m: cal.compute[m].get("runs", "measured") for m in cal.compute},
                }
            )
    return rows


PARTS = {
    "invariance": invariance,
    "truth": truth,
    "table1": table1,
    "calibration": calibration,
    "predict": predict,
}


def _pct(a: float, b: float) -> str:
    return f"{100 * (a / b - 1):+.1f}%"


def report(out: Path) -> str:
    lines = ["# The scale model, checked", ""]
    lines += [
        "Generated by `python -m paper.scale_check`; every time is the undilated median step "
        "(ms) over the run's steps. Table 1's condition: MNIST-sized synthetic data, B = 240, "
        "links of 100 Mbit/s on a switch.",
        "",
    ]
    path = out / "invariance.json"
    if path.exists():
        rows = json.loads(path.read_text())
        lines += [
            "## Invariance: the same run at two dilation factors",
            "",
            "The run at the least TDF is made twice, before and after the one at twice it; the "
            "difference is against their mean, and the two differ by the machine's own noise.",
            "",
            "| K | model | algorithm | TDF | step ms | again | TDF x2 | step ms | difference "
            "| within 10% |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        noise = []
        for a in (r for r in rows if r["factor"] == 1 and not r.get("again")):
            same = [
                r for r in rows if (r["K"], r["model"], r["algorithm"]) == _key(a, "K", "model")
            ]
            b = next(r for r in same if r["factor"] == 2)
            again = next((r for r in same if r.get("again")), None)
            base = _mean_step(a, again)
            ok = abs(b["step_ms"] / base - 1) <= TOLERANCE
            if again:
                noise.append(abs(again["step_ms"] / a["step_ms"] - 1))
            lines.append(
                f"| {a['K']} | {a['model']} | {a['algorithm']} | {a['tdf']:.2f} | "
                f"{a['step_ms']:.1f} | {_ms(again)} | {b['tdf']:.2f} | {b['step_ms']:.1f} | "
                f"{_pct(b['step_ms'], base)} | {'yes' if ok else 'NO'} |"
            )
        lines += ["", *([_noise_line(noise)] if noise else []), _fidelity_line(rows), ""]
    path = out / "truth.json"
    if path.exists():
        rows = json.loads(path.read_text())
        lines += [
            "## Against the truth: K = 2 workers, each pinned to a core of its own",
            "",
            "The pinned run is made before and after the scale model's; each difference is "
            "against their mean.",
            "",
            "| model | algorithm | pinned, undilated | again | scale x1 | vs pinned | scale x2 "
            "| vs pinned |",
            "|---|---|---|---|---|---|---|---|",
        ]
        noise = []
        for t in (r for r in rows if r["way"] == "pinned"):
            got = {r["way"]: r for r in rows if _key(r, "model") == _key(t, "model")}
            a, b, again = got["scale x1"], got["scale x2"], got.get("pinned again")
            base = _mean_step(t, again)
            if again:
                noise.append(abs(again["step_ms"] / t["step_ms"] - 1))
            lines.append(
                f"| {t['model']} | {t['algorithm']} | {t['step_ms']:.1f} | {_ms(again)} | "
                f"{a['step_ms']:.1f} (TDF {a['tdf']:.2f}) | {_pct(a['step_ms'], base)} | "
                f"{b['step_ms']:.1f} (TDF {b['tdf']:.2f}) | {_pct(b['step_ms'], base)} |"
            )
        scaled = [r for r in rows if r["way"].startswith("scale")]
        lines += ["", *([_noise_line(noise)] if noise else []), _fidelity_line(scaled), ""]
    path = out / "table1.json"
    if path.exists():
        rows = json.loads(path.read_text())
        lines += [
            "## Table 1 (K = 4) on the contended host and under the scale model",
            "",
            "| model | algorithm | contended ms | vs ssgd | map ms | scale model ms | vs ssgd "
            "| map ms |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for model in ("dnn", "cnn"):
            by = {(r["way"], r["algorithm"]): r for r in rows if r["model"] == model}
            for name in ALGORITHMS:
                c, s = by.get(("contended", name)), by.get(("scale model", name))
                if not c or not s:
                    continue
                c0, s0 = by[("contended", "ssgd")], by[("scale model", "ssgd")]
                lines.append(
                    f"| {model} | {name} | {c['step_ms']:.1f} | "
                    f"{c['step_ms'] / c0['step_ms']:.2f} | {c['map_ms']:.1f} | "
                    f"{s['step_ms']:.1f} | {s['step_ms'] / s0['step_ms']:.2f} | "
                    f"{s['map_ms']:.1f} |"
                )
        lines += ["", _fidelity_line([r for r in rows if r["way"] == "scale model"]), ""]
    path = out / "predict.json"
    if path.exists():
        rows = json.loads(path.read_text())
        lines += [
            "## dcoded.predict fitted on these runs, with runs held out",
            "",
            "Every run above (the scale model's, undilated, and the contended host's) but those "
            "outside fidelity; one fit per hold-out. The error is the percent of the measured "
            "median step: mean / worst. Each model's compute rate is the one its fitted runs' "
            "ssgd maps show; a held-out model's is the one measured here alone. Each exchange "
            "phase is predicted less what the emulated links' token buckets pass at full speed "
            "after idle (about 4 ms), and a step at r = K, which sends nothing, without the "
            "exchange's per-step costs.",
            "",
            "| held out | family | fitted runs | error on them | held-out runs | error on them |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            held = (
                f"{r['held_out_mean']:.1f}% / {r['held_out_worst']:.1f}%"
                if r["held_out_runs"]
                else "-"
            )
            lines.append(
                f"| {r['held_out']} | {r['family']} | {r['fitted_runs']} | "
                f"{r['fitted_mean']:.1f}% / {r['fitted_worst']:.1f}% | {r['held_out_runs']} | "
                f"{held} |"
            )
        lines.append("")
    return "\n".join(lines)


def _key(row: dict, *first: str) -> tuple:
    """The run's configuration: ``first`` fields, then the algorithm."""
    return (*(row[f] for f in first), row["algorithm"])


def _mean_step(row: dict, again: dict | None) -> float:
    return row["step_ms"] if again is None else (row["step_ms"] + again["step_ms"]) / 2


def _ms(row: dict | None) -> str:
    return "-" if row is None else f"{row['step_ms']:.1f}"


def _noise_line(noise: list[float]) -> str:
    """The machine's own noise: a run made twice, a few minutes apart."""
    noise = sorted(noise)
    return (
        f"The same run made twice differed by {100 * noise[len(noise) // 2]:.1f}% (median) and "
        f"{100 * noise[-1]:.1f}% at most."
    )


def _fidelity_line(rows: list[dict]) -> str:
    scaled = [r for r in rows if r["fidelity"] is not None]
    held = sum(bool(r["fidelity"]) for r in scaled)
    idle = sorted(r["idle_median"] for r in scaled if r["idle_median"] is not None)
    mid = (
        f"; the machine's median idle over a run {100 * idle[len(idle) // 2]:.0f}%" if idle else ""
    )
    soft = [r["softirq_max"] for r in scaled if r.get("softirq_max") is not None]
    if soft:
        mid += f"; the kernel's packet work (softirq) at most {100 * max(soft):.0f}% of the cores"
    speeds = sorted(r["speed"] for r in scaled if r.get("speed"))
    if speeds:
        mid += (
            f"; the hosts computed at {speeds[len(speeds) // 2]:.2f} of their unthrottled speed "
            f"under the quota (median of the runs' probes; {speeds[0]:.2f} to {speeds[-1]:.2f}), "
            "and their quotas were raised to match"
        )
    return f"Fidelity held in {held} of {len(scaled)} scale-model runs{mid}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paper.scale_check", description=__doc__)
    parser.add_argument("--only", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("paper/scale"))
    parser.add_argument("--force", action="store_true", help="run parts already written again")
    parser.add_argument(
        "--keep-runs", action="store_true", help="read runs an interrupted check finished"
    )
    args = parser.parse_args(argv)
    global KEEP_RUNS
    KEEP_RUNS = args.keep_runs
    args.out.mkdir(parents=True, exist_ok=True)
    for part in args.only:
        path = args.out / f"{part}.json"
        if path.exists() and not args.force:
            print(f"{part}: read from {path}")
            continue
        print(f"{part}:", flush=True)
        rows = PARTS[part](args.out, args.steps)
        files.write_text(path, json.dumps(rows, indent=1))
    text = report(args.out)
    files.write_text(args.out / "SCALE.md", text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
