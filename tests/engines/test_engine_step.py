"""The engine step (`polar-hpc engine --kind scripted --run-dir RUN`) outside Slurm: it registers
its server with the orchestrator over CURVE, the orchestrator relays it to gateways, and it
deregisters when stopped. Its server runs with the topology's engine settings, as `polar-hpc run`'s
does (engines.command builds both command lines)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import zmq

from polar_hpc import security, wire
from tests.orchestrator.helpers import next_message, reply, start_orchestrator

TOPOLOGY = "gateway:\n  heartbeat_s: 0.2\n  peer_timeout_s: 5\nengine:\n  context_length: 64\n  sample_log: true\n"
TASK = {"id": "t", "instruction": "hi", "num_samples": 1, "harness": {"command": "true"}}


def _next(sock, kind, timeout_s=20.0):
    return next_message(sock, kind, timeout_s)


def test_engine_step_registers_and_deregisters(tmp_path: Path) -> None:
    security.create_keys(tmp_path)
    orch, endpoint = start_orchestrator(tmp_path, TOPOLOGY, TASK)
    step = subprocess.Popen([sys.executable, "-m", "polar_hpc", "engine", "--kind", "scripted", "--run-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)
    try:
        gw = ctx.socket(zmq.DEALER)
        security.secure_client(gw, tmp_path, security.GATEWAY)
        gw.connect(endpoint)
        admin = ctx.socket(zmq.DEALER)
        security.secure_client(admin, tmp_path, security.ADMIN)
        admin.connect(endpoint)
        gw.send(wire.encode(wire.Hello(gateway_id="g", host="h", slots=1)))
        engines, deadline = _next(gw, wire.Engines), time.monotonic() + 60
        while not engines.urls:  # heartbeating as a gateway does, however long the step takes to start
            assert time.monotonic() < deadline and step.poll() is None, "the engine step never registered"
            gw.send(wire.encode(wire.Heartbeat(sender="g", t=time.time())))
            engines = reply(gw, wire.Engines, 0.5) or engines
        (url,) = engines.urls
        with urllib.request.urlopen(url + "/health", timeout=5) as r:  # the URL serves the engine
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:  # but only to callers with the run's key
            urllib.request.urlopen(url + "/get_model_info", timeout=5)
        assert refused.value.code == 401
        with_key = urllib.request.Request(url + "/get_model_info",
                                          headers={"Authorization": f"Bearer {security.engine_api_key(tmp_path)}"})
        with urllib.request.urlopen(with_key, timeout=5) as r:
            assert r.status == 200
        _check_engine_settings(url, tmp_path)
        step.send_signal(signal.SIGTERM)
        assert step.wait(30) == 0, step.stdout.read()
        gw.send(wire.encode(wire.Heartbeat(sender="g", t=time.time())))
        assert _next(gw, wire.Engines, 10).urls == []  # deregistered at once, not after peer_timeout_s
        admin.send(wire.encode(wire.StatusRequest()))
        members = {(m.kind, m.up) for m in _next(admin, wire.StatusReply).members}
        assert members == {("gateway", True), ("engine", False)}  # status shows it down
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            raise AssertionError("the engine server outlived its step")
        except OSError:
            pass
    finally:
        step.kill()
        orch.kill()
        orch.wait()
        ctx.destroy(linger=0)


def _generate(url: str, run_dir: Path, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {security.engine_api_key(run_dir)}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _check_engine_settings(url: str, run_dir: Path) -> None:
    """engine.context_length (64) bounds the step's engine; engine.sample_log logs what it served."""
    status, body = _generate(url, run_dir, {"input_ids": [5] * 70, "rid": "long"})
    assert status == 400 and "context length (64 tokens)" in body, body
    status, body = _generate(url, run_dir, {"input_ids": [5] * 8, "rid": "short",
                                            "sampling_params": {"max_new_tokens": 4}})
    assert status == 200, body
    (log,) = (run_dir / "logs").glob("engine-samples-*.jsonl")
    assert [json.loads(line)["rid"] for line in log.read_text().splitlines()] == ["short"]
