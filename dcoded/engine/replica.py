"""A model replica with its data: what every worker (and the serial reference) holds.

Gradients are *summed* over a sub-batch (``reduction="sum"``) and flattened in
``model.parameters()`` order (the order of ``parameters_to_vector``), so sub-batch gradients
can be added in any grouping and divided by ``B`` once, at the update.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import threading

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from dcoded.data import Dataset, load_dataset, step_indices
from dcoded.engine.spec import RunSpec
from dcoded.errors import Abandoned
from dcoded.models import build_model

_DATA_CACHE: dict[str, Dataset] = {}
_DATA_LOCK = threading.Lock()

#: glibc's ``mallopt`` parameters (``malloc.h``), and what this process sets them to: buffers
#: up to 32 MiB come from the heap and are reused, and freed memory goes back to the system
#: only past 64 MiB at the heap's top.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 << 20, 64 << 20


@functools.cache
def reuse_freed_memory() -> bool:
    """Let this process reuse the memory a gradient frees (once; whether it could: glibc only).

    Dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (to hand memory
    back at once), and setting it turns off glibc's adaptive mmap threshold: every buffer
    over 128 KiB (a cnn's activations, each gradient) is then mapped afresh on each call,
    page-faulted in and zeroed. A cnn's gradient of 120 samples took 41 ms so against 22 ms
    in a plain process: every compute time a worker measured, the map and the predictor's
    rates, was up to twice what the model costs."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(
            libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        )
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to undo
        return False


def cached_dataset(cfg) -> Dataset:
    """Load a dataset once per process (threads of an in-process cluster share it)."""
    key = repr(sorted(dict(cfg).items()))
    with _DATA_LOCK:
        if key not in _DATA_CACHE:
            _DATA_CACHE[key] = load_dataset(cfg)
        return _DATA_CACHE[key]


class Replica:
    """Model, data and the step's sample order for one run."""

    def __init__(self, spec: RunSpec):
        torch.set_num_threads(spec.torch_threads)
        reuse_freed_memory()
        self.spec = spec
        self.data = cached_dataset(spec.dataset)
        self.model = build_model(spec.model, self.data.shape, self.data.n_classes, spec.seed)
        self.params = list(self.model.parameters())
        self._stop = None  # during grad_sum: says when to abandon it
        if getattr(spec, "stragglers", 0):
            self._watch()

    def _watch(self) -> None:
        """Hooks that abandon a gradient half-way (forward, layer by layer; backward, parameter
        by parameter) once ``stop()`` says so; they never touch a value, so no bit changes."""

        def check(*_):
            if self._stop is not None and self._stop():
                raise Abandoned("the others finished without this worker")

        for module in self.model.modules():
            module.register_forward_pre_hook(check)
        for p in self.params:
            p.register_hook(check)

    @property
    def theta(self) -> np.ndarray:
        return parameters_to_vector(self.params).detach().numpy().copy()

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.params)

    def set_theta(self, theta: np.ndarray) -> None:
        with torch.no_grad():
            vector_to_parameters(torch.from_numpy(np.asarray(theta, np.float32)), self.params)

    def step_samples(self, step: int) -> tuple[int, np.ndarray]:
        """``(epoch, indices)`` of the ``B`` samples of global step ``step``."""
        return step_indices(len(self.data.y_train), self.spec.batch_size, self.spec.seed, step)

    def grad_sum(self, indices: np.ndarray, stop=None) -> tuple[np.ndarray, float]:
        """Flattened gradient of the summed loss over ``indices`` at the current ``θ``;
        :class:`~dcoded.errors.Abandoned` as soon as ``stop()`` is true (with
        ``coding.stragglers``)."""
        x = torch.from_numpy(self.data.x_train[indices])
        y = torch.from_numpy(self.data.y_train[indices])
        self._stop = stop
        try:
            loss = F.cross_entropy(self.model(x), y, reduction="sum")
            grads = torch.autograd.grad(loss, self.params)
        except Abandoned:
            raise
        except RuntimeError as e:  # torch may wrap what a hook raised
            if stop is not None and stop():
                raise Abandoned(str(e)) from None
            raise
        finally:
            self._stop = None
        flat = torch.cat([g.reshape(-1) for g in grads]).numpy()
        return flat, float(loss.item())

    @torch.no_grad()
    def evaluate(self, theta: np.ndarray, batch: int = 2048) -> tuple[float, float]:
        """``(accuracy, mean loss)`` on the test set at ``θ``."""
        self.set_theta(theta)
        correct, loss, n = 0, 0.0, len(self.data.y_test)
        for i in range(0, n, batch):
            x = torch.from_numpy(self.data.x_test[i : i + batch])
            y = torch.from_numpy(self.data.y_test[i : i + batch])
            out = self.model(x)
            loss += float(F.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
        return correct / n, loss / n


def param_sha256(theta: np.ndarray) -> str:
    """sha256 of the flattened float32 parameters as little-endian bytes."""
    return hashlib.sha256(np.asarray(theta, dtype="<f4").tobytes()).hexdigest()
