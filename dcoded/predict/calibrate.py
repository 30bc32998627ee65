"""A calibration of :mod:`dcoded.predict` from measured runs: fitting each family's costs and
each model's compute rate, comparing a calibration with runs, and timing one worker here.

    python -m dcoded.predict --fit SWEEP_DIR ... [--hold-out-K 12,16]     # fit, with hold-outs
    python -m dcoded.predict --compare SWEEP_DIR ...                       # predicted vs measured
    python -m dcoded.predict --measure-rate model=dnn dataset=synthetic   # one worker's rate
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dcoded.errors import ConfigError
from dcoded.predict import (
    FAMILIES,
    Calibration,
    Costs,
    ImpossibleLayout,
    Scenario,
    hosts_sharing,
    map_calls,
    predict,
    scenario_of,
)

#: What a fit can hold out of its runs (``--hold-out-K``, ``-rate``, ``-rack``, ``-model``): by
#: the name ``fitted_on`` keeps it under (``held_out_<name>``), the scenario's field it reads.
HOLD_OUTS = {"K": "n_workers", "rate_mbit": "rate_mbit", "rack_size": "rack_size", "model": "model"}


def compact(summary: Mapping) -> dict:
    """What :func:`scenario_of` reads of a summary, and the measured median step (and under
    the scale model, its model, undilated step and fidelity): a run kept small enough to check
    a calibration against (``--record``)."""
    env = summary.get("environment") or {}
    keys = ("algorithm", "n_workers", "n_params", "batch_size", "redundancy", "group_size")
    keys += ("shuffle", "hybrid_m", "transport", "model")
    return {
        **{k: summary.get(k) for k in keys},
        "environment": {
            "cores": env.get("cores"),
            "netem": env.get("netem"),
            "per_worker": {
                w: {"host": v.get("host")} for w, v in env.get("per_worker", {}).items()
            },
        },
        "time_s": {"step_median": summary["time_s"]["step_median"]},
        **(
            {
                "scale_model": {
                    k: v for k, v in summary["scale_model"].items() if k != "hosts_used"
                },
                "time_s_undilated": {"step_median": measured_step(summary)},
                "fidelity": {k: (summary.get("fidelity") or {}).get(k) for k in ("ok", "problems")},
            }
            if summary.get("scale_model")
            else {}
        ),
    }


def measured_step(summary: Mapping) -> float:
    """The run's median step (seconds): what a prediction is compared with; under the scale
    model, the emulated cluster's (``time_s_undilated``: the wall times over its TDF).

    >>> measured_step({"time_s": {"step_median": 0.5}})
    0.5
    >>> measured_step({"time_s": {"step_median": 2.0}, "scale_model": {"tdf": 4.0},
    ...     "time_s_undilated": {"step_median": 0.5}})
    0.5
    """
    times = summary["time_s_undilated"] if summary.get("scale_model") else summary["time_s"]
    return float(times["step_median"])


def measured_map(summary: Mapping) -> float | None:
    """The run's median map (seconds, undilated under the scale model): the busiest worker's
    gradients of a step, or ``None`` where the summary does not say (a ``--record``ed run)."""
    times = summary.get("time_s_undilated") if summary.get("scale_model") else summary["time_s"]
    value = (times or {}).get("map")
    return float(value) if value else None


#: The algorithms whose ``map`` is one call of the gradients alone (ddp's all-reduce runs
#: inside its backward pass, and cdc's map sends what each sub-batch made ready).
PURE_MAP = ("ssgd", "asgd")


def fit_compute(
    summaries: Sequence[Mapping], measured: Mapping[str, Mapping[str, float]]
) -> dict[str, dict]:
    """Per model, the compute rate its runs' own maps show (``map = sharing x (samples / rate
    + per_call)``, least relative squares, non-negative), from the runs whose map is one call
    of the gradients alone (:data:`PURE_MAP`; cdc's map also sends what each sub-batch made
    ready, which its family's ``per_sub_batch_s`` takes): one worker's compute as the workers
    ran it, where ``--measure-rate`` times one process alone. A model with fewer than two
    such runs keeps the rate it was given (``measured``); a fitted one says on how many runs.

    >>> runs = [{"algorithm": "ssgd", "n_workers": K, "batch_size": 240, "model": "m",
    ...          "n_params": 10, "time_s": {"step_median": 1.0, "map": 0.002 + 240 / K / 1e3}}
    ...         for K in (4, 6, 8)]
    >>> got = fit_compute(runs, {"cnn": {"samples_per_s": 50.0}})
    >>> round(got["m"]["samples_per_s"]), round(1e3 * got["m"]["per_call_s"], 3), got["m"]["runs"]
    (1000, 2.0, 3)
    >>> got["cnn"]
    {'samples_per_s': 50.0}
    """
    import numpy as np
    from scipy.optimize import nnls

    rows: dict[str, list] = {}
    for summary in summaries:
        y = measured_map(summary)
        s = scenario_of(summary)
        if y is None or s.algorithm not in PURE_MAP:
            continue
        samples, calls = map_calls(s)
        share = hosts_sharing(s)
        rows.setdefault(s.model, []).append(([share * samples / y, share * calls / y], 1.0))
    out = {m: dict(c) for m, c in measured.items()}
    for model, data in rows.items():
        A = np.array([a for a, _ in data])
        if len(data) < 2:
            continue
        (inverse_rate, per_call), _ = nnls(A, np.ones(len(data)))
        if inverse_rate <= 0:
            continue
        out[model] = {
            "samples_per_s": float(1 / inverse_rate),
            "per_call_s": float(per_call),
            "runs": len(data),
        }
    return out


def faithful(summary: Mapping) -> bool:
    """Whether a run's times stand for the cluster it ran as: every run's but a scale-model
    run's outside its fidelity (``fidelity.ok`` not true)."""
    return not summary.get("scale_model") or bool((summary.get("fidelity") or {}).get("ok"))


def run_name(summary: Mapping) -> str:
    """A run, named in a message: its ``summary.json``'s path, else what it was."""
    return summary.get("_path") or scenario_of(summary).describe()


def held_out_by(s: Scenario, held: Mapping[str, Iterable]) -> list[str]:
    """Which of a fit's hold-outs leave ``s`` out of it (``held``: by name of :data:`HOLD_OUTS`,
    the values it held out).

    >>> s = Scenario("ddp", 12, 1000, 960, 50.0)
    >>> held_out_by(s, {"K": [12, 16], "rate_mbit": [50.0], "model": ["cnn"]})
    ['K', 'rate_mbit']
    """
    return [name for name, f in HOLD_OUTS.items() if getattr(s, f) in held.get(name, ())]


def held_outs(fitted_on: Mapping) -> dict[str, list]:
    """What a calibration's fit held out (``held_out_<name>``), by name of :data:`HOLD_OUTS`."""
    return {name: list(fitted_on.get(f"held_out_{name}") or []) for name in HOLD_OUTS}


def load_summaries(paths: Iterable[Path]) -> list[dict]:
    """Every finished run's ``summary.json`` under the given run or sweep folders, and the runs
    of files written by ``--record``."""
    out = []
    for root in paths:
        root = Path(root)
        if root.is_file() and root.name != "summary.json":  # runs kept by --record
            out += json.loads(root.read_text())
            continue
        found = [root] if root.name == "summary.json" else sorted(root.rglob("summary.json"))
        for f in found:
            s = json.loads(f.read_text())
            if s.get("status", "finished") == "finished" and s.get("time_s", {}).get("step_median"):
                s["_path"] = str(f)
                out.append(s)
    return out


def fit(
    summaries: Sequence[Mapping],
    compute: Mapping[str, Mapping[str, float]],
    hold_out: Iterable[int] = (),
    hold_out_rate: Iterable[float] = (),
    hold_out_rack: Iterable[int] = (),
    hold_out_model: Iterable[str] = (),
) -> Calibration:
    """Each family's :class:`Costs` by least relative squares (non-negative) on the runs that no
    hold-out leaves out (by their ``K``, link rate in Mbit/s, rack size or model): ``measured -
    compute = link_overhead * bound + per_message_s * messages * sharing + per_step_s``. A
    scale-model run outside its fidelity is left out of everything, with a note. ``fitted_on``
    keeps the hold-outs (``held_out_<name>``), the domain of the runs, held-out ones included,
    and each family's error on the fitted runs and on the held-out ones (:func:`errors`)."""

    held = {
        "K": sorted(set(hold_out)),
        "rate_mbit": sorted({float(x) for x in hold_out_rate}),
        "rack_size": sorted(set(hold_out_rack)),
        "model": sorted(set(hold_out_model)),
    }
    kept = _faithful_only(summaries)
    fitted_runs = [m for m in kept if not held_out_by(scenario_of(m), held)]
    compute = fit_compute(fitted_runs, compute)
    base = Calibration({f: Costs() for f in FAMILIES}, compute)
    rows, used, domain = _fit_rows(kept, held, base)
    costs = {**base.costs, **{family: _solve(family, data) for family, data in rows.items()}}
    fitted_on = {
        "runs": {f: len(v) for f, v in used.items()},
        **{f"held_out_{name}": values for name, values in held.items()},
        "domain": {f: _domain_ranges(d) for f, d in domain.items() if f in used},
    }
    fitted = Calibration(costs, compute, fitted_on)
    found = errors(compare(kept, fitted))
    fitted_on["error_pct"] = {f: e for f, e in found.items() if f in used}
    return fitted


def _fit_rows(
    kept: Sequence[Mapping], held: Mapping[str, list], base: Calibration
) -> tuple[dict[str, list], dict[str, list], dict[str, dict]]:
    """Per family, ``(rows, used, domain)`` of the runs ``kept``: the rows ``(a, b)`` of its
    least squares and the paths of their runs, from the runs no hold-out (``held``) leaves
    out, and what all its runs span, held-out ones included (``base``: the costs at zero; a
    layout it finds impossible is left out of all three)."""
    rows: dict[str, list] = {}
    used: dict[str, list] = {}
    domain: dict[str, dict] = {}
    for summary in kept:
        s = scenario_of(summary)
        try:
            p = predict(s, base)
        except ImpossibleLayout:
            continue
        d = domain.setdefault(
            s.family, {"K": [], "rate_mbit": [], "topologies": set(), "models": set(),
                       "hosts": set()}
        )  # fmt: skip
        d["K"].append(s.n_workers)
        d["rate_mbit"].append(s.rate_mbit)
        d["topologies"].add(s.topology)
        d["models"].add(s.model)
        d["hosts"].add(s.hosts)
        if held_out_by(s, held):
            continue
        y = measured_step(summary)
        share = hosts_sharing(s)
        calls = map_calls(s)[1] * share
        moves = 1.0 if p.bound_s else 0.0  # a step that sends nothing pays no exchange
        rows.setdefault(s.family, []).append(
            (
                [p.bound_s / y, p.messages * share / y, moves / y, calls / y, moves * share / y],
                1.0 - (p.compute_s - p.bucket_s) / y,
            )
        )
        used.setdefault(s.family, []).append(summary.get("_path", ""))
    return rows, used, domain


def _domain_ranges(d: Mapping) -> dict:
    """A family's domain as ``fitted_on`` keeps it: the least and most ``K`` and link rate,
    the topologies, models and hosts, sorted."""
    return {
        "K": [min(d["K"]), max(d["K"])],
        "rate_mbit": [min(d["rate_mbit"]), max(d["rate_mbit"])],
        "topologies": sorted(d["topologies"]),
        "models": sorted(d["models"]),
        "hosts": sorted(d["hosts"]),  # where the workers ran (HOSTS)
    }


def _faithful_only(summaries: Sequence[Mapping]) -> list[Mapping]:
    """The runs whose times stand for their cluster; a note on stderr for each left out."""
    kept = []
    for summary in summaries:
        if faithful(summary):
            kept.append(summary)
            continue
        problems = (summary.get("fidelity") or {}).get("problems") or ["not checked"]
        print(
            f"note: left out of the fit, outside the scale model's fidelity "
            f"({'; '.join(problems)}): {run_name(summary)}",
            file=sys.stderr,
        )
    return kept


def _solve(family: str, data: list) -> Costs:
    """One family's costs by non-negative least squares on its rows ``(a, b)``; the links
    never beat their bound: ``link_overhead`` is 1 plus a non-negative excess."""
    import numpy as np
    from scipy.optimize import nnls

    A = np.array([a for a, _ in data])
    b = np.array([v for _, v in data])
    if not family.startswith("cdc"):  # one call a step: per sub-batch is per step CPU
        A[:, 3] = 0.0
    x, _ = nnls(A, b - A[:, 0])
    return Costs(
        link_overhead=1.0 + float(x[0]),
        per_message_s=float(x[1]),
        per_step_s=float(x[2]),
        per_sub_batch_s=float(x[3]),
        per_step_cpu_s=float(x[4]),
    )


def errors(rows: Iterable[Mapping]) -> dict[str, dict]:
    """Per family, the error (percent of the measured median step, its size) of :func:`compare`'s
    rows: the worst on the fitted runs (``fitted``) and on the held-out ones (``held_out``;
    ``None``: none), the mean of each (``mean``), and per hold-out that left runs out
    (``held_out_by``: a run held out by two is in both) their number, mean and worst.

    >>> rows = [{"family": "ddp", "error_pct": e, "held_out_by": by}
    ...     for e, by in [(2.0, []), (-4.0, []), (10.0, ["K"]), (-6.0, ["K", "model"])]]
    >>> errors(rows)["ddp"]  # doctest: +NORMALIZE_WHITESPACE
    {'fitted': 4.0, 'held_out': 10.0, 'mean': {'fitted': 3.0, 'held_out': 8.0},
     'held_out_by': {'K': {'runs': 2, 'mean': 8.0, 'worst': 10.0},
                     'model': {'runs': 1, 'mean': 6.0, 'worst': 6.0}}}
    """
    found: dict[str, dict[str, list]] = {}
    for row in rows:
        groups = found.setdefault(row["family"], {"fitted": [], "held_out": []})
        size = abs(row["error_pct"])
        for name in ["held_out", *row["held_out_by"]] if row["held_out_by"] else ["fitted"]:
            groups.setdefault(name, []).append(size)
    worst = lambda x: max(x) if x else None  # noqa: E731
    mean = lambda x: round(sum(x) / len(x), 1) if x else None  # noqa: E731
    return {
        family: {
            "fitted": worst(g["fitted"]) or 0.0,
            "held_out": worst(g["held_out"]),
            "mean": {"fitted": mean(g["fitted"]) or 0.0, "held_out": mean(g["held_out"])},
            "held_out_by": {
                name: {"runs": len(x), "mean": mean(x), "worst": worst(x)}
                for name, x in g.items()
                if name in HOLD_OUTS
            },
        }
        for family, g in found.items()
    }


def compare(summaries: Sequence[Mapping], cal: Calibration | None = None) -> list[dict]:
    """Per run: predicted and measured median step (ms) and the error, in percent; whether
    the calibration's fit held it out, and by which hold-outs (``held_out_by``); and whether
    its times are faithful (:func:`faithful`)."""
    cal = cal or Calibration.load()
    held = held_outs(cal.fitted_on)
    out = []
    for summary in summaries:
        s = scenario_of(summary)
        try:
            p = predict(s, cal)
        except ImpossibleLayout:
            continue
        y = measured_step(summary)
        by = held_out_by(s, held)
        out.append(
            {
                "run": s.describe(),
                "K": s.n_workers,
                "topology": s.topology,
                "family": s.family,
                "held_out": bool(by),
                "held_out_by": by,
                "predicted_ms": round(1e3 * p.step_s, 2),
                "measured_ms": round(1e3 * y, 2),
                "bound_ms": round(1e3 * p.bound_s, 2),
                "error_pct": round(100 * (p.step_s - y) / y, 1),
                "outside": list(p.outside),
                "faithful": faithful(summary),
            }
        )
    return out


def measure_rate(overrides: Sequence[str] = (), sizes=(1, 4, 16, 64), repeats: int = 20) -> dict:
    """One worker's compute, measured here: the gradient of ``n`` samples for each ``n`` in
    ``sizes`` (one torch thread, as in every worker), the least time of ``repeats``, fitted as
    ``per_call_s + n / samples_per_s``."""
    import time

    import numpy as np

    from dcoded.config import build_spec, compose_config
    from dcoded.engine.replica import Replica

    try:
        cfg = compose_config(["cluster=local", *overrides])
    except ConfigError as e:  # one line naming the nearest settings, with the flag
        raise ConfigError(f"--measure-rate {' '.join(overrides)}: {e}") from None
    spec, _, _ = build_spec(cfg)
    replica = Replica(spec)
    order = np.arange(max(sizes))
    times = []
    for n in sizes:
        replica.grad_sum(order[:n])  # warm up this size
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            replica.grad_sum(order[:n])
            best = min(best, time.perf_counter() - t0)
        times.append(best)
    slope, intercept = np.polyfit(np.array(sizes, float), np.array(times), 1)
    return {
        "model": cfg.model.name,
        "samples_per_s": float(1 / slope),
        "per_call_s": float(max(intercept, 0.0)),
        "n_params": replica.n_params,
    }
