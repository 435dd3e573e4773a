"""A real `polar-hpc run --service` under attack from another process: it has the run's keys (0600)
like a Slurm run, so a peer without them gets no answer; junk and forbidden kinds sent to the
orchestrator (with the client key) and to the gateway's proxy link are dropped; the engine answers
only with the run's API key, which is on no command line and not in the harness's environment;
and a session still completes afterwards."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import zmq

from polar_hpc import security, wire
from polar_hpc.client import Client
from polar_hpc.shards.reader import iter_trajectories
from tests.orchestrator.hostile import raw_tcp_junk, send_junk

from service.helpers import service_job

HARNESS = Path(__file__).parent / "data" / "one_call.py"
TOPOLOGY = "service: {enabled: true}\nsandbox: {backend: none}\ngateway: {shard_max_age_s: 0.2}\n"
TASK = {"id": "after-attack", "instruction": "x", "num_samples": 1, "timeout_s": 120,
        "harness": {"command": f'test -z "${security.ENGINE_KEY_ENV}" && python3 one_call.py'},
        "sandbox": {"files": {"one_call.py": str(HARNESS)}}}


def _post(url: str, body: dict, key: str | None) -> int:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), headers), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _proxy_link(run_dir: Path) -> str:
    log, deadline = run_dir / "logs" / "gateway-local.log", time.monotonic() + 120
    while not (found := re.search(r"proxy link at (\S+)", log.read_text() if log.exists() else "")):
        assert time.monotonic() < deadline, "the gateway never bound its proxy link"
        time.sleep(0.1)
    return found.group(1)


def test_a_local_run_keeps_its_keys_and_survives_hostile_peers(tmp_path: Path) -> None:
    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)
    with service_job(tmp_path, TOPOLOGY) as (job, run_dir):
        keys = run_dir / "keys"
        assert keys.stat().st_mode & 0o777 == 0o700
        assert {f.name: f.stat().st_mode & 0o777 for f in keys.iterdir()} == dict.fromkeys(
            ["server.json", "gateway.json", "engine.json", "client.json", "admin.json", "engine_api_key"], 0o600)
        api_key = security.engine_api_key(run_dir)
        endpoint = json.loads((run_dir / "rendezvous.json").read_text())["endpoint"]

        plain = ctx.socket(zmq.DEALER)  # another local user: no keys
        plain.connect(endpoint)
        plain.send(wire.encode(wire.StatusRequest()))
        assert not plain.poll(1500)

        junk = ctx.socket(zmq.DEALER)  # a holder of the client key
        security.secure_client(junk, run_dir, security.CLIENT)
        junk.connect(endpoint)
        send_junk(junk)  # its last frame drops the connection, and what was queued behind it
        raw_tcp_junk(endpoint)
        hostile = ctx.socket(zmq.DEALER)  # so the forbidden kinds go on a connection of their own
        security.secure_client(hostile, run_dir, security.CLIENT)
        hostile.connect(endpoint)
        for forbidden in (wire.Shutdown(reason="intruder"), wire.Hello(gateway_id="evil", host="h", slots=99),
                          wire.Credit(n=99), wire.EngineHello(engine_id="evil", url="http://evil:1",
                                                              weight_version="v9", host="h")):
            hostile.send(wire.encode(forbidden))

        junk_link = ctx.socket(zmq.DEALER)  # the gateway's proxy link (ipc, reachable by the same user)
        junk_link.connect(_proxy_link(run_dir))
        send_junk(junk_link)
        link = ctx.socket(zmq.DEALER)
        link.connect(_proxy_link(run_dir))
        link.send(wire.encode(wire.ProxyHello(proxy_id="evil", url="http://evil:1")))
        link.send(wire.encode(wire.SessionClosed(session_id="after-attack#0.0", n_calls=0)))

        with Client(run_dir, timeout_s=30) as client:
            status = client.run_status()
            assert status.gateways == 1 and not status.done
            engine_url = next(m.name for m in status.members if m.kind == "engine")
            assert "evil" not in str(status.members)
            for path, body in (("/generate", {"text": "hi"}), ("/pause_generation", {"mode": "abort"}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
                assert _post(engine_url + path, body, None) == 401, path
            assert api_key and not [p for p in Path("/proc").glob("[0-9]*/cmdline")
                                    if api_key.encode() in _read(p)]  # on no command line (`ps`)

            batch = client.submit([TASK])
            assert client.wait(batch, timeout_s=300).states == {"completed": 1}
            client.drain()
        assert job.wait(timeout=120) == 0
    ctx.destroy(linger=0)
    (traj,) = list(iter_trajectories(run_dir))
    assert traj.status == "completed" and len(traj.traces) == 1  # its call went through the proxy
    orchestrator = (run_dir / "logs" / "orchestrator.log").read_text()
    gateway = (run_dir / "logs" / "gateway-local.log").read_text()
    assert "refused Shutdown: the client key may not send it" in orchestrator and "4 frames where 2" in orchestrator
    assert "dropped a message: 4 frames where 2 belong" in gateway and "not the proxy" in gateway
    assert "Traceback" not in orchestrator + gateway


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
