"""The report's sections, in their order: one module each, the one list of them.

Each module draws its tables and figures (``main(results, size, out)``, stage 2) and writes its
section of ``REPORT.md`` (``section(results, size)``), and says what the section is: ``TITLE``,
the sweeps it ``READS`` (the report says "not run" in its place where one has not run) and the
``FIGURES`` it shows. ``python -m paper.draw`` draws them in this order; the report sets them
down in it. A new figure is a module here and its sweep in :data:`paper.paths.EXPERIMENTS`.
"""

from __future__ import annotations

from paper import (
    figure_accuracy,
    figure_bandwidth,
    figure_hybrid,
    figure_loads,
    figure_phases,
    figure_scaling,
    figure_stragglers,
    figure_topology,
    table_ddp,
    table_time,
    table_to_accuracy,
    tuning,
)

SECTIONS = (
    tuning,
    table_time,
    table_ddp,
    table_to_accuracy,
    figure_loads,
    figure_phases,
    figure_accuracy,
    figure_bandwidth,
    figure_topology,
    figure_hybrid,
    figure_stragglers,
    figure_scaling,
)
