"""Protobuf's wire format over Arrow columns: one length-delimited field a row.

A column of serialized fields is built with Arrow compute (element-wise joins)
and numpy, without a Python step a row; its rows lie back to back in one buffer,
so the bytes of a repeated field over a run of rows are a slice of that buffer.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# pyarrow's type stubs join all arrays or all scalars; the kernel broadcasts scalars.
_join: Any = pc.binary_join_element_wise

Column = pa.LargeBinaryArray


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(message: Any, field: str) -> bytes:
    """The key of a length-delimited field (bytes, string or message) of a message type."""
    return varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)


def as_column(array: pa.Array[Any]) -> Column:
    """Bytes, text or integers (as decimal text) as a large_binary column."""
    if pa.types.is_integer(array.type):  # Arrow casts integers to text only
        array = array.cast(pa.large_string())
    return cast(Column, array.cast(pa.large_binary()))


def binary(offsets: np.ndarray, data: np.ndarray) -> Column:
    """A large_binary column of `data`, row i from offsets[i] to offsets[i + 1]."""
    buffers = [None, pa.py_buffer(offsets.astype(np.int64).data), pa.py_buffer(data.data)]
    return cast(Column, pa.Array.from_buffers(pa.large_binary(), len(offsets) - 1, buffers))


def spans(column: Column) -> tuple[memoryview, np.ndarray]:
    """The data buffer of a large_binary column and where each row starts in it (and
    where the last ends)."""
    _, offsets, data = column.buffers()
    assert offsets is not None
    assert data is not None
    starts = np.frombuffer(memoryview(offsets), np.int64, len(column) + 1, column.offset * 8)
    return memoryview(data), starts


def join(*parts: Column | bytes) -> Column:
    """Row by row, the parts one after the other; bytes stand for every row."""
    as_columns = (pa.scalar(p, pa.large_binary()) if isinstance(p, bytes) else p for p in parts)
    return cast(Column, _join(*as_columns, pa.scalar(b"", pa.large_binary())))


def fields(field_key: bytes, values: Column, omit_empty: bool = False) -> Column:
    """Each row of a large_binary column as a field: key, varint length, bytes; with
    `omit_empty`, an empty row stays empty, as proto3 leaves out an empty bytes field."""
    lengths = np.diff(spans(values)[1]).astype(np.uint64)
    varint_sizes = np.ones(len(lengths), np.int64)
    for shift in (7, 14, 21, 28, 35, 42, 49, 56):
        varint_sizes += lengths >= np.uint64(1 << shift)
    sizes = len(field_key) + varint_sizes
    if omit_empty:
        sizes[lengths == 0] = 0
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    written = sizes > 0
    starts = offsets[:-1][written]
    for index, byte in enumerate(field_key):
        data[starts + index] = byte
    lengths, varint_sizes = lengths[written], varint_sizes[written]
    for index in range(int(varint_sizes.max(initial=0))):
        more = varint_sizes > index
        seven = (lengths[more] >> np.uint64(7 * index)) & np.uint64(0x7F)
        seven |= np.where(varint_sizes[more] > index + 1, np.uint64(0x80), np.uint64(0))
        data[starts[more] + len(field_key) + index] = seven
    return join(binary(offsets, data), values)
