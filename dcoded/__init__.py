"""dcoded: coded synchronous SGD (CDC-SSGD) on Dask, measured to the byte.

    from dcoded import compose_config, format_results, run

    summary = run(compose_config(["algorithm=ssgd", "train.steps=100"]), out_dir="runs/ssgd")
    print(format_results(summary))

``import dcoded`` stays light: torch and Dask load when ``run`` is first imported.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
__all__ = ["compose_config", "format_results", "local_cluster", "run"]

#: Public names and the module that defines each (imported on first use).
_LAZY = {
    "compose_config": "dcoded.config",
    "format_results": "dcoded.summary",
    "local_cluster": "dcoded.cluster",
}


def __getattr__(name: str):
    if name == "run":  # the module ``dcoded.run`` is callable: calling it calls run.run
        return importlib.import_module("dcoded.run")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dcoded' has no attribute {name!r}")
