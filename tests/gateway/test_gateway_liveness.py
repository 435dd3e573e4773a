"""A gateway whose orchestrator goes silent stops on its own, taking its proxy with it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import zmq

from polar_hpc import wire


def test_gateway_exits_when_orchestrator_is_silent(tmp_path: Path) -> None:
    (tmp_path / "topology.yaml").write_text("gateway:\n  heartbeat_s: 0.1\n  peer_timeout_s: 1.0\n")
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "polar_hpc", "gateway", "--run-dir", str(tmp_path), "--orchestrator",
         f"tcp://127.0.0.1:{port}", "--engine-url", "http://127.0.0.1:9", "--gateway-id", "g0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert router.poll(30000), "gateway never said hello"
        _, payload = router.recv_multipart()
        hello = wire.decode(payload)
        assert isinstance(hello, wire.Hello) and hello.gateway_id == "g0"
        t0 = time.monotonic()
        code = proc.wait(60)  # we never answer: the gateway must notice
        elapsed = time.monotonic() - t0
        out = proc.stdout.read()
        assert code == 1, out
        assert 0.8 <= elapsed < 10, elapsed
        assert "lost contact with orchestrator" in out
        proxy_logs = list((tmp_path / "logs").glob("proxy-*.log"))
        assert proxy_logs, "the gateway starts its proxy"
    finally:
        proc.kill()
        ctx.destroy(linger=0)
