"""Listeners that sandboxes hand to the proxy, so a harness without network reaches it with no relay process.

The sandbox's launcher (`sandbox/launcher.c` or `inside.py`) with `--relay PORT=SOCKET`, before it
execs a harness command, makes a listening TCP
socket on 127.0.0.1:PORT in the sandbox's own network namespace and sends it here, with the
session's token, over the Unix socket SOCKET (`Handoffs`, SOCK_SEQPACKET: one message of at most
`MAX_MESSAGE` bytes, the token, carrying one descriptor by SCM_RIGHTS). A socket keeps the network
namespace it was made in, so the proxy accepts the harness's connections on it directly.

The sandbox is hostile, so the handoff is bounded and checked:
- each connection gets `HANDOFF_S` to send its one message, and at most `PENDING` connections wait
  at once (more are closed at once); a message that is longer, carries no descriptor or more than
  one, or is not a token, is refused; every descriptor received and not kept is closed;
- the descriptor must be a listening (SO_ACCEPTCONN) SOCK_STREAM AF_INET socket bound to 127.0.0.1
  (`checked`), and the token that of an open session (`take`, given by the proxy: it binds the
  listener to that session, closing the one it had, so a session holds at most one);
- the answer is one message: b"ok", or b"refused: REASON" (the launcher then fails the command).
`Listener` accepts on a kept socket (and on the relay socket itself) with the loop's reader and
its own non-blocking accept, not `loop.create_server`: uvloop's server spins on a listener its
sandbox shut down under it; here any error but "nothing to accept" or a full file table (a pause
of `_PAUSE_S`) closes the listener (its session's calls then fail; nobody else's). `close()` stops
accepting and closes the socket (the session closed).
A sandbox can still hold up to `PENDING` silent connections for `HANDOFF_S` each, which delays
other sessions' handoffs at most that long (refused past it: their commands exit 126).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("polar_hpc.proxy")

HANDOFF_S = 2.0  # how long a handoff connection may take to send its message
MAX_MESSAGE = 256  # bytes of a handoff message (a token is 32)
PENDING = 256  # handoff connections waiting for their message at once
_ACCEPTS = 64  # connections accepted per wake-up of a listener
_PAUSE_S = 0.5  # a listener waits this long when the proxy is out of file descriptors
_SHORT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

Take = Callable[[str, socket.socket], str | None]  # (token, listener) -> None (kept) or why refused


def checked(fd: int) -> socket.socket:
    """The listening loopback TCP socket `fd` is, or ValueError (the descriptor is then closed)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        os.close(fd)
        raise ValueError(f"not a socket ({e.strerror})") from None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM or not listening:
            raise ValueError("not a listening TCP/IPv4 socket")
        if sock.getsockname()[0] != "127.0.0.1":
            raise ValueError("not bound to 127.0.0.1")
        sock.setblocking(False)
    except (OSError, ValueError) as e:
        sock.close()
        raise ValueError(str(e)) from None
    return sock


class Handoffs:
    """The Unix socket sandboxes hand their listeners to; `take` decides what is kept."""

    def __init__(self, path: Path, take: Take) -> None:
        self.take = take
        self.pending: set[asyncio.Task] = set()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.setblocking(False)
        self.sock.bind(str(path))
        self.sock.listen(PENDING)
        self.loop = asyncio.get_running_loop()
        self.listener = Listener(self.sock, self._connected)

    def _connected(self, conn: socket.socket) -> None:
        if len(self.pending) >= PENDING:
            conn.close()
            return
        task = self.loop.create_task(self._one(conn))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                async with asyncio.timeout(HANDOFF_S):
                    await _readable(self.loop, conn)
                answer = self._receive(conn)
            except TimeoutError:
                return
            except OSError as e:
                log.info("relay handoff: %s", e.strerror)
                return
            with contextlib.suppress(OSError):  # it hung up before its answer
                conn.send(answer)

    def _receive(self, conn: socket.socket) -> bytes:
        message, fds, flags, _ = socket.recv_fds(conn, MAX_MESSAGE, 1, socket.MSG_CMSG_CLOEXEC)
        why = None
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            why = "message too long or more than one descriptor"
        elif len(fds) != 1:
            why = "no listening socket sent"
        elif not message.isascii() or not message.decode().isprintable():
            why = "not a token"
        if why is not None:
            for fd in fds:
                os.close(fd)
        else:
            try:
                listener = checked(fds[0])
            except ValueError as e:
                why = str(e)
            else:
                why = self.take(message.decode(), listener)
                if why is not None:
                    listener.close()
        if why is not None:
            log.info("relay handoff refused: %s", why)
            return b"refused: " + why.encode()
        return b"ok"

    def close(self) -> None:
        self.listener.close()
        for task in self.pending:
            task.cancel()


class Listener:
    """Accepts on a handed-off listener; `connected(sock)` takes each connection."""

    def __init__(self, sock: socket.socket, connected: Callable[[socket.socket], None]) -> None:
        self.sock, self.connected = sock, connected
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(sock.fileno(), self._accept)
        self.paused: asyncio.TimerHandle | None = None

    def _accept(self) -> None:
        for _ in range(_ACCEPTS):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:
                if e.errno in _SHORT_OF_FDS:
                    self.loop.remove_reader(self.sock.fileno())
                    self.paused = self.loop.call_later(_PAUSE_S, self._resume)
                    return
                log.info("relay listener closed: %s", e.strerror)
                self.close()
                return
            conn.setblocking(False)
            self.connected(conn)

    def _resume(self) -> None:
        self.paused = None
        self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if self.sock.fileno() < 0:
            return
        if self.paused is not None:
            self.paused.cancel()
        else:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(sock.fileno(), _set, ready)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


def _set(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
