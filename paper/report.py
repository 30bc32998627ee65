"""``paper/REPORT.md``: every reproduced number beside the paper's, the conditions, and where
the paper's claims hold here, where they do not, and why. Generated from the results only."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from dcoded import files
from paper import output, paths, summary
from paper.cache import SKIPPED
from paper.results import (
    MissingResults,
    Run,
    load,
    meta,
    outside_fidelity,
    scale_model,
    stale,
)
from paper.sections import SECTIONS

#: The report's fixed prose, in Markdown: its head, what differs from the paper's setting,
#: what changed since the first report.
PROSE = Path(__file__).parent / "prose"


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
    # the machine's cores as stage 1 counted them (a host under the scale model is pinned to
    # one of them, and counts only that one)
    cores = (m.get("host") or {}).get("cores") or env["cores"]
    dilated = scale_model(runs)
    if dilated:
        tdf, quota = dilated["tdf"], dilated["quota_cores"]
        each = f"{dilated['host_cores']:g} core" + "s" * (dilated["host_cores"] != 1)
        hosts = (
            f"K = {first['n_workers']} Dask worker processes, the driver and the scheduler, "
            f"each an emulated machine of {each} (the scale model, `cluster.scale_model=true`): "
            f"a CPU cgroup of its own whose quota is a hard ceiling of {_span(quota, '.3f')} of "
            f"one of this machine's {cores} cores (raised by as much as a run's probe finds the "
            "quota slows its compute), every link's rate and every protocol "
            f"timer dilated {_span(tdf, '.2f')} times; every time reported is the wall time "
            "divided by that factor, as the K machines would see it, and a run whose fidelity "
            "check failed is left out (each sweep's count is below)"
        )
    else:
        hosts = (
            f"K = {first['n_workers']} Dask worker processes, one thread and "
            f"{env['torch_threads']} torch thread each, on a machine with {cores} cores "
            "(the workers share them: redundant compute costs more here than on K machines)"
        )
    models = {}
    for r in runs:
        models.setdefault(r["model"], r["n_params"])
    opt = cfg["optimizer"]
    lines = [
        f"- size: `{size}` (`make paper SIZE={size}`); results of {m['finished'][:10]}",
        f"- hosts: {hosts}",
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
            + _fidelity(results, size, e)
        )
    return "\n".join(lines)


def _span(pair: tuple[float, float], fmt: str) -> str:
    lo, hi = pair
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}} to {hi:{fmt}}"


def _fidelity(results: Path, size: str, experiment: str) -> str:
    """``; scale model, fidelity held in n of m runs`` for a sweep under the scale model."""
    try:
        kept = load(results, size, experiment, failed_ok=True)
    except MissingResults:
        return ""
    out = outside_fidelity(results, size, experiment)
    scaled = [r for r in (*kept, *out) if r.summary.get("scale_model")]
    if not scaled:
        return ""
    held = len(scaled) - len(out)
    left = f" (left out: {', '.join(r.dir.name.split('-')[0] for r in out)})" if out else ""
    return f"; scale model, fidelity held in {held} of {len(scaled)} runs{left}"


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


def main(results: Path = paths.RESULTS, size: str = "small", *, out: Path) -> None:
    now = f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M}"
    into = " --into-paper" if Path(out).resolve() == paths.SHIPPED.resolve() else ""
    parts = [prose("head", size=size, into=into, now=now), "", f"## {summary.TITLE}", ""]
    parts += [summary.section(results, size), "", "## Conditions", ""]
    try:
        parts.append(conditions(results, size))
    except MissingResults as e:
        parts.append(f"not known: {e}")
    sweeps = provenance(results, size)
    if sweeps:
        parts += ["", "Every sweep read, the commit it ran at:", "", sweeps]
    for section in SECTIONS:
        parts += ["", f"## {section.TITLE}", ""]
        missing = _missing(results, size, section.READS)
        if missing:
            parts.append(missing)
            continue
        parts.append(section.section(results, size))
        parts += [f"![{f}](figures/{f})" for f in section.FIGURES]
    parts += ["", prose("racks"), "", prose("differs"), "", prose("changes")]
    target = paths.report(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(target, "\n".join(parts) + "\n")


def prose(name: str, **fields: str) -> str:
    """The report's fixed prose, ``paper/prose/<name>.md``, with its ``{fields}`` filled."""
    text = (PROSE / f"{name}.md").read_text().rstrip("\n")
    return text.format(**fields) if fields else text


if __name__ == "__main__":
    sys.exit(output.cli(main, prog="python -m paper.report"))
