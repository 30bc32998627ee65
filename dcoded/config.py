"""Where the Hydra configs live, and composing them without a Hydra app (notebooks, tests)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

#: The Hydra configs ship inside the package (``dcoded/conf``, the module ``dcoded.conf``), so
#: a plain ``pip install`` has them: ``python -m dcoded`` finds them from any folder.
CONFIG_MODULE = "dcoded.conf"
CONFIG_DIR = Path(__file__).resolve().parent / "conf"


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """The run config with Hydra overrides applied, as ``python -m dcoded`` would see it.

    >>> cfg = compose_config(["coding.redundancy=3", "model=cnn"])
    >>> cfg.coding.redundancy, cfg.model.name
    (3, 'cnn')
    """
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides or []))
