"""Hydra callbacks of ``python -m dcoded`` (``hydra.callbacks`` in ``conf/config.yaml``)."""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from dcoded.results import SEED, SEED_STEM, TABLE_STEM, write_sweep_table


class SweepTable(Callback):
    """Before a multirun starts: every job's config is checked as its run would check it
    (:func:`dcoded.config.build_spec`: settings, layout, data, checkpoint), and a sweep with
    a bad job is refused whole, one line per bad job, before the first job runs.

    When a multirun ends: one table of all its jobs in the sweep folder (``results.csv``,
    ``results.md``, and ``results_by_seed`` where the seed varies; :mod:`dcoded.results`),
    named in its last line, and which jobs failed. A job that fails does not
    stop the sweep (the app records it in its folder); the process exits with status 1 at the
    end if any did."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        bad = bad_jobs(config)
        if bad:
            for line in bad:
                print(f"error: {line}", file=sys.stderr)
            print(
                f"error: the sweep was not started: {len(bad)} job(s) cannot run "
                "(nothing was written)",
                file=sys.stderr,
            )
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = write_sweep_table(sweep_dir)
        line = f"sweep: {len(rows)} jobs, table in {sweep_dir / TABLE_STEM}.md"
        if rows and SEED in rows[0]:  # a column of its own where the seed varies: by seed too
            line += f", by seed in {sweep_dir / SEED_STEM}.md"
        print(line)
        failed = [r for r in rows if r["status"] != "finished"]
        if failed:
            listed = "; ".join(f"job {r['job']}: {r['error'] or r['status']}" for r in failed)
            print(f"error: {len(failed)} of {len(rows)} jobs failed: {listed}", file=sys.stderr)
            sys.exit(1)


class Comparison(SweepTable):
    """``experiment=compare``'s sweep (in its place): the sweep's table as
    :class:`SweepTable` writes it, then the comparison of its runs
    (:func:`dcoded.compare.report`), printed and written as ``compare.md`` into the sweep
    folder, also where a job failed (the exit status stays 1 then)."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        try:
            super().on_multirun_end(config, **kwargs)
        finally:
            from dcoded import files
            from dcoded.compare import REPORT_FILE, report

            sweep_dir = Path(config.hydra.sweep.dir)
            text = report([sweep_dir])
            files.write_text(sweep_dir / REPORT_FILE, text)
            print(f"\n{text}", end="")
            print(f"comparison: {sweep_dir / REPORT_FILE}")


def bad_jobs(master: DictConfig) -> list[str]:
    """``job N (overrides): why`` for each job of the multirun ``master`` that its run would
    refuse before starting. The data each job names is loaded once per process. Only where
    the jobs run here (Hydra's basic launcher and sweeper); a job whose config needs its own
    Hydra values (``${hydra:runtime.output_dir}``), or that fails other than by a refusal, is
    left to show it when it runs."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from dcoded.config import build_spec, sweep_jobs
    from dcoded.errors import DcodedError

    launcher = str(master.hydra.launcher.get("_target_", ""))
    if not launcher.endswith("BasicLauncher"):  # jobs elsewhere: their data, their paths
        return []
    try:
        jobs = sweep_jobs(master)
    except ValueError:  # another sweeper: its jobs are checked as each one runs
        return []
    except (HydraException, OmegaConfBaseException) as e:
        return [f"the sweep's overrides cannot be composed: {str(e).splitlines()[0]}"]
    values = {}
    for overrides, _ in jobs:
        for o in overrides:
            values.setdefault(o.split("=", 1)[0], set()).add(o)
    swept = {key for key, seen in values.items() if len(seen) > 1}
    bad = []
    for num, (overrides, cfg) in enumerate(jobs):
        try:
            build_spec(cfg)
        except DcodedError as e:
            if str(e).startswith(UNRESOLVED):  # ${hydra:...} has its value only in the job
                continue
            named = [o for o in overrides if o.split("=", 1)[0] in swept] or overrides
            bad.append(f"job {num} ({' '.join(named)}): {e}")
        except Exception:  # not a refusal: the job shows it when it runs, as before
            continue
    return bad


#: How :func:`dcoded.config.plain` begins a config it cannot resolve.
UNRESOLVED = "the config cannot be resolved"
