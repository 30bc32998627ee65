"""The notebooks run top to bottom (they hold no logic of their own: the library does it),
with the small settings the tests give their knobs."""

from __future__ import annotations

import ast
import os
import warnings
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))

#: What the tests set in a notebook's cell tagged ``parameters`` (papermill's convention): a
#: cell setting them is run right after it, as ``papermill -p NAME VALUE`` does. Small
#: settings, and a K other than 4 for the trade-off, whose knob must reach every run.
PARAMETERS = {
    "02-train-and-compare": {"STEPS": 10},
    "03-tradeoff": {"K": 3},
    "04-compare": {"STEPS": 3},
}
#: What each notebook must print with those settings (and ``NOT_PRINTED``, must not).
PRINTED = {
    "03-tradeoff": ["cdc K=3 r=1 ", "cdc K=3 r=2 ", "cdc K=3 r=3 "],
    "04-compare": ["on LOOPBACK (cluster=local)", "best coded r = ", "cdc r=2 g=2 coded"],
}
NOT_PRINTED = {"03-tradeoff": ["K=4 "]}
#: Run as on a machine without iproute2 (PATH without ip, tc and bridge): the comparison then
#: runs on loopback, as it says, quick wherever the tests run.
WITHOUT_IPROUTE2 = ("04-compare",)


def with_parameters(nb, values: dict):
    """``nb`` with a cell setting ``values`` inserted after its ``parameters`` cell."""
    (at,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    cell = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in values.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, cell)
    return nb


def printed(nb) -> str:
    """All that the executed notebook's cells printed."""
    return "".join(
        out.get("text", "") for c in nb.cells if c.cell_type == "code" for out in c.outputs
    )


def test_the_settings_the_tests_give_are_each_notebooks_knobs():
    """Each knob the tests set is a name its notebook's parameters cell assigns (and nothing
    else there: the cell is the notebook's settings, changed by a user or a test)."""
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(cells) == (path.stem in PARAMETERS), path.name
        if cells:
            tree = ast.parse(cells[0].source)
            assert all(isinstance(node, ast.Assign) for node in tree.body), path.name
            names = {t.id for node in tree.body for t in node.targets}
            assert set(PARAMETERS[path.stem]) <= names, path.name


def test_there_are_notebooks_and_they_are_stored_without_outputs():
    assert [p.name for p in NOTEBOOKS] == [
        "01-coded-shuffle.ipynb",
        "02-train-and-compare.ipynb",
        "03-tradeoff.ipynb",
        "04-compare.ipynb",
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
    if path.stem in WITHOUT_IPROUTE2:
        kept = [
            p
            for p in os.environ.get("PATH", "").split(os.pathsep)
            if not any(Path(p, tool).exists() for tool in ("ip", "tc", "bridge"))
        ]
        monkeypatch.setenv("PATH", os.pathsep.join(kept))
    nb = nbformat.read(path, as_version=4)
    if path.stem in PARAMETERS:
        nb = with_parameters(nb, PARAMETERS[path.stem])
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    text = printed(nb)
    for needle in PRINTED.get(path.stem, []):
        assert needle in text, (needle, text[-3000:])
    for needle in NOT_PRINTED.get(path.stem, []):
        assert needle not in text, (needle, text[-3000:])
