"""Shard format v1: framing, header, and the msgpack form of a trajectory (spec: docs/shards.md).

A shard is `MAGIC`, then records; record = u32 LE payload length, u32 LE crc32 of the
payload, msgpack payload. The first record is the header {format, writer, seq, created}; every
later one is a trajectory map whose per-trace token ids and loss mask are packed little-endian
int32 bytes and whose logprobs are packed little-endian float32 bytes.

Writing copies no token: `encode_trajectory` returns the payload as a list of buffers (small
msgpack pieces between the traces' own arrays, written as msgpack bin values) and `frame` puts
the record header in front, for one `os.writev`. The CRC is libdeflate's (`deflate.crc32`, the
same CRC-32 as `zlib.crc32`, an order of magnitude faster).

`read_frames` yields (offset, payload) for each intact record and raises `FormatError(offset,
reason)` at the first bad magic, truncated or checksum-failing record; payload decoding errors
surface as `FormatError` from `decode_header` / `decode_trajectory` with offset -1 (the caller
knows where the payload came from).
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

from polar_hpc.trajectory.model import PACKED, Trace, Trajectory

MAGIC = b"POLARSH1"
VERSION = 1
FRAME = struct.Struct("<II")  # payload length, crc32 of payload

_LITTLE = sys.byteorder == "little"

Buffer = bytes | memoryview  # memoryviews of format "B": len() is their size in bytes


class FormatError(Exception):
    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"byte offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class Header(msgspec.Struct):
    format: int
    writer: str
    seq: int
    created: float


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(Header)
_payload_decoder = msgspec.msgpack.Decoder()


def frame(parts: list[Buffer]) -> list[Buffer]:
    """The on-disk buffers of one record whose payload is the concatenation of `parts`."""
    crc = 0
    for part in parts:
        crc = deflate.crc32(part, crc)
    return [FRAME.pack(sum(map(len, parts)), crc), *parts]


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


def encode_trajectory(traj: Trajectory) -> list[Buffer]:
    """Payload of `traj`, as buffers to write one after another (byte views of the traces' arrays
    among them, not copied on little-endian hosts, each a msgpack bin 32); raises TypeError for odd
    metadata or a packed field that is not the array a Trace holds."""
    fields = _encoder.encode({f: getattr(traj, f) for f in _TRAJECTORY_FIELDS})
    small = _TRAJECTORY_HEAD + fields[1:] + _TRACES_KEY + _array_header(len(traj.traces))
    parts: list[Buffer] = []
    for trace in traj.traces:
        small += _TRACE_HEAD + _encoder.encode({f: getattr(trace, f) for f in _TRACE_FIELDS})[1:]
        for name, code, key in _PACKED_KEYS:
            values = getattr(trace, name)
            if type(values) is not array or values.typecode != code:
                raise TypeError(f"trace field {name} is {type(values).__name__}, not array({code!r})")
            parts.append(small + key + _U32.pack(4 * len(values)))
            parts.append(memoryview(values if _LITTLE else _swapped(values)).cast("B"))
            small = b""
    if small:
        parts.append(small)
    return parts


def decode_trajectory(payload: bytes) -> Trajectory:
    try:
        record = _payload_decoder.decode(payload)
        record["traces"] = [Trace(**(t | {k: _unpack(c, t[k]) for k, c in PACKED.items()})) for t in record["traces"]]
        return Trajectory(**record)
    except (msgspec.DecodeError, ValueError, TypeError, KeyError) as e:
        raise FormatError(-1, f"bad trajectory record: {e!r}") from None


def _array_header(n: int) -> bytes:
    return bytes([0x90 | n]) if n < 16 else (b"\xdc" + struct.pack(">H", n) if n < 1 << 16 else b"\xdd" + _U32.pack(n))


# A trace map holds its other fields, then the packed ones (each key followed by bin 32's tag and
# size). Both structs have under 16 fields, so msgpack gives their maps a one-byte header (fixmap):
# the pairs of a map of some fields are its encoding after that byte.
_U32 = struct.Struct(">I")
_TRAJECTORY_FIELDS = tuple(f for f in Trajectory.__struct_fields__ if f != "traces")
_TRACE_FIELDS = tuple(f for f in Trace.__struct_fields__ if f not in PACKED)
assert len(Trajectory.__struct_fields__) < 16 and len(Trace.__struct_fields__) < 16
_TRAJECTORY_HEAD = bytes([0x80 | len(Trajectory.__struct_fields__)])
_TRACE_HEAD = bytes([0x80 | len(Trace.__struct_fields__)])
_TRACES_KEY = _encoder.encode("traces")
_PACKED_KEYS = [(name, code, _encoder.encode(name) + b"\xc6") for name, code in PACKED.items()]


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
