"""The two model families of the paper, built from ``torch.nn`` with the input shape of the data.

* ``dnn``: a multi-layer perceptron, ``hidden`` widths in config, ReLU between layers;
* ``cnn``: LeNet-style, two conv (3x3, padding 1) + ReLU + 2x2 max-pool blocks, then a hidden
  fully connected layer; the kernel size keeps it valid from 8x8 digits to 32x32 CIFAR-10.

Initialisation is drawn from ``torch.manual_seed(seed)`` so every replica starts from the same
``θ`` without sending it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import torch
from torch import nn

MODELS = ("dnn", "cnn")
_INIT_LOCK = threading.Lock()


def _dnn(shape: Sequence[int], n_classes: int, hidden: Sequence[int]) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = int(torch.Size(shape).numel())
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)


def _cnn(shape: Sequence[int], n_classes: int, channels: Sequence[int], hidden: int) -> nn.Module:
    c, h, w = shape
    if min(h, w) < 2 ** len(channels):
        raise ValueError(
            f"model=cnn needs images of at least {2 ** len(channels)}x{2 ** len(channels)} for "
            f"{len(channels)} pooling stages, got {h}x{w}"
        )
    layers: list[nn.Module] = []
    for out in channels:
        layers += [nn.Conv2d(c, int(out), 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        c, h, w = int(out), h // 2, w // 2
    layers += [nn.Flatten(), nn.Linear(c * h * w, int(hidden)), nn.ReLU()]
    layers.append(nn.Linear(int(hidden), n_classes))
    return nn.Sequential(*layers)


def build_model(cfg: Mapping, shape: Sequence[int], n_classes: int, seed: int) -> nn.Module:
    """The model named by ``cfg["name"]`` for inputs of ``shape`` (C, H, W), seeded init.

    >>> m = build_model({"name": "dnn", "hidden": [16]}, (1, 8, 8), 10, seed=0)
    >>> sum(p.numel() for p in m.parameters())
    1210
    """
    name = cfg.get("name")
    if name not in MODELS:
        raise ValueError(f"model={name!r} is not known: choose one of {', '.join(MODELS)}")
    # torch's global RNG draws the init: replicas built in threads of one process (an
    # in-process cluster) must not interleave their draws, and the caller's RNG is left alone
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        if name == "dnn":
            return _dnn(shape, n_classes, cfg.get("hidden", [128, 64]))
        return _cnn(shape, n_classes, cfg.get("channels", [16, 32]), cfg.get("hidden", 64))
