"""The training engine: one file per algorithm, each holding its driver loop (or Dask graph)
and the functions it runs on the workers.

- ``cdc.py``: CDC-SSGD on Dask futures (``transport=dask``): a worker's math of one step
  (map, encode, decode and reduce, update), the tasks that wrap it, the graph;
- ``direct.py``: the same step as one loop per worker over direct links
  (``transport=direct``, ``multicast``; ``link.py``, ``multicast.py``);
- ``ps.py``: the parameter-server baselines ``ssgd`` and ``asgd``; ``ddp.py``: PyTorch DDP;
  ``serial.py``: the one-process reference every algorithm is checked against;
- ``registry.py``: the workers' replicas and records; ``record.py``: the driver's log of them;
  ``driver.py``: the driver's context, waits and per-step bookkeeping; ``spec.py``: the run as
  plain data; ``replica.py``: a model with its data.

>>> ALGORITHMS
('cdc', 'serial', 'ssgd', 'asgd', 'ddp')
>>> trainer("cdc", "direct").__name__, trainer("ssgd").__module__
('train_direct', 'dcoded.engine.ps')
"""

from __future__ import annotations

import importlib

#: What trains each algorithm (``module:function``, imported when a run needs it).
TRAINERS = {
    "cdc": "dcoded.engine.cdc:train_cdc",
    "serial": "dcoded.engine.serial:train_serial",
    "ssgd": "dcoded.engine.ps:train_ssgd",
    "asgd": "dcoded.engine.ps:train_asgd",
    "ddp": "dcoded.engine.ddp:train_ddp",
}
#: ``cdc`` with ``transport=direct`` or ``multicast``: the same step, one loop per worker.
LINK_TRAINER = "dcoded.engine.direct:train_direct"
ALGORITHMS = tuple(TRAINERS)


def trainer(algorithm: str, transport: str = "dask"):
    """The function that trains ``algorithm`` (``train_*(ctx) -> θ``)."""
    target = TRAINERS[algorithm]
    if algorithm == "cdc" and transport != "dask":
        target = LINK_TRAINER
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)
