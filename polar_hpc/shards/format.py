"""Shard format v1: framing, header, and the msgpack form of a trajectory (spec: docs/shards.md).

A shard is `MAGIC`, then records; record = u32 LE payload length, u32 LE crc32 of the
payload, msgpack payload. The first record is the header {format, writer, seq, created}; every
later one is a trajectory map whose per-trace token ids and loss mask are packed little-endian
int32 bytes and whose logprobs are packed little-endian float32 bytes.

`encode_record` makes a trajectory's payload with one msgspec call (the traces' arrays go in as
bin values through an `enc_hook`) and `frame` puts the record header in front; the CRC is
libdeflate's (`deflate.crc32`, the same CRC-32 as `zlib.crc32`, an order of magnitude faster).
One contiguous payload measured faster than handing the arrays to `writev` uncopied: the copy is
a single memcpy per array, and CRC and write then read memory that is in cache (bench/shards.py).

`read_frames` yields (offset, payload) for each intact record and raises `FormatError(offset,
reason)` at the first bad magic, truncated or checksum-failing record; payload decoding errors
surface as `FormatError` from `decode_header` / `decode_trajectory` with offset -1 (the caller
knows where the payload came from). Decoding checks every field's type and ignores keys it does
not know (a later minor revision may add some), in the header, a trajectory and a trace alike.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from collections.abc import Iterator
from typing import Any, BinaryIO

import deflate
import msgspec

from polar_hpc.errors import PolarError
from polar_hpc.trajectory.model import PACKED, Trace, Trajectory

MAGIC = b"POLARSH1"
VERSION = 1
FRAME = struct.Struct("<II")  # payload length, crc32 of payload

_LITTLE = sys.byteorder == "little"

Buffer = bytes | memoryview  # memoryviews of format "B": len() is their size in bytes


class FormatError(PolarError):
    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"byte offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class Header(msgspec.Struct):
    format: int
    writer: str
    seq: int
    created: float


def _packed_bytes(obj: Any) -> memoryview:
    """enc_hook: a trace's array as its little-endian bytes."""
    if type(obj) is array:
        return memoryview(obj if _LITTLE else _swapped(obj)).cast("B")
    raise TypeError(f"cannot encode {type(obj).__name__} in a shard record")


def _record_struct(name: str, model: type, replace: dict[str, Any]) -> type:
    """A struct with `model`'s fields, in order, some retyped: what decoding checks a record against."""
    return msgspec.defstruct(name, [
        (f.name, replace.get(f.name, f.type)) if f.required
        else (f.name, replace.get(f.name, f.type), msgspec.field(default_factory=f.default_factory)
              if f.default is msgspec.NODEFAULT else f.default)
        for f in msgspec.structs.fields(model)])


_TraceRecord: Any = _record_struct("_TraceRecord", Trace, dict.fromkeys(PACKED, bytes))
_TrajectoryRecord: Any = _record_struct("_TrajectoryRecord", Trajectory, {"traces": list[_TraceRecord]})

_encoder = msgspec.msgpack.Encoder(enc_hook=_packed_bytes)
_header_decoder = msgspec.msgpack.Decoder(Header)
_record_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(_TrajectoryRecord)


def frame(payload: bytes) -> tuple[bytes, bytes]:
    """The on-disk buffers of one record: its header (length, CRC) and `payload`."""
    return FRAME.pack(len(payload), deflate.crc32(payload)), payload


def encode_header(writer: str, seq: int, created: float) -> bytes:
    return _encoder.encode(Header(VERSION, writer, seq, created))


def decode_header(payload: bytes) -> Header:
    try:
        header = _header_decoder.decode(payload)
    except msgspec.DecodeError as e:
        raise FormatError(-1, f"bad header: {e}") from None
    if header.format != VERSION:
        raise FormatError(-1, f"unsupported shard format {header.format} (this reader knows {VERSION})")
    return header


def encode_record(traj: Trajectory) -> tuple[bytes, bytes]:
    """The record of `traj` as `frame` gives it (a Trace's packed fields are always its arrays: it
    is frozen). Raises TypeError for metadata msgpack cannot hold."""
    return frame(_encoder.encode(traj))


def decode_trajectory(payload: bytes) -> Trajectory:
    try:
        record = _record_decoder.decode(payload)
        traces = [_trace(t) for t in record.traces]
        fields: dict[str, Any] = {name: traces if name == "traces" else getattr(record, name)
                                  for name in record.__struct_fields__}
        return Trajectory(**fields)
    except (msgspec.DecodeError, ValueError) as e:
        raise FormatError(-1, f"bad trajectory record: {e}") from None


def _trace(record: Any) -> Trace:
    fields = zip(record.__struct_fields__, msgspec.structs.astuple(record))
    values: dict[str, Any] = {name: _unpack(PACKED[name], value) if name in PACKED else value for name, value in fields}
    return Trace(**values)


def read_frames(f: BinaryIO, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """(offset, payload) of each intact record of the open shard `f`, header first; from `start`
    on when it is the offset of a record (0: check the magic first)."""
    size = os.fstat(f.fileno()).st_size
    if start:
        f.seek(start)
    elif f.read(len(MAGIC)) != MAGIC:
        raise FormatError(0, "not a polar shard (bad magic)")
    offset = start or len(MAGIC)
    while head := f.read(FRAME.size):
        if len(head) < FRAME.size:
            raise FormatError(offset, f"truncated record header ({len(head)} of {FRAME.size} bytes)")
        length, crc = FRAME.unpack(head)
        left = size - offset - FRAME.size
        if length > left:
            raise FormatError(offset, f"truncated record: length {length} but {max(left, 0)} bytes left")
        payload = f.read(length)
        if len(payload) != length:
            raise FormatError(offset, "truncated record: file shrank while reading")
        if deflate.crc32(payload) != crc:
            raise FormatError(offset, "checksum mismatch")
        yield offset, payload
        offset += FRAME.size + length


def _swapped(values: array) -> array:
    """A byteswapped copy of `values` (little-endian bytes, on a big-endian host)."""
    swapped = array(values.typecode, values)
    swapped.byteswap()
    return swapped


def _unpack(code: str, data: bytes) -> array:
    if len(data) % 4:
        raise ValueError(f"packed array of {len(data)} bytes is not a whole number of 4-byte items")
    values = array(code)
    values.frombytes(data)
    if not _LITTLE:
        values.byteswap()
    return values
