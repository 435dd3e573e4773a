"""The proxy's end of its link to the gateway: a ZeroMQ DEALER.

`GatewayLink(ctx, endpoint, peer_timeout_s)` connects to the gateway's ROUTER. `send(message)`
sends a wire message at once, without waiting: the send queue is unbounded, so messages leave in
the order `send` was called (every record of a session before its SessionClosed). `recv()` returns
the next decodable message and marks the gateway as heard for `liveness`. `close()` closes the
socket, still delivering what is queued for up to half a second.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import zmq
import zmq.asyncio

from polar_hpc import wire

log = logging.getLogger("polar_hpc.proxy")

_GATEWAY = "gateway"


class GatewayLink:
    """The DEALER to the gateway; messages leave in the order `send` was called."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, peer_timeout_s: float) -> None:
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 500)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # never wait nor drop: queue until the gateway reads
        self._sock.connect(endpoint)
        self.liveness = wire.Liveness(peer_timeout_s)
        self.liveness.heard(_GATEWAY)

    def send(self, message: wire.Message) -> None:
        self._sock.send(wire.encode(message)).add_done_callback(_log_failure)

    async def recv(self) -> wire.AnyMessage:
        while True:
            data = await self._sock.recv()
            self.liveness.heard(_GATEWAY)
            try:
                return wire.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                log.warning("ignoring undecodable message from gateway: %s", e)

    def close(self) -> None:
        self._sock.close()


def _log_failure(sent: asyncio.Future) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.error("could not send to the gateway: %s", sent.exception())
