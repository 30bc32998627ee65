"""Which code made a result: dcoded's version, and the git commit of the checkout it was
imported from (with ``-dirty`` when the package or its configs differ from that commit).

>>> sorted(code_version())
['commit', 'version']
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

import dcoded

#: The folders whose files are the code: the package, and the configs it installs.
CODE = ("dcoded", "conf")

#: Where dcoded was imported from: a checkout's root, or ``site-packages`` for a wheel.
ROOT = Path(dcoded.__file__).resolve().parent.parent

#: What :func:`code_version` records when dcoded was not imported from a git checkout.
NOT_A_CHECKOUT = "not a git checkout"


def git(*args: str, cwd: Path) -> str | None:
    """``git args`` in ``cwd``: its output, or ``None`` if it failed or git is not here."""
    try:
        # a checkout of another user (the emulated network's driver runs as root) is still
        # read; no optional locks: a status taken while the user commits must not block it
        safe = ["-c", f"safe.directory={Path(cwd).resolve()}", "--no-optional-locks"]
        done = subprocess.run(["git", *safe, *args], cwd=cwd, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def commit(root: Path = ROOT) -> str | None:
    """HEAD's commit of the checkout at ``root``, with ``-dirty`` when tracked files under
    ``dcoded/`` or ``conf/`` differ from it; ``None`` where ``root`` is not the top of a git
    checkout (a wheel in a virtual environment inside some repository is not that repository's
    code)."""
    top = (git("rev-parse", "--show-toplevel", cwd=root) or "").strip()
    if not top or Path(top).resolve() != Path(root).resolve():
        return None
    sha = (git("rev-parse", "HEAD", cwd=root) or "").strip()
    if not sha:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", *CODE, cwd=root)
    return sha + ("-dirty" if dirty and dirty.strip() else "")


@cache
def code_version() -> dict[str, str]:
    """``{"version": ..., "commit": ...}`` for ``summary.json`` (asked of git once a
    process)."""
    return {"version": dcoded.__version__, "commit": commit() or NOT_A_CHECKOUT}
