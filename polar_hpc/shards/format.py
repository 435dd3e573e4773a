"""Shard format v1: framing, header, and the msgpack form of a trajectory (spec: docs/shards.md).

A shard is `MAGIC`, then records; record = u32 LE payload length, u32 LE zlib.crc32 of the
payload, msgpack payload. The first record is the header {format, writer, seq, created}; every
later one is a trajectory map whose per-trace token ids and loss mask are packed little-endian
int32 bytes and whose logprobs are packed little-endian float32 bytes.

`read_frames` yields (offset, payload) for each intact record and raises `FormatError(offset,
reason)` at the first bad magic, truncated or checksum-failing record; payload decoding errors
surface as `FormatError` from `decode_header` / `decode_trajectory` with offset -1 (the caller
knows where the payload came from).
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from collections.abc import Iterator
from typing import Any, BinaryIO

import msgspec

from polar_hpc.trajectory.model import Trace, Trajectory

MAGIC = b"POLARSH1"
VERSION = 1
FRAME = struct.Struct("<II")  # payload length, crc32 of payload

_LITTLE = sys.byteorder == "little"
assert array("i").itemsize == 4 and array("f").itemsize == 4, "array('i'/'f') must be 4 bytes"


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


PACKED = {"prompt_ids": "i", "response_ids": "i", "loss_mask": "i", "logprobs": "f"}  # trace field -> array code


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(Header)
_payload_decoder = msgspec.msgpack.Decoder()


def frame(payload: bytes) -> bytes:
    """The on-disk bytes of one record."""
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


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


def encode_trajectory(traj: Trajectory) -> bytes:
    """Payload of `traj`; raises OverflowError for ids outside int32, TypeError for odd metadata."""
    record = msgspec.structs.asdict(traj)
    record["traces"] = [_convert_arrays(msgspec.structs.asdict(t), _pack) for t in traj.traces]
    return _encoder.encode(record)


def decode_trajectory(payload: bytes) -> Trajectory:
    try:
        record = _payload_decoder.decode(payload)
        record["traces"] = [Trace(**_convert_arrays(t, _unpack)) for t in record["traces"]]
        return Trajectory(**record)
    except (msgspec.DecodeError, ValueError, TypeError, KeyError) as e:
        raise FormatError(-1, f"bad trajectory record: {e!r}") from None


def _convert_arrays(trace: dict[str, Any], convert) -> dict[str, Any]:
    """The trace map with its PACKED fields converted by `convert(code, value)` (pack or unpack)."""
    for name, code in PACKED.items():
        trace[name] = convert(code, trace[name])
    return trace


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
        if zlib.crc32(payload) != crc:
            raise FormatError(offset, "checksum mismatch")
        yield offset, payload
        offset += FRAME.size + length


def _pack(code: str, values: list) -> bytes:
    packed = array(code, values)
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes()


def _unpack(code: str, data: bytes) -> list:
    if len(data) % 4:
        raise ValueError(f"packed array of {len(data)} bytes is not a whole number of 4-byte items")
    values = array(code)
    values.frombytes(data)
    if not _LITTLE:
        values.byteswap()
    return values.tolist()
