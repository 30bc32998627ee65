"""Where the Hydra configs live, and composing them without a Hydra app (notebooks, tests)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

#: ``conf/`` at the repository root (the package is installed in editable mode from it).
CONFIG_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """The run config with Hydra overrides applied, as ``python -m dcoded`` would see it.

    >>> cfg = compose_config(["coding.redundancy=3", "model=cnn"])
    >>> cfg.coding.redundancy, cfg.model.name
    (3, 'cnn')
    """
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides or []))
