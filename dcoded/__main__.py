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
from omegaconf import DictConfig, OmegaConf

from dcoded import files
from dcoded.errors import DcodedError, NetemRunFailed
from dcoded.interrupt import Interrupted, sigterm_as_interrupt
from dcoded.recovery import resumed_config
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
        if cfg.train.get("resume"):  # the checkpoint's run's config, and this one's ('': none)
            cfg = _resumed(cfg, hydra_cfg, out_dir)
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
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM: the run wrote what it measured
        # the line the console ends on (main prints it), into the run's dcoded.log too
        logging.getLogger("dcoded.log_only").warning(_interrupted_line(e))
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


def _resumed(cfg: DictConfig, hydra_cfg, out_dir: str) -> DictConfig:
    """A resume goes on with the config of the run that wrote its checkpoint, with the
    settings its own command line gives (:func:`dcoded.recovery.resumed_config`); the run's
    ``.hydra/config.yaml`` says that config, so it runs again as it ran."""
    cfg = resumed_config(list(hydra_cfg.overrides.task), cfg)
    if hydra_cfg.output_subdir is not None:
        saved = Path(out_dir, hydra_cfg.output_subdir, "config.yaml")
        if saved.is_file():
            files.write_text(saved, OmegaConf.to_yaml(cfg))
    return cfg


def _failed(multirun: bool, out_dir: str, message: str, code: int) -> None:
    """Write why the run failed into its folder (``error.txt``, and its ``dcoded.log``); a
    single run then ends with ``code``, a job of a multirun lets the sweep go on (Hydra's
    launcher would stop at the first job that exits)."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    files.write_text(Path(out_dir, ERROR_FILE), message + "\n")
    logging.getLogger("dcoded.log_only").error(f"error: {message}")
    if not multirun:
        sys.exit(code)


def _stop(e: KeyboardInterrupt) -> Interrupted:
    """What stopped the run: the run's own :class:`Interrupted` (it says what it kept), or a
    Ctrl-C around it."""
    return e if isinstance(e, Interrupted) else Interrupted("stopped by Ctrl-C")


def _interrupted_line(e: KeyboardInterrupt) -> str:
    return f"interrupted: {_stop(e)}"


def check_command_line(argv: list[str]) -> str | None:
    """Why the command line's overrides cannot run, in one line naming the nearest valid names
    (:func:`dcoded.config.check_overrides`), before Hydra composes anything (Hydra's own error
    for ``algorithm=cdcc`` is 14 lines); ``None`` where they can, and where the command line
    asks Hydra for something else (help, another config folder), which Hydra then does."""
    from hydra._internal.utils import get_args_parser

    from dcoded.config import check_overrides

    # --version, or a flag without its value: Hydra's parser prints it and exits, once
    args, _ = get_args_parser().parse_known_args(argv)
    elsewhere = (args.config_path, args.config_name, args.config_dir, args.experimental_rerun)
    asks = (args.help, args.hydra_help, args.shell_completion, args.info)
    if any(x is not None for x in elsewhere) or any(asks):
        return None
    try:
        check_overrides(args.overrides)
    except DcodedError as e:
        return str(e)
    return None


def main() -> None:
    problem = check_command_line(sys.argv[1:])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    with sigterm_as_interrupt():
        try:
            app()
        except KeyboardInterrupt as e:  # in a run (which said what it kept), or around one
            print(_interrupted_line(e), file=sys.stderr)
            sys.exit(_stop(e).exit_code)


if __name__ == "__main__":
    main()
