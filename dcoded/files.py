"""Writing a run's files without following a link planted in their place.

Under ``cluster=netem`` dcoded runs as root and writes fixed names into the run folder
(``summary.json.tmp``, ``history.csv.tmp``, ``netem/scheduler.log``, ...). Opened the usual
way, a symbolic link that someone who can write to that folder put at one of those names
would make root truncate whatever it points to. Every file dcoded writes is therefore made
new by :func:`create`: what is at the name (a file, or a link, never its target) is removed,
and the file is created exclusively, without following a link; :func:`replace` writes a file
under a temporary name, flushes it to disk and renames it into place, so a reader never sees
it half-written.

>>> import pathlib, tempfile
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> (d / "victim").write_text("keep me")
7
>>> (d / "out.txt").symlink_to(d / "victim")
>>> with create(d / "out.txt") as f:
...     _ = f.write("new")
>>> (d / "victim").read_text(), (d / "out.txt").is_symlink(), (d / "out.txt").read_text()
('keep me', False, 'new')
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def create(path, mode: str = "w", **kw) -> IO:
    """``path`` opened for writing as a new file (``mode``: ``"w"`` or ``"wb"``; ``kw`` as for
    :func:`open`): whatever was at that name is removed first, a link and not its target."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, _FLAGS | getattr(os, "O_CLOEXEC", 0), 0o666)
    return os.fdopen(fd, mode, **kw)


def append(path) -> IO:
    """``path`` opened to append text (made if missing); a link at that name is refused
    (``OSError``), not followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
    return os.fdopen(os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o666), "a")


def replace(path, write: Callable[[IO], object], mode: str = "w", **kw) -> Path:
    """Write ``path`` through ``write(file)`` under the name ``path.tmp``, flush it to disk,
    and rename it into place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with create(tmp, mode, **kw) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return path


def write_text(path, text: str) -> Path:
    """``path`` holds ``text``, made new by :func:`create` (not renamed into place)."""
    with create(path) as f:
        f.write(text)
    return Path(path)


#: The longest folder name a sweep's job gets (most file systems allow 255 bytes).
JOB_DIRNAME_MAX = 200


def job_dirname(num, overrides: str) -> str:
    """A sweep job's folder: its number and its overrides (Hydra's ``override_dirname``),
    shortened where they would make a name longer than :data:`JOB_DIRNAME_MAX` bytes (a sweep
    of many overrides failed with "File name too long"): cut, with a digest of the whole so
    that two jobs never share a folder. The job's overrides stay whole in its
    ``.hydra/overrides.yaml``.

    >>> job_dirname(3, "model=cnn")
    '3-model=cnn'
    >>> name = job_dirname(0, ",".join(f"cluster.key{i}=value" for i in range(40)))
    >>> len(name.encode()), name[-9:-8]
    (200, '~')
    """
    name = f"{num}-{overrides}" if overrides else str(num)
    if len(name.encode()) <= JOB_DIRNAME_MAX:
        return name
    import hashlib

    digest = hashlib.blake2b(name.encode(), digest_size=4).hexdigest()
    head = name.encode()[: JOB_DIRNAME_MAX - len(digest) - 1].decode(errors="ignore")
    return f"{head}~{digest}"


def register_resolvers() -> None:
    """``${dcoded_job_dirname:NUM,OVERRIDES}`` for the config's sweep folders."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("dcoded_job_dirname"):
        OmegaConf.register_new_resolver("dcoded_job_dirname", job_dirname)
