"""The escape suite: what a harness in a bwrap sandbox with network `none` must not be able to do.

Runs real bwrap sandboxes; the proxy is played by a small HTTP server listening on a host loopback
port and on a Unix socket (the real proxy's Unix socket is exercised in test_network_e2e.py).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
from aiohttp import web

from e2e.helpers import live_processes_matching
from polar_hpc.sandbox import Limits, bwrap
from polar_hpc.sandbox.bwrap import BwrapSandbox

pytestmark = pytest.mark.skipif(not bwrap.available(), reason="bubblewrap not installed or not usable here")

PY = sys.executable


def _run(coro):
    return asyncio.run(coro)


class _Proxy:
    """An HTTP server on 127.0.0.1:PORT and on a Unix socket; GET / answers 'proxy-ok'."""

    def __init__(self, folder: Path) -> None:
        self.socket = folder / "proxy.sock"

    async def __aenter__(self):
        app = web.Application()
        async def hello(_request):
            return web.Response(text="proxy-ok")

        app.router.add_get("/", hello)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = self.runner.addresses[0][1]
        await web.UnixSite(self.runner, str(self.socket)).start()
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


def _box(root: Path, proxy_socket: Path | None = None, hidden: tuple[Path, ...] = (), **limits) -> BwrapSandbox:
    return BwrapSandbox(root, {}, [], "none", proxy_socket=proxy_socket, limits=Limits(**limits), hidden=hidden)


CONNECT = """
import socket, sys
for host, port in [(a.split(':')[0], int(a.split(':')[1])) for a in sys.argv[1:]]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print(host, port, 'connected')
    except OSError as e:
        print(host, port, 'failed', type(e).__name__)
"""


def test_network_none_reaches_the_proxy_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "connect.py").write_text(CONNECT)

    async def go():
        async with _Proxy(tmp_path) as proxy:
            sb = _box(tmp_path / "sb", proxy.socket)
            await sb.start()
            await sb.upload(tmp_path / "connect.py", "connect.py")
            url = sb.proxy_url(f"http://127.0.0.1:{proxy.port}")
            get = f"{PY} -c \"import urllib.request; print(urllib.request.urlopen('{url}/').read().decode())\""
            via_proxy = await sb.exec(get, {}, 30)
            probes = await sb.exec(f"{PY} connect.py 127.0.0.1:{proxy.port} 1.1.1.1:80 151.101.0.223:443", {}, 30)
            assert await sb.stop()
            return url, via_proxy, probes

    url, via_proxy, probes = _run(go())
    assert url == "http://127.0.0.1:47111"
    assert via_proxy.stdout == b"proxy-ok\n", via_proxy.stderr
    lines = probes.stdout.decode().splitlines()
    assert len(lines) == 3 and all(" failed " in line for line in lines), probes.stdout + probes.stderr


@pytest.mark.parametrize("base", ["/tmp", "/var/tmp"])
def test_other_sessions_and_host_paths(base: str) -> None:
    parent = Path(tempfile.mkdtemp(prefix="polar-escape-", dir=base))
    other = parent / "other"
    (other / "work").mkdir(parents=True)
    (other / "work" / "secret.txt").write_text("secret")
    run_dir = Path(tempfile.mkdtemp(prefix="polar-run-", dir=base))
    (run_dir / "rendezvous.json").write_text("keys")
    host_tmp = Path("/tmp") / f"polar-host-{os.getpid()}"
    host_tmp.write_text("host")

    async def go():
        sb = _box(parent / "mine", hidden=(run_dir,))
        await sb.start()
        (sb.tmp / "own.txt").write_text("own")
        peek = await sb.exec(f"cat {other}/work/secret.txt {run_dir}/rendezvous.json; ls {parent}", {}, 10)
        writes = await sb.exec(
            f"for p in /usr/polar-x /etc/polar-x {Path.home()}/polar-x; do"
            f" touch $p 2>/dev/null && echo WROTE $p; done; touch {parent}/polar-x; true", {}, 10)
        wipe = await sb.exec("rm -rf /tmp/* /tmp/.[!.]* 2>/dev/null; ls -A /tmp | grep -v polar", {}, 10)
        # what stays: the read-only folders holding the interpreter or PATH, when they live under /tmp
        assert await sb.stop()
        return peek, writes, wipe

    try:
        peek, writes, wipe = _run(go())
        assert b"secret" not in peek.stdout and b"other" not in peek.stdout and b"keys" not in peek.stdout, peek
        assert writes.stdout == b""
        assert not any(Path(p).exists() for p in ["/usr/polar-x", "/etc/polar-x", parent / "polar-x"])
        assert not (Path.home() / "polar-x").exists()
        left = {Path(p).name for p in bwrap.shown_dirs()}
        assert set(wipe.stdout.decode().split()) <= left  # its own /tmp is empty...
        assert host_tmp.read_text() == "host"  # ...the host's is untouched
        assert (other / "work" / "secret.txt").read_text() == "secret"
    finally:
        host_tmp.unlink()
        shutil.rmtree(parent)
        shutil.rmtree(run_dir)


def test_fork_bomb_is_bounded_and_ends_the_command(tmp_path: Path) -> None:
    async def go():
        sb = _box(tmp_path / "sb", max_pids=64)
        await sb.start()
        t0 = time.monotonic()
        bomb = await sb.exec("f() { f | f & }; f; sleep 60", {}, 30)
        elapsed = time.monotonic() - t0
        after = await sb.exec("echo still-works", {}, 10)
        return bomb, elapsed, after, await sb.stop(), sb

    bomb, elapsed, after, clean, sb = _run(go())
    if sb._cgroup is None:
        pytest.skip("no pids cgroup here (the RLIMIT_NPROC path is tested in test_limits.py)")
    assert bomb.limit == "process limit reached (max_pids=64)" and not bomb.timed_out
    assert elapsed < 25
    assert after.stdout == b"still-works\n"
    assert clean


def test_disk_and_output_floods_are_bounded(tmp_path: Path) -> None:
    async def go():
        sb = _box(tmp_path / "sb", max_file_bytes=1 << 20, max_disk_bytes=8 << 20, max_output=4096)
        await sb.start()
        one_file = await sb.exec("yes > big", {}, 30)
        size = (sb.workspace / "big").stat().st_size
        many = await sb.exec("i=0; while :; do i=$((i+1)); head -c 1000000 /dev/zero > f$i; done", {}, 60)
        for f in sb.workspace.glob("f*"):
            f.unlink()
        stdout = await sb.exec("yes", {}, 2)
        assert await sb.stop()
        return one_file, size, many, stdout

    one_file, size, many, stdout = _run(go())
    assert size == 1 << 20 and one_file.returncode != 0 and b"File too large" in one_file.stderr
    assert many.limit == f"disk limit exceeded (max_disk_bytes={8 << 20})" and not many.timed_out
    assert stdout.timed_out and len(stdout.stdout) == 4096


def test_sigterm_ignorer_is_killed_at_the_deadline_and_nothing_survives_stop(tmp_path: Path) -> None:
    marker = f"7{os.getpid() % 100000:05d}3"

    async def go():
        sb = _box(tmp_path / "sb")
        await sb.start()
        t0 = time.monotonic()
        r = await sb.exec(f"trap '' TERM; (setsid env -i sleep {marker} &); sleep {marker}", {}, 1.5)
        return r, time.monotonic() - t0, await sb.stop()

    r, elapsed, clean = _run(go())
    assert r.timed_out and 1.4 < elapsed < 6
    assert clean
    assert not live_processes_matching(marker)
