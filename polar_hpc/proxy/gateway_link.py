"""The proxy's end of the proxy link to its gateway: a ZeroMQ DEALER (the gateway's end is
gateway.server's `ProxyLinkRouter`).

`ProxyLinkDealer(ctx, endpoint, peer_timeout_s)` connects to the gateway's ROUTER, under the routing id
the gateway gave it in `security.PROXY_LINK_ENV` (the gateway takes messages from that id only). `send(message)`
sends a wire message at once, without waiting: the send queue is unbounded, so messages leave in
the order `send` was called (every record of a session before its SessionClosed). `recv()` returns
the next message and marks the gateway as heard for `liveness`; a malformed one (not one frame,
undecodable) is logged and skipped. `close()` closes the
socket, still delivering what is queued for up to half a second.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import cast

import zmq
import zmq.asyncio

from polar_hpc import wire
from polar_hpc.security import PROXY_LINK_ENV

log = logging.getLogger("polar_hpc.proxy")

_GATEWAY = "gateway"


class ProxyLinkDealer:
    """The DEALER to the gateway; messages leave in the order `send` was called."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, peer_timeout_s: float) -> None:
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 500)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # never wait nor drop: queue until the gateway reads
        if link_id := os.environ.get(PROXY_LINK_ENV):
            self._sock.setsockopt(zmq.ROUTING_ID, link_id.encode())
        self._sock.connect(endpoint)
        self.liveness = wire.Liveness(peer_timeout_s)
        self.liveness.heard(_GATEWAY)

    def send(self, message: wire.Message) -> None:
        # pyzmq's stub types zmq.asyncio's send as an Awaitable; it returns an asyncio Future
        sent = cast("asyncio.Future[zmq.MessageTracker | None]", self._sock.send(wire.encode(message)))
        sent.add_done_callback(_log_failure)

    async def recv(self) -> wire.AnyMessage:
        while True:
            frames = await self._sock.recv_multipart()
            self.liveness.heard(_GATEWAY)
            try:
                return wire.unpack(frames, 1)
            except wire.BadMessage as e:
                log.warning("ignoring a message from the gateway: %s", e)

    def close(self) -> None:
        self._sock.close()


def _log_failure(sent: asyncio.Future) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.error("could not send to the gateway: %s", sent.exception())
