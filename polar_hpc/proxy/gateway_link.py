"""The proxy's end of its link to the gateway: a ZeroMQ DEALER with one FIFO outbox.

`GatewayLink(ctx, endpoint, peer_timeout_s)` connects to the gateway's ROUTER. `send(message)`
queues a wire message; `pump()` sends queued messages in order (so every record of a session leaves
before its SessionClosed) until `close(pump)` flushes and closes the socket. `recv()` returns the
next decodable message and marks the gateway as heard for `liveness`.
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
        self._sock.connect(endpoint)
        self._outbox: asyncio.Queue[wire.Message | None] = asyncio.Queue()
        self.liveness = wire.Liveness(peer_timeout_s)
        self.liveness.heard(_GATEWAY)

    def send(self, message: wire.Message) -> None:
        self._outbox.put_nowait(message)

    async def pump(self) -> None:
        """Send queued messages until `close` queues the end marker."""
        while (message := await self._outbox.get()) is not None:
            await self._sock.send(wire.encode(message))

    async def recv(self) -> wire.AnyMessage:
        while True:
            data = await self._sock.recv()
            self.liveness.heard(_GATEWAY)
            try:
                return wire.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                log.warning("ignoring undecodable message from gateway: %s", e)

    async def close(self, pump: asyncio.Task) -> None:
        """Flush what is queued (briefly), then close the socket."""
        self._outbox.put_nowait(None)
        await asyncio.wait([pump], timeout=1.0)
        pump.cancel()
        self._sock.close()
