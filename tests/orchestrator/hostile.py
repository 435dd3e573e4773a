"""What a hostile ZeroMQ peer sends: malformed multiparts, and junk on a raw TCP connection."""

from __future__ import annotations

import socket

import msgspec
import zmq

from polar_hpc import wire

JUNK = [  # each is one multipart a DEALER sends (a ZMTP peer cannot send zero frames: b"" is the least)
    [b""],
    [b"\xc1"],  # never valid msgpack
    [b"x"] * 3,
    [wire.encode(wire.StatusRequest())] * 3,  # a valid message in too many frames
    [b"y"] * 50,
    [msgspec.msgpack.encode({"type": "Hello", "gateway_id": 5})],  # a known tag, the wrong fields
    [msgspec.msgpack.encode({"type": "NoSuchMessage"})],
    [msgspec.msgpack.encode([1, [2, {"a": None}]])],
    [b"\x91" * 100_000 + b"\xc0"],  # nested 100 000 deep
    [msgspec.msgpack.encode({"type": "Report", "items": [{"type": "Hello", "gateway_id": "x", "host": "h",
                                                          "slots": 1}]})],  # a kind a Report does not carry
    [msgspec.msgpack.encode({"type": "Report", "items": [{"type": "Report", "items": []}]})],  # nested
    [msgspec.msgpack.encode({"type": "Report", "items": 5})],
]


def send_junk(sock: zmq.Socket) -> None:
    """Every JUNK multipart, then one frame over wire.MAX_MESSAGE_BYTES (its peer drops the
    connection; the DEALER connects again by itself)."""
    for frames in JUNK:
        sock.send_multipart(frames)
    sock.send(b"\0" * (wire.MAX_MESSAGE_BYTES + 1))


def raw_tcp_junk(endpoint: str) -> None:
    """A connect scan, an HTTP request and random bytes on plain TCP connections to `endpoint`."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    for payload in (b"", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", bytes(range(256)) * 64):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(payload)
