"""``python -m dcoded.predict``: a layout's predicted step, a run's predicted beside its
measured one, and a calibration fitted, compared or given a compute rate (see
:mod:`dcoded.predict` and :mod:`dcoded.predict.calibrate`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path

from dcoded import files
from dcoded.coding.shuffles import SHUFFLES
from dcoded.errors import DcodedError
from dcoded.predict import (
    CALIBRATION_FILE,
    Calibration,
    ImpossibleLayout,
    Scenario,
    predict,
    scenario_of,
)
from dcoded.predict.calibrate import (
    compact,
    compare,
    fit,
    held_outs,
    load_summaries,
    measure_rate,
    measured_step,
)
from dcoded.topology import TOPOLOGIES


def _scenario_from_args(a: argparse.Namespace) -> Scenario:
    rate = a.rate_mbit if a.rate_mbit is not None else 1e3 * a.rate_gbit
    return Scenario(
        algorithm=a.algorithm,
        n_workers=a.K,
        n_params=int(a.d),
        batch_size=a.batch_size or 64 * a.K,
        rate_mbit=rate,
        redundancy=a.r,
        group_size=a.g,
        shuffle=a.shuffle,
        hybrid_m=a.m,
        transport=a.transport,
        topology=a.topology,
        rack_size=a.rack_size,
        pod_racks=a.pod_racks,
        oversubscription=a.oversubscription,
        model=a.model,
        samples_per_s=a.samples_per_s,
        per_call_s=a.per_call_s,
        cores=a.cores,
    )


def _positive(kind):
    """An argparse type: a number of ``kind`` above zero (a rate, a size, a count)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text} is not allowed: it must be above 0")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _listed(kind):
    """An argparse type: values of ``kind`` between commas (``12,16``); ``""``: none."""

    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a list such as 12,16") from None

    parse.__name__ = f"{kind.__name__} list"
    return parse


def _error_lines(error: Mapping, fitted_runs: int, held: Mapping[str, list]) -> list[str]:
    """A family's error (:func:`errors`) on the fitted runs and on each hold-out's, a line each.

    >>> error = {"mean": {"fitted": 3.0}, "fitted": 4.0,
    ...     "held_out_by": {"K": {"runs": 2, "mean": 8.0, "worst": 10.0}}}
    >>> print("\\n".join(_error_lines(error, 5, {"K": [12, 16]})))
      error on the 5 fitted runs: mean 3.0%, worst 4.0% (of the measured median step)
      error on the 2 runs held out by K=12,16: mean 8.0%, worst 10.0%
    """
    out = [
        f"  error on the {fitted_runs} fitted runs: mean {error['mean']['fitted']:.1f}%, "
        f"worst {error['fitted']:.1f}% (of the measured median step)"
    ]
    for name, e in (error.get("held_out_by") or {}).items():
        values = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in held[name])
        out.append(
            f"  error on the {e['runs']} runs held out by {name}={values}: mean "
            f"{e['mean']:.1f}%, worst {e['worst']:.1f}%"
        )
    return out


def _engine_default(name: str):
    """``coding.<name>`` as ``python -m dcoded`` has it by default."""
    from dcoded.config import config_defaults

    return config_defaults()["coding"][name]


def main(argv: list[str] | None = None) -> int:
    """``python -m dcoded.predict``: the command its flags name (:func:`_command`); its exit
    status, 2 with one line where the input is bad (a missing rate or file)."""
    a = _parser().parse_args(argv)
    try:
        return _command(a)
    except DcodedError as e:  # bad input, a missing rate or file: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    """The command line: what to do (a scenario's step by default, else one of the commands)
    with the commands' options, then the scenario's flags (:func:`_add_scenario`)."""
    parser = argparse.ArgumentParser(
        prog="python -m dcoded.predict",
        description="The predicted step time of a layout on a network (see the module's doc).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--summary", type=Path, help="predict this run's step from its config")
    what.add_argument("--fit", nargs="+", type=Path, metavar="DIR", help="fit the costs on runs")
    what.add_argument(
        "--compare", nargs="+", type=Path, metavar="DIR", help="predicted vs measured"
    )
    what.add_argument("--measure-rate", nargs="*", metavar="OVERRIDE", help="time one worker here")
    what.add_argument(
        "--record", nargs="+", type=Path, metavar=("OUT", "DIR"), help="keep runs, compacted"
    )
    parser.add_argument(
        "--hold-out-K", type=_listed(int), default="", help="--fit: K values left out, e.g. 12,16"
    )
    parser.add_argument(
        "--hold-out-rate",
        type=_listed(float),
        default="",
        help="--fit: link rates left out (Mbit/s)",
    )
    parser.add_argument(
        "--hold-out-rack", type=_listed(int), default="", help="--fit: rack sizes left out"
    )
    parser.add_argument(
        "--hold-out-model", type=_listed(str), default="", help="--fit: models left out, e.g. cnn"
    )
    parser.add_argument("--calibration", type=Path, default=CALIBRATION_FILE)
    _add_scenario(parser)
    return parser


def _add_scenario(parser: argparse.ArgumentParser) -> None:
    """The flags of the scenario whose step is predicted (:func:`_scenario_from_args`)."""
    parser.add_argument("--algorithm", default="cdc", choices=["cdc", "ddp", "ssgd", "asgd"])
    parser.add_argument("-K", type=_positive(int), default=16, help="workers")
    parser.add_argument(
        "-r", type=_positive(int), default=_engine_default("redundancy"), help="redundancy"
    )
    parser.add_argument("-g", type=_positive(int), default=None, help="group size (None: K)")
    parser.add_argument(
        "--shuffle",
        default=_engine_default("shuffle"),
        choices=list(SHUFFLES),
    )
    parser.add_argument("-m", type=_positive(int), default=None, help="hybrid_m (None: least load)")
    parser.add_argument("--transport", default="direct", choices=["direct", "multicast", "dask"])
    parser.add_argument("--d", type=_positive(float), default=109_386, help="parameters (float32)")
    parser.add_argument(
        "--batch-size", type=_positive(int), default=None, help="global B (None: 64 K)"
    )
    parser.add_argument("--topology", default="switch", choices=list(TOPOLOGIES))
    parser.add_argument(
        "--rate-mbit", type=_positive(float), default=None, help="link rate (None: --rate-gbit)"
    )
    parser.add_argument("--rate-gbit", type=_positive(float), default=10.0, help="link rate")
    parser.add_argument("--rack-size", type=_positive(int), default=None, help="workers a rack")
    parser.add_argument("--pod-racks", type=_positive(int), default=None, help="racks a pod")
    parser.add_argument(
        "--oversubscription", type=_positive(float), default=1.0, help="uplink oversubscription"
    )
    parser.add_argument("--model", default="dnn", help="whose measured compute rate to use")
    parser.add_argument(
        "--samples-per-s", type=_positive(float), default=None, help="one worker's rate"
    )
    parser.add_argument(
        "--per-call-s", type=_positive(float), default=None, help="compute per call"
    )
    parser.add_argument(
        "--cores", type=_positive(int), default=None, help="workers share one such machine"
    )


def _command(a: argparse.Namespace) -> int:
    if a.measure_rate is not None:
        return _measure_rate(a)
    if a.record:
        out, *dirs = a.record
        runs = [compact(s) for s in load_summaries(dirs)]
        files.write_text(Path(out), json.dumps(runs, indent=0, sort_keys=True) + "\n")
        print(f"{len(runs)} runs written: {out}")
        return 0
    if a.fit:
        return _fit(a)
    cal = Calibration.load(a.calibration)
    if a.compare:
        return _compare(a, cal)
    return _predict_one(a, cal)


def _measure_rate(a: argparse.Namespace) -> int:
    """``--measure-rate``: one worker's compute here, stored in the calibration."""
    rate = measure_rate(a.measure_rate)
    print(json.dumps(rate, indent=1))
    path = Path(a.calibration)
    cal = Calibration.load(path) if path.exists() else Calibration({}, {})
    cal.compute[rate["model"]] = {k: rate[k] for k in ("samples_per_s", "per_call_s")}
    cal.save(path)
    print(f"stored as the compute rate of {rate['model']}: {path}")
    return 0


