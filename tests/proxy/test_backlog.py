"""A burst of connections beyond aiohttp's default backlog (128) is queued by the kernel, not
dropped (a dropped connection is retried a second later), at the proxy and the scripted engine."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from proxy.helpers import start_engine, start_proxy, stop

BURST = 400


def _connected(url: str) -> int:
    """How many of BURST connections to `url` the kernel completes (30 s at most)."""
    address = urlsplit(url)
    selector, socks = selectors.DefaultSelector(), []
    try:
        for _ in range(BURST):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex((address.hostname, address.port))
            selector.register(s, selectors.EVENT_WRITE)
            socks.append(s)
        done, deadline = 0, time.monotonic() + 30
        while done < BURST and time.monotonic() < deadline:
            for key, _ in selector.select(0.1):
                selector.unregister(key.fileobj)
                done += key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        return done
    finally:
        for s in socks:
            s.close()
        selector.close()


def _burst_while_stopped(pid: int, url: str) -> int:
    os.kill(pid, signal.SIGSTOP)  # nothing is accepted meanwhile: only the kernel's queue holds them
    try:
        return _connected(url)
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.skipif(int(Path("/proc/sys/net/core/somaxconn").read_text()) < BURST,
                    reason="the kernel caps every backlog below the burst (net.core.somaxconn)")
def test_a_burst_of_connections_waits_in_the_backlog(short_tmp, gateway):
    engine, engine_url, _ = start_engine(short_tmp, "e")
    try:
        proxy = start_proxy(short_tmp, gateway, engine_url, mode="passthrough")
        try:
            assert _burst_while_stopped(proxy.proc.pid, proxy.url) == BURST
        finally:
            proxy.stop()
        assert _burst_while_stopped(engine.pid, engine_url) == BURST
    finally:
        stop(engine)
