"""The rules by which the report judges a claim, in one place: a reduction against the paper's
(:func:`verdict`, with its interval over seeds), whether a saving is coding's
(:func:`not_coding`, :func:`by_coding`), and whether one configuration is faster than
another beyond the noise of its seeds (:func:`beyond_noise`, :func:`pays`). Each section's
sentences are beside its figure (:mod:`paper.sections`); the rules they state are here."""

from __future__ import annotations


def less_time(pct: float) -> str:
    """A reduction against SSGD (percent) in words: less time, or *more* where negative."""
    return f"{pct:.1f}% less time than SSGD" if pct >= 0 else f"{-pct:.1f}% *more* time than SSGD"


def verdict(ours: float, paper: float, lo: float | None = None, hi: float | None = None) -> str:
    """How a measured reduction (percent) compares with the paper's. With the 95% interval
    of the reduction over seeds (``lo``, ``hi``), the verdict is only what the interval
    supports: an interval that holds 0 is "within noise", whatever its mean."""
    if lo is not None and hi is not None:
        if hi < 0:
            return (
                f"**does not hold here**: cdc takes {-ours:.1f}% *more* time [{lo:.1f}, {hi:.1f}]"
            )
        if lo <= 0:
            return f"**within noise**: the interval of the reduction, [{lo:.1f}, {hi:.1f}], holds 0"
        if lo <= paper <= hi or abs(ours - paper) <= 10:
            return (
                f"**holds**: the paper's figure lies within 10 points of ours or inside its "
                f"interval [{lo:.1f}, {hi:.1f}]"
            )
        if hi < paper:
            return (
                f"**holds in direction**, but the saving is smaller than the paper's (its interval "
                f"[{lo:.1f}, {hi:.1f}])"
            )
        return (
            "**holds**, and the saving is larger than the paper's (its interval "
            f"[{lo:.1f}, {hi:.1f}])"
        )
    if ours <= 0:
        return f"**does not hold here**: cdc takes {-ours:.1f}% *more* time"
    if abs(ours - paper) <= 10:
        return "**holds**, within 10 points of the paper's figure"
    if ours < paper:
        return "**holds in direction**, but the saving is smaller than the paper's"
    return "**holds**, and the saving is larger than the paper's"


def not_coding(row: dict) -> list[tuple[str, str, bool]]:
    """The ends r = 1 and r = K that are faster than cdc's coded best beyond noise (the 95%
    interval of their reduction against it, over seeds, above 0; with one seed, its mean
    above 0): any saving is not coding's. Each as ``(name, how much faster, one seed)``."""
    out = []
    for end, name in (("r1_ahead", "r = 1"), ("rK_ahead", f"r = K = {row['K']}")):
        s = row["_stats"].get(end)
        if s and s["lo"] is not None and s["lo"] > 0:
            band = f"[{s['lo']:.1f}, {s['hi']:.1f}]"
            out.append((name, f"{s['mean']:.1f}% less time than the coded best {band}", False))
        elif s and s["lo"] is None and s["mean"] > 0:
            out.append((name, f"{s['mean']:.1f}% less time than the coded best; one seed", True))
    return out


def by_coding(said: str, faster: list[tuple[str, str, bool]], why: str) -> str:
    """A verdict that holds, but where an r without coding is faster still: its bold moves to
    "**but not by coding**", followed by ``why``."""
    if not faster or not said.startswith("**holds"):
        return said
    return said.replace("**holds", "holds", 1).replace("**", "", 1) + why


def beyond_noise(s: dict | None) -> int:
    """What a ratio over seeds says (``s``: :func:`dcoded.results.interval` of the per-seed
    ratios ``a / b``): ``1`` where its 95% interval lies wholly below 1 (``a`` is faster), ``-1``
    wholly above, ``0`` where it holds 1 or there is no interval (one seed).

    >>> beyond_noise({"mean": 0.8, "lo": 0.7, "hi": 0.9}), beyond_noise({"lo": 0.9, "hi": 1.1})
    (1, 0)
    >>> beyond_noise({"mean": 1.3, "lo": 1.2, "hi": 1.4}), beyond_noise({"mean": 0.5, "lo": None})
    (-1, 0)
    """
    if not s or s.get("lo") is None or s.get("hi") is None:
        return 0
    return 1 if s["hi"] < 1 else -1 if s["lo"] > 1 else 0


def than(s: dict | None, what: str) -> str:
    """A ratio over seeds ``a / what`` (:func:`dcoded.results.interval`, as
    :func:`paper.table_time.versus` gives it) in words: ``faster than``, ``slower than`` or ``not
    told apart from`` ``what`` by its 95% interval (:func:`beyond_noise`); by its ratio alone,
    said so, where one seed paired; ``not compared with`` where none did.

    >>> than({"mean": 0.8, "lo": 0.7, "hi": 0.9}, "DDP"), than({"mean": 0.9, "lo": 0.8, "hi": 1.1}, "DDP")
    ('faster than DDP', 'not told apart from DDP')
    >>> than({"mean": 1.2, "lo": None, "hi": None}, "DDP"), than({"mean": None}, "waiting")
    ('slower than DDP (one seed)', 'not compared with waiting')
    """  # noqa: E501
    if not s or s.get("mean") is None:
        return f"not compared with {what}"
    if s.get("lo") is None or s.get("hi") is None:
        return f"{'faster' if s['mean'] < 1 else 'slower'} than {what} (one seed)"
    said = {1: "faster than", -1: "slower than", 0: "not told apart from"}[beyond_noise(s)]
    return f"{said} {what}"


def pays(over_ddp: dict, over_tcp: dict | None) -> str:
    """Whether coding as multicast pays on a topology, over seeds: only where its step's ratio
    to DDP's and to the same shuffle's over TCP (each paired by seed) lie wholly below 1."""
    against = [("DDP", beyond_noise(over_ddp))] + (
        [("the same shuffle over TCP", beyond_noise(over_tcp))] if over_tcp else []
    )
    if all(v == 1 for _, v in against):
        return (
            f"**pays** here: its step's ratio to {' and to '.join(n for n, _ in against)}, "
            "paired by seed, lies wholly below 1."
        )
    faster = [name for name, v in against if v == 1]
    slower = [name for name, v in against if v == -1]
    noise = [name for name, v in against if v == 0]
    parts = []
    if faster:
        parts.append(f"it is faster than {' and '.join(faster)} beyond the seeds' noise")
    if noise:
        parts.append(f"not told apart from {' and '.join(noise)} (the interval holds 1)")
    if slower:
        parts.append(f"slower than {' and '.join(slower)}")
    verdict_word = "**does not pay**" if slower else "is **within noise**"
    return f"{verdict_word} here: {'; '.join(parts)}."
