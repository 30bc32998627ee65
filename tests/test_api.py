"""The public API as the README shows it: ``from dcoded import compose_config, format_results,
run``, from a script without a ``__main__`` guard, from stdin, and ``import dcoded`` staying
light."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import dcoded
import dcoded.run
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parent.parent


def readme_example() -> str:
    """The README's "From Python or a notebook" code block, exactly as written."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## From Python or a notebook") :]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


def test_the_public_names_and_the_modules_behind_them():
    from dcoded import compose_config, format_results, run

    assert callable(run) and run.run  # the module dcoded.run, callable as run.run
    assert compose_config is dcoded.config.compose_config
    assert format_results is dcoded.summary.format_results
    assert sorted(dcoded.__all__) == ["compose_config", "format_results", "local_cluster", "run"]
    with pytest.raises(AttributeError, match="no attribute 'train'"):
        dcoded.train  # noqa: B018


def test_import_dcoded_loads_neither_torch_nor_dask():
    code = "import sys, dcoded; print(sorted({'torch', 'dask'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _check_run(result: subprocess.CompletedProcess, where: Path) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "already in use" not in result.stderr
    assert "test accuracy" in result.stdout
    summary = json.loads((where / "runs" / "ssgd" / "summary.json").read_text())
    with open(where / "runs" / "ssgd" / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert summary["algorithm"] == "ssgd" and summary["steps"] == len(rows) == 100
    assert summary["final"]["test_accuracy"] > 0.8


@pytest.mark.slow
@pytest.mark.parallel_safe
def test_the_readme_example_as_a_script_without_a_main_guard(tmp_path):
    """multiprocessing re-ran an unguarded script in every worker process: 552 lines of
    traceback and a history.csv with only its header."""
    code = readme_example()
    assert "__main__" not in code
    (tmp_path / "example.py").write_text(code)
    run = [sys.executable, "example.py"]
    _check_run(subprocess.run(run, cwd=tmp_path, capture_output=True, text=True), tmp_path)


@pytest.mark.slow
@pytest.mark.parallel_safe
def test_the_readme_example_piped_to_python(tmp_path):
    """From stdin, the workers tried to run '<stdin>' as a file."""
    result = subprocess.run(
        [sys.executable, "-"], input=readme_example(), cwd=tmp_path, capture_output=True, text=True
    )
    _check_run(result, tmp_path)


def test_run_shows_its_own_parameters():
    """``dcoded.run`` is a callable module: notebooks showed ``(*args, **kwargs)``."""
    import inspect

    from dcoded import run

    assert inspect.signature(run) == inspect.signature(run.run)
    assert list(inspect.signature(run).parameters)[:2] == ["cfg", "out_dir"]


@pytest.mark.slow
@pytest.mark.parallel_safe
def test_the_readme_example_with_a_cluster_kept_open_piped_to_python(tmp_path):
    """The README's second block: one local cluster kept open for several configs (fewer steps
    here), piped to ``python -``. With Dask's own ``LocalCluster`` it failed with "Nanny failed
    to start"; as a file it ended with "Worker process still alive ... killing" lines."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## From Python or a notebook") :]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[1]
    assert "__main__" not in code and "client=client" in code and "local_cluster" in code
    code = code.replace('f"coding.redundancy={r}"', 'f"coding.redundancy={r}", "train.steps=5"')
    code = code.replace("run(compose_config", "print(run(compose_config")
    code = code.replace("client=client)", 'client=client)["param_sha256"])')
    code += "print(__file__ if '__file__' in dir() else 'no file')\n"  # __main__ given back
    done = subprocess.run(
        [sys.executable, "-"], input=code, cwd=tmp_path, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "killing" not in done.stderr, done.stderr
    assert len([ln for ln in done.stdout.splitlines() if len(ln) == 64]) == 3, done.stdout
    assert done.stdout.splitlines()[-1] == "<stdin>"


def test_local_cluster_is_public():
    assert dcoded.local_cluster is dcoded.cluster.local_cluster


def test_the_users_own_keys_reach_the_summary(tmp_path):
    summary = dcoded.run.run(tiny_config("+tag=baseline"), out_dir=tmp_path)
    assert summary["config"]["tag"] == "baseline"
    assert '"tag": "baseline"' in (tmp_path / "summary.json").read_text()


def test_a_rerun_into_the_same_folder_drops_the_last_error(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "error.txt").write_text("an earlier run's error\n")
    (tmp_path / "cfg.yaml").write_text(OmegaConf.to_yaml(tiny_config()))
    assert dcoded.run.main([str(tmp_path / "cfg.yaml"), str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "error.txt").exists()


def test_a_run_into_a_folder_that_holds_a_run_says_it_replaces_it(tmp_path, capsys):
    """``run(out_dir=...)`` overwrote an earlier run's folder without a word."""
    dcoded.run.run(tiny_config(), out_dir=tmp_path)
    assert "replaces" not in capsys.readouterr().err  # a new folder: nothing to say
    dcoded.run.run(tiny_config("train.seed=1"), out_dir=tmp_path)
    err = capsys.readouterr().err
    assert f"note: {tmp_path} holds an earlier run (summary.json): this run replaces" in err


def test_links_planted_at_the_names_a_run_writes_are_replaced_not_followed(tmp_path):
    """Root (``cluster=netem``) wrote fixed names in the run folder the usual way, so a link
    put at ``summary.json.tmp`` by someone who can write there made it truncate the target.
    Each name is made new: the targets keep their bytes, the run's files are its own."""
    out = tmp_path / "out"
    out.mkdir()
    victims = {}
    for name in ("summary.json.tmp", "history.csv.tmp", "theta.npy.tmp", "summary.json"):
        victim = tmp_path / f"victim-{name}"
        victim.write_text("precious\n")
        (out / name).symlink_to(victim)
        victims[name] = victim
    summary = dcoded.run.run(tiny_config(), out_dir=out)
    assert all(v.read_text() == "precious\n" for v in victims.values())
    assert json.loads((out / "summary.json").read_text())["param_sha256"] == summary["param_sha256"]
    assert not any(p.is_symlink() for p in out.iterdir())


def test_a_saved_config_can_come_from_standard_input(tmp_path, monkeypatch):
    """``python -m dcoded.run - OUT``: how the emulated network hands its driver the config
    (a pipe: nothing on disk to swap between writing and reading); JSON keeps 1e-05 a number."""
    cfg = OmegaConf.to_container(tiny_config("train.lr=1e-05"))
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(cfg)))
    assert dcoded.run.main(["-", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["train"]["lr"] == 1e-05
