"""Every path of ``paper/`` in one place."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "paper"
RESULTS = PAPER / "results"  # stage 1 writes here (not in git)
#: The shipped report (in git): figures/, tables/ and REPORT.md. Stage 2 rewrites it only when
#: told to (``python -m paper.draw --into-paper``); by default it draws into :func:`drawn`.
SHIPPED = PAPER

#: The experiments in the order stage 1 runs them, with what each rebuilds.
EXPERIMENTS = {
    "paper_tuning": "the learning-rate grid of every algorithm, on a held-out split",
    "paper_tuning_asgd": "the same grid for asgd without momentum",
    "paper_accuracy": "Figure 4 and Table 1b: accuracy against steps, trained, five seeds",
    "paper_accuracy_digits": "Figure 4 on the bundled handwritten digits, five seeds",
    "paper_time": "Table 1: training time of ssgd, asgd and ddp, three seeds",
    "paper_time_ddp": "Table 1: DDP with buckets small enough to overlap its backward pass",
    "paper_phases": "Table 1 (cdc at every r) and Figure 3: time per step by phase",
    "paper_time_digits": "Table 1b on the digits: the step time of ssgd, asgd and ddp",
    "paper_phases_digits": "Table 1b on the digits: the step time of cdc at every r",
    "paper_loads": "Figure 2: communication per worker against r",
    "paper_bandwidth": "Figure 5: the best r against the links' rate",
    "paper_topology": "Figure 6: cdc on a switch, a bus and racks, over TCP and as multicast",
    "paper_topology_base": "Figure 6: DDP on each topology",
    "paper_stragglers": "Figure 8: cdc waiting for every map or not, under stragglers",
    "paper_stragglers_base": "Figure 8: DDP and asgd under the same stragglers",
    "paper_scaling": "Figure 9: cdc at K = 4..16 on a switch (TCP), r = 1, 2, coded and summed",
    "paper_scaling_base": "Figure 9: DDP at K = 4..16 on the switch",
}

#: The studies beyond the paper (Figures 6 to 10), each longer than the paper's own results:
#: ``make paper`` runs the rest, ``make paper BEYOND=1`` (``paper.sweep --beyond``) these too.
BEYOND = {
    "paper_topology",
    "paper_topology_base",
    "paper_stragglers",
    "paper_stragglers_base",
    "paper_scaling",
    "paper_scaling_base",
}

#: Experiments that train on data of their own: ``--mnist`` does not replace it.
OWN_DATA = {"paper_accuracy_digits", "paper_time_digits", "paper_phases_digits"}

#: Experiments that need the emulated network to mean anything: Figure 5 sweeps the links'
#: rate, and every study beyond the paper needs links to share (the stragglers' a link the
#: exchange has to share, the scaling's K = 16 on two cores, only link-bound on emulated links).
NEEDS_NETEM = {"paper_bandwidth", *BEYOND}

SIZES = ("small", "full")


def sweep_dir(results: Path, size: str, experiment: str) -> Path:
    return Path(results) / size / experiment


def drawn(results: Path, size: str) -> Path:
    """Where stage 2 draws by default: beside the results it reads, ``<results>/<size>/report/``
    (``paper/results/`` is not in git, so drawing leaves a checkout as it was)."""
    return Path(results) / size / "report"


def figures(out: Path) -> Path:
    return Path(out) / "figures"


def tables(out: Path) -> Path:
    return Path(out) / "tables"


def report(out: Path) -> Path:
    return Path(out) / "REPORT.md"