def _fit(a: argparse.Namespace) -> int:
    """``--fit``: each family's costs from the runs, with the hold-outs; its errors."""
    cal = Calibration.load(a.calibration)
    new = fit(
        load_summaries(a.fit),
        cal.compute,
        a.hold_out_K,
        a.hold_out_rate,
        a.hold_out_rack,
        a.hold_out_model,
    )
    new.save(a.calibration)
    held = held_outs(new.fitted_on)
    for family, c in new.costs.items():
        runs = new.fitted_on["runs"].get(family)
        if runs:
            print(
                f"{family}: link_overhead {c.link_overhead:.3f}, per_message "
                f"{1e3 * c.per_message_s:.3f} ms, per_step {1e3 * c.per_step_s:.1f} ms, "
                f"per_sub_batch {1e3 * c.per_sub_batch_s:.3f} ms, per_step_cpu "
                f"{1e3 * c.per_step_cpu_s:.2f} ms "
                f"({runs} runs)"
            )
            print("\n".join(_error_lines(new.fitted_on["error_pct"][family], runs, held)))
    print(f"written: {a.calibration}")
    return 0


def _compare(a: argparse.Namespace, cal: Calibration) -> int:
    """``--compare``: every run's predicted beside its measured step."""
    for row in compare(load_summaries(a.compare), cal):
        tag = f" (held out by {', '.join(row['held_out_by'])})" if row["held_out"] else ""
        if not row["faithful"]:
            tag += " (outside the scale model's fidelity)"
        if row["outside"]:
            tag += f" (outside the calibration: {'; '.join(row['outside'])})"
        print(
            f"{row['run']}: predicted {row['predicted_ms']} ms, measured "
            f"{row['measured_ms']} ms ({row['error_pct']:+.1f}%){tag}"
        )
    return 0


def _predict_one(a: argparse.Namespace, cal: Calibration) -> int:
    """One scenario (a run's, with ``--summary``; else the flags'): its terms and step."""
    summary = None
    if a.summary:
        path = a.summary / "summary.json" if a.summary.is_dir() else a.summary
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"error: cannot read {path}: {e}", file=sys.stderr)
            return 2
        s = scenario_of(summary)
    else:
        s = _scenario_from_args(a)
    try:
        p = predict(s, cal)
    except ImpossibleLayout as e:
        print(f"{s.describe()}\nimpossible: {e}")
        return 1
    print(s.describe())
    print(p.terms())
    if p.outside:
        line = (
            f"not predicted: outside the calibration ({'; '.join(p.outside)}); the terms "
            "above use its costs where they were not measured"
        )
    else:
        line = f"predicted {1e3 * p.step_s:.1f} ms " + (
            f"± {p.error_pct:.0f}% (the worst error of {s.family} on runs held out of its fit)"
            if p.error_pct is not None
            else f"(no runs of {s.family} were held out of the fit: its error is not known)"
        )
    if summary is not None:
        y = measured_step(summary)
        line += f", measured {1e3 * y:.1f} ms"
        if not p.outside:
            line += f" ({100 * (p.step_s - y) / y:+.1f}%)"
    print(line)
    return OUTSIDE if p.outside else 0


#: The exit status of a scenario outside the calibration (1: an impossible layout; 2: usage).
OUTSIDE = 3
