"""The paper's tables and figures, rebuilt from scripts in two stages.

1. ``python -m paper.sweep``: run every experiment's Hydra multirun
   (``dcoded/conf/experiment/paper_*``) into ``paper/results/<size>/<experiment>/``; a
   finished sweep is skipped.
2. ``python -m paper.draw``: scripts that only read those results write the tables, the
   figures and ``paper/REPORT.md``.

``make paper`` does both; ``make paper SIZE=full`` is the full-size setting.
"""
