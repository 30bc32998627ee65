"""Docstrings as ``--help`` text: the reStructuredText markup taken out, paragraphs kept (in
``coding``, the package that imports nothing else of dcoded, so that its own commands use it).

>>> print(help_text("Print ``C(K, r)`` for :func:`loads.shuffle`, **once**.\\n\\nThen stop."))
Print C(K, r) for loads.shuffle, once.
<BLANKLINE>
Then stop.
"""

from __future__ import annotations

import re


def help_text(doc: str) -> str:
    """``doc`` without double backticks, roles (``:func:`x```) or bold/italic stars."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    text = text.replace("``", "")
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    return text.strip()
