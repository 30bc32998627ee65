"""The coded shuffle in pure numpy: placement, XOR codec and closed-form loads.

Knows nothing of torch or Dask; the training engine, the serial reference and the tests all
build on it.
"""

from dcoded.coding.codec import (
    as_bits,
    decode_piece,
    decode_value,
    encode_packet,
    piece_length,
    sum_in_order,
)
from dcoded.coding.loads import (
    Load,
    allgather,
    coded_shuffle,
    cross_cluster_sum,
    load_table,
    parameter_server,
    ring_allreduce,
    shuffle,
    summed_shuffle,
    uncoded_shuffle,
)
from dcoded.coding.placement import (
    Placement,
    array_split_slices,
    check_layout,
    clusters,
    groups,
    label_without,
    piece_slices,
    segment_slices,
    subsets,
    summed_plan,
    uncoded_sender,
)

__all__ = [
    "Load",
    "Placement",
    "allgather",
    "array_split_slices",
    "as_bits",
    "check_layout",
    "clusters",
    "coded_shuffle",
    "cross_cluster_sum",
    "decode_piece",
    "decode_value",
    "encode_packet",
    "groups",
    "label_without",
    "load_table",
    "parameter_server",
    "piece_length",
    "piece_slices",
    "ring_allreduce",
    "segment_slices",
    "shuffle",
    "subsets",
    "sum_in_order",
    "summed_plan",
    "summed_shuffle",
    "uncoded_sender",
    "uncoded_shuffle",
]
