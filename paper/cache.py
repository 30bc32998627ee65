"""What a sweep's results depend on, shared by both stages: its key, and whether a finished
sweep is still fresh.

A sweep's **key** is a sha256 over every job's composed config (resolved, without Hydra's
own ``hydra`` node; sorted, so the order of the jobs does not matter) and the identity of the
code. The jobs are enumerated exactly as Hydra's basic sweeper does: the experiment's
``hydra.sweeper.params`` and the command line's overrides, split by
:meth:`BasicSweeper.split_arguments`, each job composed by the config loader as the launcher
composes it.

The **code identity** is a sha256 over the path and the bytes of every ``dcoded/**/*.py`` and
``conf/**/*.yaml`` file (the ones git tracks, plus new ones it does not ignore, in a git
checkout; every such file on disk otherwise), each named by its path in the installed package
(``run.py``, ``conf/config.yaml``). It is a content hash whether or not the tree is clean, and
not HEAD's commit: a commit that changes nothing under ``dcoded/`` or ``conf/`` (the paper's
scripts, docs, a README) leaves every sweep fresh, and the same code gives the same key in a
checkout, a dirty tree or an unpacked archive. The commit is recorded beside it
(:func:`commit`), for the report's provenance.

Stage 1 writes the key into ``complete.json``; stage 2 recomputes it and warns about a sweep
whose key no longer matches. Neither imports the other: both import this module.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from dcoded.provenance import CODE, commit  # noqa: F401 (paper.sweep records it)
from dcoded.provenance import git as _git
from paper import paths

#: What stage 1 writes into a sweep's folder when every job of it has finished.
COMPLETE = "complete.json"
#: What stage 1 writes instead when the experiment cannot run here (it needs cluster=netem).
SKIPPED = "skipped.json"


def _sha(obj) -> str:
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()


def _code_files(root: Path) -> dict[str, Path]:
    """The package's ``.py`` files and its configs, by their path in the installed package."""
    package, conf = (root / name for name in CODE)
    listed = _git("ls-files", "--cached", "--others", "--exclude-standard", "-z", *CODE, cwd=root)
    if listed is not None:
        files = [root / p for p in listed.split("\0") if p]
    else:
        files = [p for p in (*package.rglob("*"), *conf.rglob("*")) if p.is_file()]
    named = {}
    for p in files:
        if not p.is_file() or "__pycache__" in p.parts:  # a tracked file deleted in the tree
            continue
        if p.suffix == ".py" and package in p.parents:
            named[p.relative_to(package).as_posix()] = p
        elif p.suffix == ".yaml" and conf in p.parents:
            named["conf/" + p.relative_to(conf).as_posix()] = p
    return named


def code_identity(root: Path = paths.ROOT) -> str:
    """sha256 over the path and bytes of the package's ``.py`` files and its configs (see the
    module's docstring for why it is a content hash and not the commit)."""
    h = hashlib.sha256()
    for name, p in sorted(_code_files(root).items()):
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


@dataclass(frozen=True)
class Plan:
    """The jobs a sweep of ``experiment`` with ``overrides`` runs, and its key."""

    experiment: str
    overrides: tuple[str, ...]
    jobs: tuple[tuple[str, ...], ...]  # each job's overrides, in Hydra's job order
    configs: str  # sha256 over the sorted job configs
    code: str  # code_identity()
    key: str  # sha256 over both

    def record(self) -> dict:
        """What ``complete.json`` keeps of it."""
        return {
            "key": self.key,
            "configs_key": self.configs,
            "code": self.code,
            "job_overrides": [list(j) for j in self.jobs],
        }


def sweep_jobs(
    experiment: str, overrides: list[str], config_dir: Path | None = None
) -> list[tuple[list[str], dict]]:
    """Every job of ``python -m dcoded -m experiment=<experiment> *overrides``: its overrides
    and its config (resolved, no ``hydra`` node), as Hydra's basic sweeper and launcher
    compose them. ``config_dir``: another copy of ``conf/`` (tests)."""
    from omegaconf import OmegaConf

    from dcoded.config import sweep_jobs as jobs_of

    with _hydra(config_dir):
        master = _master(experiment, overrides)
        try:
            jobs = [
                (job, OmegaConf.to_container(cfg, resolve=True)) for job, cfg in jobs_of(master)
            ]
        except ValueError as e:
            raise ValueError(f"{experiment}: {e}") from None
    return jobs


