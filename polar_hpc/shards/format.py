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
    among them, not copied on little-endian hosts); raises TypeError for odd metadata or a packed
    field that is not the array a Trace holds."""
    small = _pairs({f: getattr(traj, f) for f in _TRAJECTORY_FIELDS}, len(_TRAJECTORY_FIELDS) + 1)
    small += _TRACES_KEY + _array_header(len(traj.traces))
    parts: list[Buffer] = []
    for trace in traj.traces:
        small += _pairs({f: getattr(trace, f) for f in _TRACE_FIELDS}, len(_TRACE_FIELDS) + len(PACKED))
        for name, code in PACKED.items():
            values = getattr(trace, name)
            if type(values) is not array or values.typecode != code:
                raise TypeError(f"trace field {name} is {type(values).__name__}, not array({code!r})")
            parts += [small + _KEYS[name] + _bin_header(4 * len(values)), memoryview(_little(values)).cast("B")]
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


def _pairs(fields: dict[str, Any], n: int) -> bytes:
    """The msgpack header of a map of `n` entries, then the key/value pairs of `fields` (its first
    entries; the caller appends the rest)."""
    encoded = _encoder.encode(fields)
    return _map_header(n) + encoded[len(_map_header(len(fields))) :]


def _map_header(n: int) -> bytes:
    return _sized(n, 0x80, b"\xde", b"\xdf")


def _array_header(n: int) -> bytes:
    return _sized(n, 0x90, b"\xdc", b"\xdd")


def _bin_header(n: int) -> bytes:
    return b"\xc4" + bytes([n]) if n < 1 << 8 else _sized(n, None, b"\xc5", b"\xc6")


def _sized(n: int, fix: int | None, tag16: bytes, tag32: bytes) -> bytes:
    """msgpack's header of a value of `n` entries or bytes: one byte `fix | n` below 16 (when the type
    has that form), else a tag and a big-endian u16 or u32."""
    if fix is not None and n < 16:
        return bytes([fix | n])
    return tag16 + struct.pack(">H", n) if n < 1 << 16 else tag32 + struct.pack(">I", n)


_TRACES_KEY = _encoder.encode("traces")
_KEYS = {name: _encoder.encode(name) for name in PACKED}
_TRAJECTORY_FIELDS = tuple(f for f in Trajectory.__struct_fields__ if f != "traces")
_TRACE_FIELDS = tuple(f for f in Trace.__struct_fields__ if f not in PACKED)  # packed ones go last


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


def _little(values: array) -> array:
    """`values` itself on little-endian hosts, else a byteswapped copy."""
    if _LITTLE:
        return values
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
