"""Listeners handed to a real proxy over its relay socket (proxy/relay.py), by a hostile sandbox:
only a listening loopback TCP socket with an open session's token is kept, one per session, for
that session's calls alone, closed with the session; junk, wrong descriptors and silent
connections are refused or dropped and leave the proxy serving."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from polar_hpc import wire
from proxy.helpers import FakeGateway, start_proxy

HANG_S = 60


@pytest.fixture
def relayed(short_tmp: Path, gateway: FakeGateway, engine):
    proxy = start_proxy(short_tmp, gateway, engine[0], relay_socket=str(short_tmp / "r.sock"))
    gateway.open("a", "token-a")
    gateway.open("b", "token-b")
    yield proxy, short_tmp / "r.sock"
    proxy.stop()
    assert proxy.proc.returncode == 0, proxy.log.read_text()


def _listener(family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(family, kind)
    sock.bind((host, 0))
    if kind == socket.SOCK_STREAM:
        sock.listen(8)
    return sock


def _hand(path: Path, payload: bytes, fds: list[int]) -> str:
    """Send one handoff message as inside.py does; the proxy's answer ('' if it hung up)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as link:
        link.settimeout(HANG_S)
        link.connect(str(path))
        socket.send_fds(link, [payload], fds) if fds else link.send(payload)
        return link.recv(512).decode()


def _hand_over(path: Path, token: str) -> int:
    """A fresh listener handed over with `token` and closed here (only the proxy holds it): its port."""
    with _listener() as sock:
        assert _hand(path, token.encode(), [sock.fileno()]) == "ok"
        return sock.getsockname()[1]


def _call(port: int, token: str) -> int:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HANG_S) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def _served(port: int) -> bool:
    """Whether anything listens on the port (the proxy, once the test closed its own copy)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=HANG_S).close()
        return True
    except ConnectionRefusedError:
        return False


def test_a_listener_serves_its_own_session_only_one_per_session_until_it_closes(relayed, gateway: FakeGateway) -> None:
    proxy, path = relayed
    first = _hand_over(path, "token-a")
    assert _call(first, "token-a") == 200
    assert _call(first, "token-b") == 401  # another session's token, on a's listener
    assert _call(first, "nobody") == 401
    assert gateway.expect(wire.CallRecord).session_id == "a"
    ports = [_hand_over(path, "token-a") for _ in range(5)]  # each replaces the one before
    assert [_served(p) for p in [first, *ports]] == [False] * 5 + [True]
    b = _hand_over(path, "token-b")
    gateway.send(wire.CloseSession("a"))
    assert gateway.expect(wire.SessionClosed) == wire.SessionClosed("a", 1)
    assert not _served(ports[-1])  # closed with its session
    assert _call(b, "token-b") == 200  # b's is untouched


def test_hostile_handoffs_are_refused_and_the_proxy_keeps_serving(relayed, gateway: FakeGateway) -> None:
    proxy, path = relayed
    gateway.open("c", "token-c")
    gateway.send(wire.CloseSession("c"))
    assert gateway.expect(wire.SessionClosed) == wire.SessionClosed("c", 0)
    bad = {
        "a bad token": ("nobody", _listener, "unknown or closed session"),
        "a closed session's token": ("token-c", _listener, "unknown or closed session"),
        "a file": ("token-a", lambda: open("/dev/null", "rb"), "not a socket"),
        "a UDP socket": ("token-a", lambda: _listener(kind=socket.SOCK_DGRAM), "not a listening TCP/IPv4"),
        "a TCP socket that does not listen": ("token-a", socket.socket, "not a listening TCP/IPv4"),
        "an IPv6 listener": ("token-a", lambda: _listener(socket.AF_INET6, host="::1"), "not a listening TCP/IPv4"),
        "a Unix listener": ("token-a", lambda: _unix_listener(path.parent), "not a listening TCP/IPv4"),
        "a listener on every address": ("token-a", lambda: _listener(host="0.0.0.0"), "not bound to 127.0.0.1"),
    }
    for what, (token, make, why) in bad.items():
        with make() as thing:
            answer = _hand(path, token.encode(), [thing.fileno()])
            assert answer.startswith("refused: ") and why in answer, (what, answer)
            port = thing.getsockname()[1] if isinstance(thing, socket.socket) and thing.family == socket.AF_INET else None
        if port:  # our copy is closed: nothing may still listen there
            assert not _served(port), what
    with _listener() as one, _listener() as two:  # two descriptors in one message: neither kept
        assert _hand(path, b"token-a", [one.fileno(), two.fileno()]).startswith("refused: ")
        ports = one.getsockname()[1], two.getsockname()[1]
    assert not any(_served(p) for p in ports)
    with _listener() as sock:  # a token over the size bound
        assert _hand(path, b"t" * 10_000, [sock.fileno()]).startswith("refused: message too long")
    assert _hand(path, b"\x00\xff junk", []) == "refused: no listening socket sent"
    with _listener() as sock:
        assert _hand(path, "tökén".encode(), [sock.fileno()]) == "refused: not a token"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:  # says nothing: dropped
        silent.connect(str(path))
        silent.settimeout(HANG_S)
        assert silent.recv(16) == b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stream:  # the wrong kind of socket
        with pytest.raises(OSError):
            stream.connect(str(path))
    assert _call(_hand_over(path, "token-a"), "token-a") == 200  # still serving
    assert proxy.proc.poll() is None


def test_a_listener_shut_down_under_the_proxy_is_dropped_without_spinning(relayed, gateway: FakeGateway) -> None:
    """uvloop's own server would spin on it; the proxy closes it and serves the others."""
    proxy, path = relayed
    with _listener() as sock:
        assert _hand(path, b"token-a", [sock.fileno()]) == "ok"
        sock.shutdown(socket.SHUT_RDWR)  # the proxy's copy is the same socket
        deadline = time.monotonic() + HANG_S
        while "relay listener closed" not in proxy.log.read_text():
            assert time.monotonic() < deadline, proxy.log.read_text()
            time.sleep(0.05)
    assert _call(_hand_over(path, "token-b"), "token-b") == 200


def _unix_listener(folder: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(folder / f"u{time.monotonic_ns()}.sock"))
    sock.listen(1)
    return sock