def composes(experiment: str, overrides: list[str], config_dir: Path | None = None) -> None:
    """Compose the multirun's master config only, each swept override at its first value,
    raising what Hydra raises: the experiment, every key and every group option but a swept
    group's later ones. What ``paper.sweep --check`` asks of a sweep that has no results (and
    so no key to compare): composing every job, as :func:`sweep_jobs` does, takes seconds a
    sweep, this about a tenth of one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    first = []
    for line, o in zip(overrides, OverridesParser.create().parse_overrides(overrides), strict=True):
        try:
            value = next(o.sweep_string_iterator()) if o.is_sweep_override() else None
        except Exception:  # a glob or an interval: the master config skips it, as Hydra does
            value = None
        first.append(line if value is None else f"{o.get_key_element()}={value}")
    with _hydra(config_dir):
        _master(experiment, first)


def _hydra(config_dir: Path | None):
    """Hydra initialised on ``dcoded.conf`` (or another copy of ``conf/``)."""
    from hydra import initialize_config_dir, initialize_config_module

    from dcoded.config import CONFIG_MODULE

    if config_dir is not None:
        return initialize_config_dir(config_dir=str(config_dir), version_base="1.3")
    return initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3")


def _master(experiment: str, overrides: list[str]):
    from dcoded.config import multirun_master

    return multirun_master([f"experiment={experiment}", *overrides])


def plan(
    experiment: str,
    overrides: list[str],
    config_dir: Path | None = None,
    code: str | None = None,
) -> Plan:
    """The key of a sweep of ``experiment`` with ``overrides`` (the ones stage 1 passes to
    ``python -m dcoded -m``, without ``hydra.*``). ``code``: the code identity, computed when
    not given."""
    jobs = sweep_jobs(experiment, overrides, config_dir)
    configs = _sha(sorted(_sha(cfg) for _, cfg in jobs))
    code = code_identity() if code is None else code
    return Plan(
        experiment=experiment,
        overrides=tuple(overrides),
        jobs=tuple(tuple(o) for o, _ in jobs),
        configs=configs,
        code=code,
        key=_sha({"configs": configs, "code": code}),
    )


def stale_reason(record: dict, now: Plan | None) -> str | None:
    """Why a finished sweep (its ``complete.json``) is not what ``now`` would run; ``None``
    when it is. A record without a key is stale whatever ``now`` is."""
    if "key" not in record:
        return "its complete.json has no key: it was written before sweeps were keyed"
    if record["key"] == now.key:
        return None
    why = []
    if record.get("configs_key") != now.configs:
        before = [tuple(j) for j in record.get("job_overrides", [])]
        if before != list(now.jobs):
            gone = len(set(before) - set(now.jobs))
            new = len(set(now.jobs) - set(before))
            why.append(
                f"configs changed: its jobs differ ({len(before)} -> {len(now.jobs)} jobs, "
                f"{gone} no longer run, {new} new)"
            )
        else:
            why.append("configs changed: the same jobs compose to other configs")
    if record.get("code") != now.code:
        why.append(
            f"code changed: dcoded/ or conf/ differs from what ran at commit {record.get('commit')}"
        )
    return "; ".join(why) or "its key differs"


def read_record(where: Path) -> dict | None:
    f = Path(where) / COMPLETE
    return json.loads(f.read_text()) if f.exists() else None


@cache
def _recorded_plan(experiment: str, overrides: tuple[str, ...], code: str) -> Plan:
    return plan(experiment, list(overrides), code=code)


def check_finished(where: Path) -> str | None:
    """Stage 2's check of a finished sweep against the code and configs here, with the
    overrides it ran with: why it is stale, or ``None`` when it is fresh."""
    record = read_record(where)
    if record is None:
        raise FileNotFoundError(f"no {COMPLETE} in {where}")
    if "key" not in record:
        return stale_reason(record, None)
    try:
        now = _recorded_plan(record["experiment"], tuple(record["overrides"]), code_identity())
    except Exception as e:  # an experiment renamed, an override that no longer composes
        return f"its jobs no longer compose here ({type(e).__name__}: {e})"
    return stale_reason(record, now)
