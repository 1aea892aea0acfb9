"""`DataProtoBase`: what the data layer's helpers recognise a DataProto by.

`verl.protocol.DataProto` derives from it, so `verl.dataproto.futures` and `batch_ops` can tell a
DataProto apart (and concatenate results with the class they came in) without importing
`verl.protocol`, which imports them to re-export their names.
"""

from __future__ import annotations

__all__ = ["DataProtoBase"]


class DataProtoBase:
    """Marker base of `verl.protocol.DataProto` (no state, no behaviour)."""

    __slots__ = ()
