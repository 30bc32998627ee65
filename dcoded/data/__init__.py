"""Datasets and the deterministic sample order shared by every algorithm."""

from dcoded.data.dataset import (
    DATASET_NAMES,
    NORMALIZATION,
    Dataset,
    DatasetError,
    absolute_path,
    check_dataset,
    dataset_files,
    epoch_permutation,
    load_dataset,
    step_indices,
)

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
]
