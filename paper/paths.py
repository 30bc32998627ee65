"""Every path of ``paper/`` in one place."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "paper"
RESULTS = PAPER / "results"  # stage 1 writes here (not in git)
OUTPUT = PAPER  # stage 2 writes figures/, tables/ and REPORT.md here

#: The experiments in the order stage 1 runs them, with what each rebuilds.
EXPERIMENTS = {
    "paper_time": "Table 1: training time of ssgd, asgd and ddp",
    "paper_phases": "Table 1 (cdc at every r) and Figure 3: time per step by phase",
    "paper_loads": "Figure 2: communication per worker against r",
    "paper_accuracy": "Figure 4: test accuracy against wall time",
    "paper_bandwidth": "Figure 5: the best r against the links' rate",
    "paper_topology": "Figure 6: cdc on a switch, a bus and racks, over TCP and as multicast",
    "paper_topology_base": "Figure 6: DDP and the parameter server on each topology",
    "paper_stragglers": "Figure 8: cdc waiting for every map or not, under stragglers",
    "paper_stragglers_base": "Figure 8: DDP and the parameter servers under the same stragglers",
}

#: Experiments that need the emulated network to mean anything (they sweep its rate).
NEEDS_NETEM = {
    "paper_bandwidth",
    "paper_topology",
    "paper_topology_base",
    "paper_stragglers",  # a slow worker's CPU quota, and a link the exchange has to share
    "paper_stragglers_base",
}

SIZES = ("small", "full")


def sweep_dir(results: Path, size: str, experiment: str) -> Path:
    return Path(results) / size / experiment


def figures(out: Path) -> Path:
    return Path(out) / "figures"


def tables(out: Path) -> Path:
    return Path(out) / "tables"


def report(out: Path) -> Path:
    return Path(out) / "REPORT.md"
