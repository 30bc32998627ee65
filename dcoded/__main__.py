"""``python -m dcoded``: the Hydra app. One run per job; ``-m`` sweeps."""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from dcoded.config import CONFIG_DIR
from dcoded.interrupt import Interrupted, sigterm_as_interrupt
from dcoded.netem import NetemRunFailed
from dcoded.run import CLEAN_ERRORS, format_results, run


@hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    out_dir = hydra_cfg.runtime.output_dir
    try:
        # the jobs of a multirun share one emulated cluster (built once, removed at exit)
        summary = run(cfg, out_dir=out_dir, reuse_network=hydra_cfg.mode == RunMode.MULTIRUN)
    except NetemRunFailed as e:  # the driver inside the emulated network printed the reason
        sys.exit(e.code)
    except CLEAN_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM: the run wrote what it measured
        stop = e if isinstance(e, Interrupted) else Interrupted("stopped by Ctrl-C")
        print(f"interrupted: {stop}", file=sys.stderr)
        sys.exit(stop.exit_code)
    print(format_results(summary))
    print(f"  outputs: {out_dir}")
    return summary["final"]["test_accuracy"]


def main() -> None:
    with sigterm_as_interrupt():
        app()


if __name__ == "__main__":
    main()
