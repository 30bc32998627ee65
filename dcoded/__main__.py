"""``python -m dcoded``: the Hydra app. One run per job; ``-m`` sweeps.

A run prints its results table and writes it into its folder's ``dcoded.log``; one that fails
leaves ``error.txt`` there (and the error in ``dcoded.log``). In a multirun the sweep goes on
after a failed job; the sweep's end (:class:`dcoded.callbacks.SweepTable`) tabulates every job
and exits with status 1 if any failed.
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from dcoded import files
from dcoded.errors import DcodedError, NetemRunFailed
from dcoded.interrupt import Interrupted, sigterm_as_interrupt
from dcoded.results import ERROR_FILE, write_sweep_table
from dcoded.run import run
from dcoded.summary import format_results

files.register_resolvers()


# conf/ at the top of the repository, installed as the package dcoded.conf
@hydra.main(config_path="pkg://dcoded.conf", config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    out_dir = hydra_cfg.runtime.output_dir
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    Path(out_dir, ERROR_FILE).unlink(missing_ok=True)  # an earlier run's, in the same folder
    try:
        # the jobs of a multirun share one cluster, local or emulated (started once, closed
        # at exit, or after a job that failed)
        summary = run(cfg, out_dir=out_dir, reuse_cluster=multirun)
    except NetemRunFailed as e:  # the driver inside the emulated network printed the reason
        why = Path(out_dir, ERROR_FILE)  # and wrote it there
        return _failed(
            multirun, out_dir, why.read_text().strip() if why.exists() else str(e), e.code
        )
    except DcodedError as e:
        print(f"error: {e}", file=sys.stderr)
        return _failed(multirun, out_dir, str(e), 2)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM: the run wrote what it measured
        if multirun:  # the sweep stops too, as the signal asks: its table has the jobs so far
            write_sweep_table(hydra_cfg.sweep.dir)
        raise
    except Exception as e:  # a bug: a run shows it as Hydra does, a sweep records it
        trace = traceback.format_exc()
        if not multirun:
            files.write_text(Path(out_dir, ERROR_FILE), f"{type(e).__name__}: {e}\n\n{trace}")
            raise
        print(trace, file=sys.stderr)
        return _failed(multirun, out_dir, f"{type(e).__name__}: {e}\n\n{trace}", 1)
    table = f"{format_results(summary)}\n  outputs: {out_dir}"
    logging.getLogger("dcoded.log_only").info(table)  # into the run's dcoded.log, first
    print(table)
    return summary["final"]["test_accuracy"]


def _failed(multirun: bool, out_dir: str, message: str, code: int) -> None:
    """Write why the run failed into its folder (``error.txt``, and its ``dcoded.log``); a
    single run then ends with ``code``, a job of a multirun lets the sweep go on (Hydra's
    launcher would stop at the first job that exits)."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    files.write_text(Path(out_dir, ERROR_FILE), message + "\n")
    logging.getLogger("dcoded.log_only").error(f"error: {message}")
    if not multirun:
        sys.exit(code)


def main() -> None:
    with sigterm_as_interrupt():
        try:
            app()
        except KeyboardInterrupt as e:  # in a run (which said what it kept), or around one
            stop = e if isinstance(e, Interrupted) else Interrupted("stopped by Ctrl-C")
            print(f"interrupted: {stop}", file=sys.stderr)
            sys.exit(stop.exit_code)


if __name__ == "__main__":
    main()
