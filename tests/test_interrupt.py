"""Ctrl-C and SIGTERM (what ``timeout``, Slurm and Kubernetes send) stop a run cleanly: it
writes what it measured (``history.csv``, ``summary.json`` marked interrupted), keeps its
checkpoint, and the command ends with one line, no traceback."""

from __future__ import annotations

import csv
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import dcoded.run
import dcoded.summary
from dcoded import checkpoint
from dcoded.engine.replica import Replica
from dcoded.interrupt import Interrupted, signals_deferred, sigterm_as_interrupt
from tests.conftest import ctrl_c_able, tiny_config

ROOT = Path(__file__).resolve().parent.parent


def _history(run_dir: Path) -> list[dict]:
    with open(run_dir / "history.csv") as f:
        return list(csv.DictReader(f))


def test_sigterm_during_training_writes_history_and_summary(tmp_path, monkeypatch):
    real = Replica.step_samples

    def step_samples(self, step):
        if step == 7:  # as `timeout` would, in the middle of step 7
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, step)

    monkeypatch.setattr(Replica, "step_samples", step_samples)
    with pytest.raises(Interrupted) as err:
        dcoded.run.run(
            tiny_config("algorithm=serial", "train.steps=50", "train.checkpoint_every=5"),
            out_dir=tmp_path,
        )
    assert err.value.exit_code == 128 + signal.SIGTERM
    message = str(err.value)
    assert message.startswith("stopped by SIGTERM after step 7 of 50") and "\n" not in message
    assert f"train.resume={tmp_path}" in message
    # where the checkpoint is, and what a resume does again (it said neither)
    assert f"checkpoint {tmp_path / 'checkpoint.npz'} is at step 5" in message
    assert message.endswith("(it does steps 6-7 again)"), message
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps_done"] == 7
    assert summary["param_sha256"] is None and summary["final"]["train_loss"] > 0
    assert "(interrupted after step 7)" in dcoded.summary.format_results(summary)
    assert [int(r["step"]) for r in _history(tmp_path)] == list(range(7))
    assert checkpoint.load(tmp_path).step == 5
    assert not (tmp_path / "theta.npy").exists()  # the final parameters were never reached
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is run's only


def test_a_resume_goes_on_with_the_interrupted_runs_config_and_its_own_overrides(tmp_path):
    """``train.resume=DIR`` alone went on with the defaults (``train.checkpoint_every 5 ->
    0``, the learning rate, the model's width): it goes on with the run that wrote the
    checkpoint, and what the resume sets (a setting, a group) still applies."""
    from dcoded.config import compose_config, plain
    from dcoded.recovery import resumed_config

    given = ["algorithm=serial", "train.steps=6", "train.checkpoint_every=3", "train.lr=0.07"]
    given += ["optimizer=adam", "model.hidden=[16]", "train.eval_every=0", "progress=false"]
    dcoded.run.run(compose_config(given), out_dir=tmp_path)

    def resumed(*overrides):
        return plain(resumed_config([f"train.resume={tmp_path}", *overrides]))

    ran = plain(compose_config(given))
    assert resumed() == {**ran, "train": {**ran["train"], "resume": str(tmp_path)}}
    c = resumed("train.steps=9", "train.lr=0.2")  # the optimizer's rate follows train.lr
    assert (c["train"]["steps"], c["train"]["lr"], c["optimizer"]["lr"]) == (9, 0.2, 0.2)
    assert c["train"]["checkpoint_every"] == 3 and c["model"]["hidden"] == [16]
    c = resumed("optimizer=sgd")  # a group given: its defaults, the run's rate
    assert c["optimizer"]["_target_"] == "torch.optim.SGD" and c["optimizer"]["lr"] == 0.07
    assert c["optimizer"]["momentum"] == 0.9 and c["algorithm"]["name"] == "serial"
    c = resumed("experiment=smoke")  # what the experiment sets, and only that
    assert (c["train"]["steps"], c["train"]["eval_every"], c["train"]["lr"]) == (20, 10, 0.07)
    # it runs as the interrupted run's config would have, up to the steps given
    fresh = plain(resumed_config(["train.resume=", *given]))  # '': a new run, as before
    assert fresh == {**ran, "train": {**ran["train"], "resume": ""}}
    out = dcoded.run.run(resumed_config([f"train.resume={tmp_path}", "train.steps=9"]))
    again = dcoded.run.run(compose_config([*given, "train.steps=9"]))
    assert out["param_sha256"] == again["param_sha256"] and out["start_step"] == 6


