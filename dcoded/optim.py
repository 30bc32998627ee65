"""Optimizers sharded by segment.

Worker ``k`` owns segment ``k`` of ``θ`` and keeps the optimizer state of that segment only.
A shard is a torch optimizer (``torch.optim.SGD``, ``torch.optim.Adam``, ... built from a Hydra
``_partial_`` config) over one flat parameter tensor. The same :class:`SegmentOptimizer` runs in
the workers, the serial reference and the parameter server, so the update kernels are the same
everywhere, which bit-exactness needs.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import numpy as np
import torch
from hydra.utils import instantiate

from dcoded.checkpoint import concat_shards, slice_state


class SegmentOptimizer:
    """A torch optimizer over one flat float32 segment of ``θ``; with ``chunks`` (slices that
    cut the segment in order), one torch optimizer per chunk, so that a chunk can be stepped
    as soon as its gradient is known (hierarchical CDC updates each cross-cluster chunk as its
    sum arrives). The update is elementwise either way; stepping chunk by chunk keeps every
    kernel the same wherever the same ``chunks`` are used.

    >>> opt = SegmentOptimizer(np.zeros(3, np.float32), {"_target_": "torch.optim.SGD",
    ...                        "_partial_": True, "lr": 0.5})
    >>> opt.step(np.float32([2, 4, 6]), batch_size=2)
    array([-0.5, -1. , -1.5], dtype=float32)
    >>> two = SegmentOptimizer(np.zeros(3, np.float32), {"_target_": "torch.optim.SGD",
    ...                        "_partial_": True, "lr": 0.5}, chunks=[slice(0, 2), slice(2, 3)])
    >>> two.step_chunk(1, np.float32([6]), batch_size=2), two.value
    (array([-1.5], dtype=float32), array([ 0. ,  0. , -1.5], dtype=float32))
    """

    def __init__(self, segment: np.ndarray, cfg: Mapping, chunks: list[slice] | None = None):
        segment = np.asarray(segment, dtype=np.float32)
        self.chunks = list(chunks) if chunks else [slice(0, len(segment))]
        factory = instantiate(dict(cfg))
        self.params = [torch.nn.Parameter(torch.tensor(segment[c])) for c in self.chunks]
        self.optimizers: list[torch.optim.Optimizer] = [factory([p]) for p in self.params]

    @property
    def value(self) -> np.ndarray:
        if len(self.params) == 1:
            return self.params[0].detach().numpy()
        return np.concatenate([p.detach().numpy() for p in self.params])

    def step(self, grad_sum: np.ndarray, batch_size: int) -> np.ndarray:
        """Apply the optimizer with gradient ``grad_sum / batch_size``; return a copy of the
        updated segment."""
        grad_sum = np.asarray(grad_sum, dtype=np.float32)
        for i, chunk in enumerate(self.chunks):
            self._step(i, grad_sum[chunk], batch_size)
        return self.value.copy()

    def step_chunk(self, i: int, grad_sum: np.ndarray, batch_size: int) -> np.ndarray:
        """Step chunk ``i`` alone with its gradient sum; return a copy of the updated chunk."""
        self._step(i, np.asarray(grad_sum, dtype=np.float32), batch_size)
        return self.params[i].detach().numpy().copy()

    def _step(self, i: int, grad_sum: np.ndarray, batch_size: int) -> None:
        param = self.params[i]
        param.grad = torch.from_numpy(grad_sum) / float(batch_size)
        self.optimizers[i].step()
        param.grad = None

    def state_arrays(self) -> dict[str, np.ndarray]:
        """This segment's optimizer state (:func:`state_arrays`), for checkpoints: the chunks'
        joined in order, laid out as one optimizer over the whole segment would lay it out."""
        shards = [state_arrays(o) for o in self.optimizers]
        return shards[0] if len(shards) == 1 else concat_shards(shards)

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state_arrays` returned (for this segment)."""
        for chunk, optimizer in zip(self.chunks, self.optimizers, strict=True):
            load_state_arrays(optimizer, slice_state(arrays, chunk))


def state_arrays(optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    """A torch optimizer's state as numpy arrays, laid out as ``θ`` is: each per-element
    tensor (``momentum_buffer``, ``exp_avg``, ...) of every parameter flattened and joined in
    parameter order (the order of ``parameters_to_vector``), and each scalar (``step``) once
    (every parameter steps together). One flat parameter (a segment) is the simplest case.

    >>> w = torch.nn.Parameter(torch.ones(2, 2)); b = torch.nn.Parameter(torch.ones(1))
    >>> opt = torch.optim.SGD([w, b], lr=0.1, momentum=0.9)
    >>> w.grad, b.grad = torch.full((2, 2), 2.0), torch.full((1,), 3.0)
    >>> opt.step()
    >>> state_arrays(opt)["momentum_buffer"]
    array([2., 2., 2., 2., 3.], dtype=float32)
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = optimizer.state_dict()["state"]
    if not state:
        return {}
    out = {}
    for name, first in state[0].items():
        if first is None:
            continue
        first = torch.as_tensor(first)
        if first.dim() > 0 and first.numel() == params[0].numel():
            parts = [torch.as_tensor(state[i][name]).detach() for i in range(len(params))]
            out[name] = np.concatenate([t.reshape(-1).numpy() for t in parts])
        else:
            out[name] = np.array(first.detach().numpy())
    return out


def load_state_arrays(optimizer: torch.optim.Optimizer, arrays: dict[str, np.ndarray]) -> None:
    """Restore what :func:`state_arrays` returned: each full-length array cut back into the
    parameters' shapes, each scalar given to every parameter."""
    if not arrays:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state, offset = {}, 0
    for i, p in enumerate(params):
        n = p.numel()
        state[i] = {
            k: torch.tensor(np.array(v[offset : offset + n]).reshape(p.shape))
            if np.ndim(v) == 1
            else torch.tensor(np.array(v))
            for k, v in arrays.items()
        }
        offset += n
    sd = optimizer.state_dict()
    sd["state"] = state
    optimizer.load_state_dict(sd)


def check_optimizer(cfg: Mapping) -> None:
    """Refuse a ``_target_`` that is not a ``torch.optim`` optimizer class, before anything is
    called (a config must not run any callable it names), then build the optimizer once on a
    dummy tensor so a bad config fails before any cluster.

    >>> check_optimizer({"_target_": "pathlib.Path.touch", "_partial_": True})
    Traceback (most recent call last):
    ...
    ValueError: optimizer._target_='pathlib.Path.touch' is not allowed: it must name a torch.optim optimizer, such as torch.optim.SGD or torch.optim.Adam
    """  # noqa: E501
    target = cfg.get("_target_")
    module, _, name = str(target).rpartition(".")
    found = None
    if module == "torch.optim" or module.startswith("torch.optim."):
        try:  # torch's own modules only
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            found = None
    if not (isinstance(found, type) and issubclass(found, torch.optim.Optimizer)):
        raise ValueError(
            f"optimizer._target_={target!r} is not allowed: it must name a torch.optim "
            "optimizer, such as torch.optim.SGD or torch.optim.Adam"
        )
    try:
        SegmentOptimizer(np.zeros(1, np.float32), cfg)
    except Exception as e:  # instantiate wraps every failure; show its one-line reason
        raise ValueError(f"optimizer config is not usable: {e}".splitlines()[0]) from e
