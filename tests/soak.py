"""A soak: one long run with a worker killed half way, watched from outside (not a test: it
takes minutes, and its figures go into a report, not an assertion).

    python tests/soak.py [--steps 10000] [--kill-at 5000] [--every 30] OUT_DIR [OVERRIDE ...]

runs ``python -m dcoded`` with ``train.steps``, ``train.checkpoint_every=20``,
``train.on_worker_loss=continue`` and the overrides into ``OUT_DIR/run``; kills one worker
process (SIGKILL; its nanny starts another) once ``history.csv`` holds ``--kill-at`` steps;
samples every ``--every`` seconds the memory (RSS) and open files of the driver, the
scheduler and the workers; and prints, as JSON into ``OUT_DIR/soak.json`` and on the console:
the seconds between the progress lines of steps 1,000-2,000 and of the last 1,000 steps, the
seconds from the last progress line to ``summary.json``, and the samples' spread.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def _kind(p: psutil.Process) -> str:
    """driver, scheduler or worker, by what the process runs."""
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return "gone"
    if "dcoded.run" in cmd:  # the driver inside the emulated network
        return "driver"
    if "-m dcoded" in cmd:  # the process started (on cluster=local: also the driver)
        return "launcher"
    if "scheduler" in cmd:
        return "scheduler"
    if "spawn_main" in cmd or "forkserver" in cmd or "worker" in cmd:
        return "worker"
    return "other"


def _sample(top: psutil.Process) -> dict:
    """RSS (MiB) and open files of each kind of process under ``top``, summed."""
    out: dict[str, dict] = {}
    for p in [top, *top.children(recursive=True)]:
        try:
            kind = _kind(p)
            rss, fds = p.memory_info().rss / 2**20, p.num_fds()
        except psutil.Error:
            continue
        slot = out.setdefault(kind, {"rss_mib": 0.0, "fds": 0, "n": 0})
        slot["rss_mib"] += rss
        slot["fds"] += fds
        slot["n"] += 1
    return out


def _victim(top: psutil.Process) -> psutil.Process | None:
    """A worker process that a nanny started (its nanny starts another when it dies)."""
    for p in top.children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if "spawn_main" in cmd or "forkserver" in cmd:
                parent = " ".join(p.parent().cmdline())
                if "worker" in parent or "nanny" in parent or "dcoded" in parent:
                    return p
        except psutil.Error:
            continue
    return None


def _rows(history: Path) -> int:
    try:
        with open(history) as f:
            return sum(1 for _ in f) - 1
    except OSError:
        return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--kill-at", type=int, default=5_000, help="0: no kill")
    ap.add_argument("--every", type=float, default=30.0)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    args = ap.parse_args()
    run_dir = args.out / "run"
    cmd = [
        sys.executable,
        "-m",
        "dcoded",
        f"hydra.run.dir={run_dir}",
        f"train.steps={args.steps}",
        f"train.checkpoint_every={args.checkpoint_every}",
        "train.on_worker_loss=continue",
        "progress=true",
        *args.overrides,
    ]
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    lines: list[tuple[float, str]] = []

    def read(stream, keep):
        for line in stream:
            keep.append((time.time() - t0, line.rstrip()))

    out_lines: list[tuple[float, str]] = []
    readers = [
        threading.Thread(target=read, args=(proc.stderr, lines), daemon=True),
        threading.Thread(target=read, args=(proc.stdout, out_lines), daemon=True),
    ]
    for r in readers:
        r.start()
    top = psutil.Process(proc.pid)
    samples, killed, next_sample = [], None, 0.0
    while proc.poll() is None:
        now = time.time() - t0
        if now >= next_sample:
            samples.append({"t": round(now, 1), **_sample(top)})
            next_sample = now + args.every
        if args.kill_at and killed is None and _rows(run_dir / "history.csv") >= args.kill_at:
            victim = _victim(top)
            if victim is not None:
                victim.send_signal(signal.SIGKILL)
                killed = {"t": round(now, 1), "pid": victim.pid, "rows": args.kill_at}
        time.sleep(0.5)
    for r in readers:
        r.join(5)
    done = time.time() - t0
    progress = {}
    for t, line in lines:  # the last time each step's progress line came (after a rewind too)
        if ": step " in line:
            step = int(line.split(": step ")[1].split("/")[0])
            progress[step] = t
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    last = max(progress) if progress else None

    def span(a, b):
        return round(progress[b] - progress[a], 2) if a in progress and b in progress else None

    n = args.steps
    # the samples once training runs (start-up's growth is not the run's)
    began = min(progress.values()) if progress else 0.0
    training = [s for s in samples if s["t"] >= began]
    kinds = sorted({k for s in training for k in s if k != "t"})
    spread = {}
    for k in kinds:
        rss = [s[k]["rss_mib"] for s in training if k in s]
        fds = [s[k]["fds"] for s in training if k in s]
        spread[k] = {
            "rss_mib_first": round(rss[0], 1),
            "rss_mib_min": round(min(rss), 1),
            "rss_mib_max": round(max(rss), 1),
            "rss_mib_last": round(rss[-1], 1),
            "fds_min": min(fds),
            "fds_max": max(fds),
        }
    report = {
        "command": " ".join(cmd),
        "returncode": proc.returncode,
        "killed": killed,
        "seconds_steps_1000_2000": span(1000, 2000),
        f"seconds_steps_{n - 1000}_{n}": span(n - 1000, n),
        "seconds_last_progress_to_summary": round(
            summary_path.stat().st_mtime - t0 - progress[last], 2
        )
        if summary and last is not None
        else None,
        "seconds_in_all": round(done, 1),
        "summary_time_s": summary.get("time_s"),
        "param_sha256": summary.get("param_sha256"),
        "recoveries": [
            {k: e[k] for k in ("at_step", "resumed_from", "steps_replayed", "recovery_s")}
            for e in summary.get("recoveries", [])
        ],
        "events": summary.get("events"),
        "memory_and_files": spread,
        "samples": samples,
        "stderr_tail": [line for _, line in lines[-8:]],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
