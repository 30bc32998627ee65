"""The paper's tables and figures, rebuilt from scripts in two stages.

1. ``python -m paper.sweep``: run every experiment's Hydra multirun
   (``conf/experiment/paper_*``) into ``paper/results/<size>/<experiment>/``; a
   finished sweep is skipped while its key (every job's composed config and the code,
   :mod:`paper.cache`) still matches, and run again when it does not.
2. ``python -m paper.draw``: scripts that only read those results write the tables, the
   figures and ``REPORT.md`` (with a warning for every stale sweep they read) into
   ``paper/results/<size>/report/``; ``--into-paper`` rewrites the shipped ones,
   ``paper/REPORT.md``, ``paper/figures/`` and ``paper/tables/``. They import nothing of
   stage 1.

Each table and figure is a module (``table_*``, ``figure_*``, ``tuning``) that draws it and
writes its section of the report; :mod:`paper.sections` lists them, in the report's order.
The rules the sections judge by are :mod:`paper.verdicts`; the report's fixed prose is
Markdown in ``paper/prose/``.

``make paper`` does both; ``make paper SIZE=full`` is the full-size setting, ``make paper
INTO_PAPER=1`` rebuilds the shipped report.
"""
