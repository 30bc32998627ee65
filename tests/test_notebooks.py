"""The notebooks run top to bottom (they hold no logic of their own: the library does it)."""

from __future__ import annotations

import warnings
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks_and_they_are_stored_without_outputs():
    assert [p.name for p in NOTEBOOKS] == [
        "01-coded-shuffle.ipynb",
        "02-train-and-compare.ipynb",
        "03-tradeoff.ipynb",
    ]
    for path in NOTEBOOKS:
        with warnings.catch_warnings():  # a cell without an id (nbformat will refuse it)
            warnings.simplefilter("error")
            nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, path.name


@pytest.mark.timeout(1200)  # its own subprocess bounds add up past the default 300 s
@pytest.mark.slow
@pytest.mark.parallel_safe  # runs each notebook; asserts what it shows, not how fast
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch, tmp_path):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # what a notebook writes to its tempdir
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
