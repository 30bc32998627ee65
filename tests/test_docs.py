"""The README and ``docs/`` as a newcomer reads them: the README's shown run against a real run,
its length and links; ``docs/configuration.md`` against ``--help``, ``conf/`` and every
setting."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from dcoded import compose_config, format_results, run
from dcoded.settings import SETTINGS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
#: Groups of conf/ that are no choice of the user's: Hydra's own, what size=full picks from, and
#: the jobs of experiment=compare.
INTERNAL_GROUPS = {"hydra", "experiment_size", "compare"}


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """The fenced code blocks of a Markdown text: ``(language, lines)``."""
    blocks, block = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if block is None:
                block = (line[3:].strip(), [])
            else:
                blocks.append(block)
                block = None
        elif block is not None:
            block[1].append(line)
    return blocks


def _shown_run() -> list[str]:
    """The README's example output: the plain code block with the run's ``param_sha256``, less
    the folder line that ``python -m dcoded`` adds below the table."""
    (lines,) = [
        b for lang, b in _blocks(README.read_text()) if not lang and "param_sha256" in str(b)
    ]
    return [line for line in lines if not line.strip().startswith("outputs:")]


def _shape(line: str) -> str:
    """A line of the results table without what it measured: its numbers (and the hash) as
    ``#``, its runs of spaces as one; a line of what shaped the run (``network: loopback
    ...``) by its label alone."""
    said = re.match(r"\s*([a-z][\w ]*): \S", line)
    if said:
        return said[1] + ":"
    line = re.sub(r"param_sha256 [0-9a-f]{16}…", "param_sha256 #…", line)
    return " ".join(re.sub(r"(?<!\w)\d[\d,.]*", "#", line).split())


def test_the_readmes_run_ends_with_the_parameters_a_run_gives(tmp_path):
    """The README showed ``param_sha256 20c9ccc9…`` long after the run gave ``06ba69c8…``.
    cdc equals serial bit for bit, so serial's hash (one process, seconds) is the run's."""
    shown = [line.split()[1] for line in _shown_run() if "param_sha256" in line]
    summary = run(compose_config(["algorithm=serial", "progress=false"]), out_dir=tmp_path)
    assert shown == [summary["param_sha256"][:16] + "…"]


def test_the_readmes_table_has_the_lines_a_run_prints(tmp_path):
    """The README's table has the rows, in order and format, that a run of its config prints
    (here in threads and for two steps: the same lines, other numbers). The header is compared
    up to the resources in brackets, which say what the machine is; a line of what shaped the
    run, by its label (``network:`` says loopback there, in-process workers here)."""
    cfg = compose_config(["cluster.processes=false", "train.steps=2", "progress=false"])
    printed = format_results(run(cfg, out_dir=tmp_path)).splitlines()
    shown = _shown_run()
    assert _shape(shown[0].split(" [")[0]) == _shape(printed[0].split(" [")[0])
    assert [_shape(line) for line in shown[1:]] == [_shape(line) for line in printed[1:]]


def test_the_readme_is_a_few_screens():
    """627 lines, settings cells of a paragraph each: the reference is docs/ now, and the README
    about 150 lines."""
    assert len(README.read_text().splitlines()) <= 160


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(text: str) -> set[str]:
    code = {line for _, lines in _blocks(text) for line in lines}
    return {
        _slug(line.lstrip("#"))
        for line in text.splitlines()
        if line.startswith("#") and line not in code
    }


def test_the_links_of_the_readme_and_the_docs_lead_somewhere():
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and where.suffix == ".md" and anchor not in _headings(where.read_text()):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def _help_groups() -> dict[str, tuple[str, str]]:
    """``python -m dcoded --help``'s groups: ``{group: (options, line)}``."""
    done = subprocess.run(
        [sys.executable, "-m", "dcoded", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "experiment_size" not in done.stdout  # internal: size=full picks from it
    lines = done.stdout[done.stdout.index("== Groups") :].splitlines()[1:]
    lines = lines[: lines.index("")]
    assert len(lines) % 2 == 0 and all(line.startswith("    ") for line in lines[1::2]), lines
    return {
        head.split(": ")[0]: (head.split(": ", 1)[1], text.strip())
        for head, text in zip(lines[::2], lines[1::2], strict=True)
    }


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _docs_groups() -> dict[str, tuple[str, str]]:
    """docs/configuration.md's table of groups: ``{group: (options, line)}``."""
    rows = re.findall(
        r"^\| `(\w+)` \| (.+?) \| (.+?) \|$", _section(CONFIGURATION.read_text(), "Groups"), re.M
    )
    return {group: (options, text) for group, options, text in rows}


def test_help_says_of_every_group_what_the_docs_say():
    """``--help`` listed the groups, the internal ``experiment_size/full`` among them, without a
    word on any. Now each has the line of docs/configuration.md, word for word; every group of
    conf/ is there with every option (``paper_*`` stands for its files), the default first."""
    shown = _help_groups()
    assert shown == _docs_groups()
    groups = {p.parent.name for p in (ROOT / "conf").glob("*/*.yaml")} - INTERNAL_GROUPS
    assert set(shown) == groups
    defaults = {}
    for entry in OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "config.yaml").defaults):
        if isinstance(entry, dict):
            defaults.update({k: v for k, v in entry.items() if k in groups})
    for group, (options, _) in shown.items():
        patterns = options.split(", ")
        files = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
        for name in files:
            assert any(fnmatch.fnmatch(name, p) for p in patterns), (group, name)
        for p in patterns:
            assert fnmatch.filter(files, p), (group, p)
        if defaults.get(group) is not None:
            assert patterns[0] == defaults[group], group


def test_every_setting_has_one_line_in_the_docs():
    """A setting without a line in docs/configuration.md, or a line of a setting that is none."""
    settings = _section(CONFIGURATION.read_text(), "Settings")
    documented = re.findall(r"^\| `([\w.]+)` \|", settings, re.M)
    assert len(documented) == len(set(documented))
    assert sorted(documented) == sorted({*SETTINGS, "model.hidden"})
