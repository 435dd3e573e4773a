"""The engine step serves only an engine it started and can prove is its own: with a foreign server
already on `engine.port` (a plain HTTP server, or the scripted engine started separately with
another run's key) the step fails at once, saying so, and registers nothing; `identity.check`
refuses both foreign servers and accepts only an engine that demands the run's key."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from polar_hpc import security
from polar_hpc.engines import identity
from proxy.helpers import stop, wait_ready


class _Open(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (answers everything, asks for no key)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


@contextmanager
def _plain_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Open)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _scripted(key: str) -> Iterator[int]:
    """The scripted engine on a free port, demanding `key`."""
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready.json"
        proc = subprocess.Popen([sys.executable, "-m", "polar_hpc", "engine", "--kind", "scripted", "--host", "0.0.0.0",
                                 "--port", "0", "--ready-file", str(ready)], env=os.environ | {security.ENGINE_KEY_ENV: key},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield int(wait_ready(proc, ready).rsplit(":", 1)[1])
        finally:
            stop(proc)


def test_identity_check_refuses_foreign_servers_and_accepts_the_runs_engine() -> None:
    with _scripted("the-runs-key") as ours, _scripted("another-runs-key") as theirs, _plain_server() as plain:
        assert identity.check(f"http://127.0.0.1:{ours}", "the-runs-key") is None
        why = identity.check(f"http://127.0.0.1:{theirs}", "the-runs-key")
        assert why is not None and "answered 401 to GET /v1/models with the run's key" in why, why
        why = identity.check(f"http://127.0.0.1:{plain}", "the-runs-key")
        assert why is not None and "answered 200 to GET /v1/models with no key" in why, why


@pytest.mark.parametrize("foreign", ["plain", "scripted"])
def test_a_port_taken_before_the_step_starts_is_an_error(tmp_path: Path, foreign: str) -> None:
    security.create_keys(tmp_path)
    with (_plain_server() if foreign == "plain" else _scripted("another-runs-key")) as port:
        (tmp_path / "topology.yaml").write_text(f"engine:\n  kind: sglang\n  port: {port}\n")
        out = subprocess.run([sys.executable, "-m", "polar_hpc", "engine", "--kind", "sglang", "--run-dir",
                              str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out
    assert f"sglang server 0: port {port} (engine.port + 0) on " in out.stderr, out.stderr
    assert "is already taken by another process; this run serves only an engine it started" in out.stderr
    assert "registered" not in out.stdout and "Traceback" not in out.stderr, out