def test_a_handler_of_the_caller_is_left_alone():
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with sigterm_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def _signalled(args: list[str], checkpoints: str, signum: int) -> tuple[int, list[str]]:
    """Run ``python -m dcoded ARGS`` in a session of its own, wait for a checkpoint matching
    the glob ``checkpoints``, send ``signum`` to the whole process group (as `timeout` or a
    terminal's Ctrl-C do); its exit status and the non-empty lines of its stderr after the
    start (a warning of more worker processes than cores comes first on a small machine)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dcoded", *args, "progress=false", "train.steps=100000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=ctrl_c_able,
    )
    deadline = time.monotonic() + 120
    while not glob.glob(checkpoints):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1)
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return proc.returncode, [ln for ln in lines if "worker processes share" not in ln]


def test_signals_in_a_deferred_block_arrive_when_it_ends():
    """A cluster interrupted while it started could not be closed: distributed failed on it
    at exit, with a traceback. Its start holds Ctrl-C and SIGTERM until it can be closed."""
    reached = []
    with sigterm_as_interrupt(), pytest.raises(Interrupted, match="SIGTERM"):
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # a signal is handled between two bytecodes: it had its chance
            reached.append("end of the block")
        reached.append("after the block")
    assert reached == ["end of the block"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_to_the_process_group_stops_the_cli_with_one_line(tmp_path, signum):
    """Before, SIGTERM left no history.csv nor summary.json, and Ctrl-C printed a traceback
    from the driver and one from every worker."""
    run_dir = tmp_path / "run"
    args = ["train.checkpoint_every=5", f"hydra.run.dir={run_dir}"]
    code, lines = _signalled(args, str(run_dir / "checkpoint.npz"), signum)
    assert code == 128 + signum
    name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    assert len(lines) == 1 and lines[0].startswith(f"interrupted: stopped by {name} after step")
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = _history(run_dir)
    assert summary["status"] == "interrupted" and summary["steps_done"] == len(rows) >= 5
    # the workers lived until the driver collected their records of the last steps
    assert all(r["map_s"] and r["bytes_unicast"] for r in rows)
    assert 5 <= checkpoint.load(run_dir).step <= len(rows)


@pytest.mark.slow
@pytest.mark.parallel_safe
def test_a_run_stopped_by_ctrl_c_logs_its_line_and_resumes_with_its_own_config(tmp_path):
    """As a user types it: a run stopped by Ctrl-C, then ``train.resume=DIR``. Its
    ``dcoded.log`` was empty, its line did not say the checkpoint's step (nor the steps done
    again), and the resume went on with the defaults (``train.checkpoint_every 5 -> 0``)."""
    run_dir, resumed = tmp_path / "run", tmp_path / "resumed"
    args = ["algorithm=serial", "train.checkpoint_every=5", "train.lr=0.07", "model.hidden=[16]"]
    args.append(f"hydra.run.dir={run_dir}")
    code, lines = _signalled(args, str(run_dir / "checkpoint.npz"), signal.SIGINT)
    assert code == 128 + signal.SIGINT and len(lines) == 1, lines
    assert lines[0] in (run_dir / "dcoded.log").read_text()  # what the console said
    at = checkpoint.load(run_dir).step
    done = json.loads((run_dir / "summary.json").read_text())["steps_done"]
    # the steps since the checkpoint: a resume does them again
    again = {0: "no step", 1: f"step {done}"}.get(done - at, f"steps {at + 1}-{done}")
    assert lines[0].endswith(
        f"checkpoint {run_dir / 'checkpoint.npz'} is at step {at}: continue with "
        f"train.resume={run_dir} (it does {again} again)"
    ), lines[0]

    steps = (done // 5 + 2) * 5
    out = subprocess.run(
        [sys.executable, "-m", "dcoded", f"train.resume={run_dir}", f"train.steps={steps}",
         "progress=false", f"hydra.run.dir={resumed}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "other settings" not in out.stderr  # nothing changed but the steps
    config = yaml.safe_load((resumed / ".hydra" / "config.yaml").read_text())
    assert config["train"]["checkpoint_every"] == 5 and config["train"]["lr"] == 0.07
    assert config["model"]["hidden"] == [16] and config["train"]["steps"] == steps
    assert checkpoint.load(resumed).step == steps  # it went on checkpointing every 5 steps
    summary = json.loads((resumed / "summary.json").read_text())
    assert (summary["start_step"], summary["steps_done"]) == (at, steps)


@pytest.mark.slow
def test_sigterm_stops_a_sweep_with_one_line_and_its_table_so_far(tmp_path):
    args = [
        "-m",
        "train.checkpoint_every=5",
        "coding.redundancy=1,2",
        f"hydra.sweep.dir={tmp_path}",
    ]
    code, lines = _signalled(args, str(tmp_path / "0-*" / "checkpoint.npz"), signal.SIGTERM)
    assert code == 128 + signal.SIGTERM
    assert len(lines) == 1 and lines[0].startswith("interrupted: stopped by SIGTERM")
    assert not list(tmp_path.glob("1-*"))  # the sweep stopped: job 1 never started
    with open(tmp_path / "results.csv") as f:
        (row,) = csv.DictReader(f)
    assert (row["job"], row["status"]) == ("0", "interrupted") and float(row["step_ms"]) > 0
