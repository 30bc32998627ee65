"""Datasets and the deterministic sample order shared by every algorithm.

What is where:

:mod:`dcoded.data.dataset`
    The :class:`Dataset` container, :data:`DATASET_NAMES`, the :data:`NORMALIZATION`
    constants, and the sample-order contract: :func:`epoch_permutation`,
    :func:`steps_per_epoch` and :func:`step_indices`.
:mod:`dcoded.data.load`
    The entry points by ``cfg.name``: :func:`check_dataset`, :func:`dataset_files`,
    :func:`load_dataset`, and :func:`absolute_path` for the driver.
``digits``, ``idx``, ``cifar``, ``synthetic`` (modules :mod:`dcoded.data.digits` …)
    One reader per format (scikit-learn's bundled digits, the MNIST / Fashion-MNIST IDX
    files, the CIFAR-10 pickle batches, generated data), each with ``check(cfg)``,
    ``files(cfg)`` and ``load(cfg)``.

:class:`~dcoded.errors.DatasetError` (from :mod:`dcoded.errors`) is every clean failure here.

>>> ds = load_dataset({"name": "synthetic", "shape": [1, 4, 4], "n_classes": 2,
...                    "n_samples": 10, "n_test": 2})
>>> ds, steps_per_epoch(len(ds.y_train), batch_size=3)
(Dataset(name='synthetic', shape=(1, 4, 4), n_classes=2, n_train=10, n_test=2), 3)
>>> step_indices(len(ds.y_train), batch_size=3, seed=0, step=3)[0]  # the epoch of step 3
1
"""

from dcoded.data.dataset import (
    DATASET_NAMES,
    NORMALIZATION,
    Dataset,
    epoch_permutation,
    step_indices,
    steps_per_epoch,
)
from dcoded.data.load import absolute_path, check_dataset, dataset_files, load_dataset
from dcoded.errors import DatasetError

__all__ = [
    "DATASET_NAMES",
    "NORMALIZATION",
    "Dataset",
    "DatasetError",
    "absolute_path",
    "check_dataset",
    "dataset_files",
    "epoch_permutation",
    "load_dataset",
    "step_indices",
    "steps_per_epoch",
]
