"""Shared fixtures: tiny configs composed exactly as ``python -m dcoded`` composes them."""

from __future__ import annotations

import os
import signal

import pytest

from dcoded.config import compose_config
from dcoded.run import run

# This suite's emulated networks get namespaces of their own prefix (inherited by every
# process it starts), so a second suite or a user's run beside it is neither seen nor removed.
os.environ["DCODED_NETEM_PREFIX"] = f"dct{os.getpid()}"


def ctrl_c_able() -> None:
    """``preexec_fn`` for a child the test will Ctrl-C: SIGINT to its default, whatever this
    suite inherited (a suite started as a background job or under ``nohup ... &`` ignores
    SIGINT, its children too, and Python then leaves it ignored: the Ctrl-C would never land)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: Small and fast: in-process Dask workers, a tiny MLP, a few steps.
TINY = [
    "progress=false",
    "cluster.processes=false",
    "model.hidden=[16]",
    "train.batch_size=24",
    "train.steps=3",
    "train.eval_every=0",
]


def tiny_config(*overrides: str):
    return compose_config([*TINY, *overrides])


@pytest.fixture
def train():
    """``train(*overrides, out_dir=None) -> summary`` for a tiny run."""

    def _train(*overrides: str, out_dir=None):
        return run(tiny_config(*overrides), out_dir=out_dir)

    return _train
