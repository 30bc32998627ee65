"""The gradient exchanges of ``cdc`` (``coding.shuffle``), one module each, every one a
:class:`~dcoded.coding.shuffles.base.Shuffle`: XOR-coded packets (``coded``), the values whole
(``uncoded``), pre-summed values (``summed``), hybrid packets of sums (``hybrid``), or the
coded packets' pieces sent plain (``pieces``).

Adding a shuffle: a module here with a subclass of :class:`Shuffle` and its instance, listed
in :data:`SCHEMES`. ``coding.shuffle`` accepts it, the engine (both transports), the serial
reference, the straggler logic, the loads, the summary, the benchmark and the performance
model run it, and ``tests/test_shuffles.py`` holds it to what every shuffle must give.

>>> scheme("coded").sends(__import__("dcoded.coding").coding.Placement(4, 2), 0)[0]
(('pkt', (0, 1, 2), 0), [1, 2])
"""

from __future__ import annotations

from dcoded.coding.shuffles.base import Load, Request, Shuffle
from dcoded.coding.shuffles.coded import CODED
from dcoded.coding.shuffles.hybrid import HYBRID
from dcoded.coding.shuffles.pieces import PIECES
from dcoded.coding.shuffles.summed import SUMMED
from dcoded.coding.shuffles.uncoded import UNCODED

#: Every shuffle by its ``coding.shuffle`` name, in the order tables list them.
SCHEMES: dict[str, Shuffle] = {s.name: s for s in (CODED, UNCODED, SUMMED, HYBRID, PIECES)}
#: Their names (``coding.shuffle``).
SHUFFLES = tuple(SCHEMES)
#: Every shuffle by the kind of its messages' tags (``pkt``, ``unc``, ``sum``, ``hyb``, ``pcs``).
KINDS: dict[str, Shuffle] = {s.kind: s for s in SCHEMES.values()}

__all__ = [
    "KINDS",
    "SCHEMES",
    "SHUFFLES",
    "Load",
    "Request",
    "Shuffle",
    "of_tag",
    "scheme",
]


def of_tag(tag: tuple) -> Shuffle:
    """The shuffle a message belongs to, by its tag's kind."""
    return KINDS[tag[0]]


def scheme(name: str) -> Shuffle:
    """The shuffle called ``name`` (``ValueError`` naming the choices for another)."""
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(
            f"coding.shuffle={name!r} is not known: choose one of {SHUFFLES}"
        ) from None
