"""Reader for ``synthetic``: random but learnable data, nothing read from disk.

Fixed, spatially smooth class templates plus Gaussian noise, sized by ``cfg.shape``,
``cfg.n_classes``, ``cfg.n_samples`` and ``cfg.n_test``, drawn from ``cfg.seed`` (default 0);
see :func:`generate`. The data have zero mean and unit variance per pixel and are not rescaled.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dcoded.data.dataset import Dataset, nonneg_int
from dcoded.errors import DatasetError

# Synthetic data: distance between class templates, in noise standard deviations.
SYNTHETIC_SEPARATION = 5.0
# Rows generated at once, to bound the temporary of templates[y].
_CHUNK = 8192


def check(cfg: Mapping[str, Any]) -> None:
    """Validate the settings (there are no files)."""
    params(cfg)


def files(cfg: Mapping[str, Any]) -> list[Path]:
    """No files: the data are generated."""
    return []


def load(cfg: Mapping[str, Any]) -> Dataset:
    """The synthetic dataset the config describes.

    >>> cfg = {"shape": [1, 4, 4], "n_classes": 3, "n_samples": 12, "n_test": 6}
    >>> ds = load(cfg)
    >>> ds
    Dataset(name='synthetic', shape=(1, 4, 4), n_classes=3, n_train=12, n_test=6)
    >>> ds.y_train.tolist() == load({**cfg, "seed": 0}).y_train.tolist()  # seed defaults to 0
    True
    """
    return generate(**params(cfg))


def params(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The validated keyword arguments of :func:`generate` from the ``dataset`` config."""
    shape = cfg.get("shape")
    try:
        dims = tuple(nonneg_int(v, "dataset.shape entry") for v in shape)
    except (TypeError, DatasetError):
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise DatasetError(
            f"dataset.shape={shape!r} for synthetic must be three positive ints [C, H, W]"
        )
    out: dict[str, Any] = {"shape": dims}
    for key, low in (("n_classes", 2), ("n_samples", 1), ("n_test", 0)):
        value = cfg.get(key)
        if value is None:
            raise DatasetError(f"dataset.{key} must be set for synthetic (an int >= {low})")
        value = nonneg_int(value, f"dataset.{key}")
        if value < low:
            raise DatasetError(f"dataset.{key}={value} for synthetic must be >= {low}")
        out[key] = value
    out["seed"] = nonneg_int(cfg.get("seed", 0), "dataset.seed")
    return out


def _split(
    templates: np.ndarray, n: int, rng: np.random.Generator, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    n_classes = templates.shape[0]
    # Exactly balanced (up to one sample) labels in random order.
    y = rng.permutation(np.arange(n, dtype=np.int64) % n_classes)
    x = rng.standard_normal((n, templates.shape[1]), dtype=np.float32)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        x[start:stop] += templates[y[start:stop]]
    x *= np.float32(scale)
    return x, y


def generate(
    shape: tuple[int, int, int], n_classes: int, n_samples: int, n_test: int, seed: int
) -> Dataset:
    """Class templates plus unit Gaussian noise, rescaled to unit variance per pixel.

    Each template is white noise on a half-resolution grid, upsampled 2×2 (spatial structure
    a CNN can use), then scaled to RMS ``SYNTHETIC_SEPARATION / sqrt(2 D)`` with
    ``D = C·H·W``: two templates then lie about ``SYNTHETIC_SEPARATION`` noise standard
    deviations apart whatever the size, so difficulty does not depend on the shape. Templates,
    train set and test set use the independent streams ``[seed, 0]``, ``[seed, 1]`` and
    ``[seed, 2]``, so the test set does not depend on ``n_samples``.
    """
    c, h, w = shape
    d = c * h * w
    rng_t = np.random.default_rng([seed, 0])
    coarse = rng_t.standard_normal((n_classes, c, (h + 1) // 2, (w + 1) // 2))
    templates = coarse.repeat(2, axis=2).repeat(2, axis=3)[:, :, :h, :w].reshape(n_classes, d)
    rms = np.sqrt(np.mean(templates**2, axis=1, keepdims=True))
    templates *= SYNTHETIC_SEPARATION / np.sqrt(2 * d) / np.maximum(rms, 1e-12)
    templates = templates.astype(np.float32)
    # Per-pixel variance is 1 (noise) + mean template power; divide it out.
    scale = 1.0 / np.sqrt(1.0 + SYNTHETIC_SEPARATION**2 / (2 * d))
    x_train, y_train = _split(templates, n_samples, np.random.default_rng([seed, 1]), scale)
    x_test, y_test = _split(templates, n_test, np.random.default_rng([seed, 2]), scale)
    return Dataset(
        name="synthetic",
        x_train=x_train.reshape(n_samples, c, h, w),
        y_train=y_train,
        x_test=x_test.reshape(n_test, c, h, w),
        y_test=y_test,
        n_classes=n_classes,
    )
