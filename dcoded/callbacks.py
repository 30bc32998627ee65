"""Hydra callbacks of ``python -m dcoded`` (``hydra.callbacks`` in ``conf/config.yaml``)."""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from dcoded.results import TABLE_STEM, write_sweep_table


class SweepTable(Callback):
    """When a multirun ends: one table of all its jobs in the sweep folder (``results.csv``,
    ``results.md``; :mod:`dcoded.results`), and which jobs failed. A job that fails does not
    stop the sweep (the app records it in its folder); the process exits with status 1 at the
    end if any did."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = write_sweep_table(sweep_dir)
        print(f"sweep: {len(rows)} jobs, table in {sweep_dir / TABLE_STEM}.md")
        failed = [r for r in rows if r["status"] != "finished"]
        if failed:
            listed = "; ".join(f"job {r['job']}: {r['error'] or r['status']}" for r in failed)
            print(f"error: {len(failed)} of {len(rows)} jobs failed: {listed}", file=sys.stderr)
            sys.exit(1)
