"""The XOR codec of the coded shuffle, bit-exact for every float32 bit pattern.

In group ``S`` (``r+1`` workers), the value ``v(S, k) = g_{S∖{k}}[k]`` is needed by ``k`` and
known to every other member. It is cut into ``r`` pieces; member ``j`` sends one packet

    P(S, j) = XOR_{k ∈ S∖{j}} piece_j(v(S, k))

on the raw float32 bits viewed as uint32, zero-padded to the longest piece. Receiver ``k``
XORs out the pieces ``piece_j(v(S, k'))``, ``k' ∈ S∖{j, k}``, which it computed itself, and
is left with ``piece_j(v(S, k))``. XOR is its own inverse on bits, so decoding returns exactly
the bits that were encoded: NaN payloads, ``±inf``, ``-0.0`` and subnormals included.
Real-valued add/subtract would not be exact and is not used.

Inputs are the worker's own map output: ``grads[T]`` the flattened gradient of sub-batch ``T``
(only the ``T`` the worker holds need be present) and ``segments`` the segment slices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dcoded.coding.placement import Subset, label_without, piece_slices


def as_bits(values: np.ndarray) -> np.ndarray:
    """The raw bits of a float32 array as uint32, without any conversion."""
    values = np.ascontiguousarray(values)
    if values.dtype != np.float32:
        raise TypeError(f"the codec works on float32 values, got {values.dtype}")
    return values.view(np.uint32)


def piece(
    grads: Mapping[Subset, np.ndarray], segments: Sequence[slice], group: Subset, k: int, j: int
) -> np.ndarray:
    """``piece_j(v(S, k))`` from a worker that holds sub-batch ``S∖{k}`` (so ``j != k``)."""
    label = label_without(group, k)
    value = grads[label][segments[k]]
    return value[piece_slices(len(value), len(group) - 1)[label.index(j)]]


def piece_length(segments: Sequence[slice], group: Subset, receiver: int, sender: int) -> int:
    seg = segments[receiver]
    label = label_without(group, receiver)
    s = piece_slices(seg.stop - seg.start, len(group) - 1)[label.index(sender)]
    return s.stop - s.start


def encode_packet(
    group: Subset, sender: int, grads: Mapping[Subset, np.ndarray], segments: Sequence[slice]
) -> np.ndarray:
    """``P(S, j)``: XOR of the sender's pieces for every other member of the group (uint32).

    >>> from dcoded.coding.placement import segment_slices
    >>> g = {(0,): np.float32([1, 2]), (1,): np.float32([3, 4])}
    >>> pkt = encode_packet((0, 1), 0, g, segment_slices(2, 2))  # r=1: uncoded, piece = v
    >>> pkt.view(np.float32)
    array([2.], dtype=float32)
    """
    if sender not in group:
        raise ValueError(f"sender {sender} is not a member of group {group}")
    parts = [as_bits(piece(grads, segments, group, k, sender)) for k in group if k != sender]
    packet = np.zeros(max(len(p) for p in parts), dtype=np.uint32)
    for p in parts:
        packet[: len(p)] ^= p
    return packet


def decode_piece(
    group: Subset,
    sender: int,
    receiver: int,
    packet: np.ndarray,
    grads: Mapping[Subset, np.ndarray],
    segments: Sequence[slice],
) -> np.ndarray:
    """Recover ``piece_sender(v(S, receiver))`` (float32) from ``P(S, sender)``.

    Raises ``ValueError`` when the packet does not fit: wrong length, or padding bits left
    non-zero after decoding (a corrupt packet or inconsistent inputs).
    """
    if sender == receiver or sender not in group or receiver not in group:
        raise ValueError(f"need two distinct members of {group}, got {sender} -> {receiver}")
    packet = np.asarray(packet)
    if packet.dtype != np.uint32 or packet.ndim != 1:
        raise TypeError(f"packet must be a 1-d uint32 array, got {packet.dtype} {packet.shape}")
    expected = max(piece_length(segments, group, k, sender) for k in group if k != sender)
    if len(packet) != expected:
        raise ValueError(
            f"packet P({group},{sender}) has {len(packet)} elements, expected {expected}"
        )
    acc = packet.copy()
    for k in group:
        if k in (sender, receiver):
            continue
        bits = as_bits(piece(grads, segments, group, k, sender))
        if len(bits) > len(acc):
            raise ValueError(f"packet P({group},{sender}) is shorter than its pieces")
        acc[: len(bits)] ^= bits
    n = piece_length(segments, group, receiver, sender)
    if n > len(acc) or np.any(acc[n:]):
        raise ValueError(f"packet P({group},{sender}) does not decode cleanly at {receiver}")
    return acc[:n].view(np.float32)


def decode_value(
    group: Subset,
    receiver: int,
    packets: Mapping[int, np.ndarray],
    grads: Mapping[Subset, np.ndarray],
    segments: Sequence[slice],
) -> np.ndarray:
    """``v(S, k) = g_{S∖{k}}[k]``: the receiver's decoded pieces, concatenated in sender order."""
    senders = label_without(group, receiver)
    return np.concatenate(
        [decode_piece(group, j, receiver, packets[j], grads, segments) for j in senders]
    )


def sum_in_order(values: Sequence[np.ndarray]) -> np.ndarray:
    """``Σ_i values[i]`` in float32, left to right, starting from a copy of ``values[0]``.

    A fixed order makes the reduced gradient reproducible bit for bit; the engine, the serial
    reference and the hierarchical cross-cluster sum all go through this one function.
    """
    if not values:
        raise ValueError("nothing to sum")
    acc = np.array(values[0], dtype=np.float32, copy=True)
    for v in values[1:]:
        acc += v
    return acc


# --- the hybrid shuffle: the same exchange on values the sender computed -----------------------
#
# In group ``S`` of ``m + 1`` workers, ``values[k] = v(S, k)`` (a pre-summed segment, see
# ``dcoded.coding.hybrid``) for the members whose value is non-empty. ``v(S, k)`` is cut into
# ``m`` pieces, piece ``i`` carried by the ``i``-th member of ``S∖{k}``; absent values are
# skipped on both sides.


def _value_piece(group: Subset, k: int, j: int, value: np.ndarray) -> np.ndarray:
    return value[piece_slices(len(value), len(group) - 1)[label_without(group, k).index(j)]]


def _value_piece_length(group: Subset, k: int, j: int, length: int) -> int:
    s = piece_slices(length, len(group) - 1)[label_without(group, k).index(j)]
    return s.stop - s.start


def encode_values(group: Subset, sender: int, values: Mapping[int, np.ndarray]) -> np.ndarray:
    """``P(S, j)`` over pre-summed values: XOR of ``piece_j(v(S, k))`` for every ``k ≠ j`` in
    ``values`` (uint32, zero-padded to the longest piece).

    >>> v = {1: np.float32([1, 2]), 2: np.float32([3, 4])}
    >>> hex(encode_values((0, 1, 2), 0, v)[0])  # the bits of 1.0 XOR those of 3.0
    '0x7fc00000'
    """
    if sender not in group:
        raise ValueError(f"sender {sender} is not a member of group {group}")
    parts = [as_bits(_value_piece(group, k, sender, v)) for k, v in values.items() if k != sender]
    if not parts:
        raise ValueError(f"P({group},{sender}) carries nothing: no value for another member")
    packet = np.zeros(max(len(p) for p in parts), dtype=np.uint32)
    for p in parts:
        packet[: len(p)] ^= p
    return packet


def decode_value_piece(
    group: Subset,
    sender: int,
    receiver: int,
    packet: np.ndarray,
    values: Mapping[int, np.ndarray],
    length: int,
) -> np.ndarray:
    """Recover ``piece_sender(v(S, receiver))`` from ``P(S, sender)``; ``values`` holds the
    other non-empty ``v(S, k')`` (``k' ≠ sender, receiver``, computed by the receiver itself),
    ``length`` the receiver's segment length. ``ValueError`` when the packet does not fit."""
    if sender == receiver or sender not in group or receiver not in group:
        raise ValueError(f"need two distinct members of {group}, got {sender} -> {receiver}")
    packet = np.asarray(packet)
    if packet.dtype != np.uint32 or packet.ndim != 1:
        raise TypeError(f"packet must be a 1-d uint32 array, got {packet.dtype} {packet.shape}")
    others = {k: v for k, v in values.items() if k not in (sender, receiver)}
    n = _value_piece_length(group, receiver, sender, length)
    expected = max([n] + [_value_piece_length(group, k, sender, len(v)) for k, v in others.items()])
    if len(packet) != expected:
        raise ValueError(
            f"packet P({group},{sender}) has {len(packet)} elements, expected {expected}"
        )
    acc = packet.copy()
    for k, v in others.items():
        bits = as_bits(_value_piece(group, k, sender, v))
        acc[: len(bits)] ^= bits
    if np.any(acc[n:]):
        raise ValueError(f"packet P({group},{sender}) does not decode cleanly at {receiver}")
    return acc[:n].view(np.float32)


def decode_values(
    group: Subset,
    receiver: int,
    packets: Mapping[int, np.ndarray],
    values: Mapping[int, np.ndarray],
    length: int,
) -> np.ndarray:
    """``v(S, receiver)``: its ``m`` decoded pieces, concatenated in sender order."""
    return np.concatenate(
        [
            decode_value_piece(group, j, receiver, packets[j], values, length)
            for j in label_without(group, receiver)
        ]
    )
