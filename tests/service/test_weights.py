"""update_weights through a real orchestrator to a real scripted engine: every engine pauses,
loads and continues; calls in flight finish (none lost) on the old version, later calls report
the new one, and the run's status shows the version each engine serves. Sessions that end more
versions after their dispatch than their batch's max_staleness allows are marked stale. An unknown
update mode is refused (per update, and in the topology before the run starts). An engine lost to
silence that is heard again is registered again and given the weights it missed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import zmq

from polar_hpc import wire
from polar_hpc.client import Client
from polar_hpc.config import ConfigError
from polar_hpc.errors import WeightUpdateFailed
from tests.conftest import polar
from tests.orchestrator.helpers import assigned, start_orchestrator, wait_for
from tests.proxy.helpers import wait_gauge


def _start_engine(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    ready = tmp_path / "engine.ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "polar_hpc", "engine", "--kind", "scripted", "--port", "0", "--ready-file", str(ready),
         "--token-delay-ms", "40"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["url"]


async def _generate(http: aiohttp.ClientSession, url: str, done_at: list) -> dict:
    body = {"text": "What is 2 + 2?", "sampling_params": {"max_new_tokens": 16}}
    async with http.post(f"{url}/generate", json=body) as r:
        answer = {"status": r.status, **(await r.json())}
    done_at.append((time.monotonic(), answer["meta_info"]["weight_version"]))
    return answer


def test_update_weights_while_64_calls_are_mid_flight(tmp_path: Path) -> None:
    engine, url = _start_engine(tmp_path)
    orchestrator = None
    try:
        orchestrator, _ = start_orchestrator_with_engine(tmp_path, url)
        client = Client(tmp_path, timeout_s=60)

        async def scenario() -> tuple[list[dict], float, object, dict]:
            done_at: list = []
            async with aiohttp.ClientSession() as http:
                calls = [asyncio.create_task(_generate(http, url, done_at)) for _ in range(64)]
                await asyncio.to_thread(wait_gauge, url, "num_running_reqs", 64)  # all decoding now (16 x 40 ms)
                update = await asyncio.to_thread(client.update_weights, tmp_path / "weights-1", "v1")
                updated_at = time.monotonic()
                answers = await asyncio.gather(*calls)
                later = await _generate(http, url, done_at)
            return answers, updated_at, update, later | {"done_at": done_at}

        answers, updated_at, update, later = asyncio.run(scenario())
        assert [a["status"] for a in answers] == [200] * 64  # no call was lost or failed
        assert all(a["text"] for a in answers)
        old = [t for t, v in later["done_at"] if v == "v0"]
        assert len(old) >= 16 and all(t <= updated_at for t in old)  # in-flight calls ended, on v0, before the swap
        assert later["meta_info"]["weight_version"] == "v1"
        assert update.mode == "wait" and update.engines == [url] and update.errors == [] and update.pause_ms > 0
        members = {m.name: m.detail for m in client.run_status().members if m.kind == "engine"}
        assert members[url].endswith("weights v1")
        client.close()
        journal = [json.loads(line) for line in (tmp_path / "journal" / "orchestrator.jsonl").read_text().splitlines()]
        assert [e["weight_version"] for e in journal if e["event"] == "weights"] == ["v1"]
    finally:
        for proc in (engine, orchestrator):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_a_failing_engine_is_reported(tmp_path: Path) -> None:
    orchestrator, _ = start_orchestrator_with_engine(tmp_path, "http://127.0.0.1:9")  # nothing listens there
    try:
        with Client(tmp_path, timeout_s=30) as client:
            with pytest.raises(WeightUpdateFailed) as failed:
                client.update_weights(tmp_path / "w", "v1")
            assert "http://127.0.0.1:9" in str(failed.value) and "v1" in str(failed.value)
            members = {m.name: m.detail for m in client.run_status().members if m.kind == "engine"}
            assert members["http://127.0.0.1:9"].endswith("weights v0")
            with pytest.raises(ConfigError, match="mode 'sideways' is not known"):
                client.update_weights(tmp_path / "w", "v1", mode="sideways")
    finally:
        orchestrator.kill()
        orchestrator.wait()


def start_orchestrator_with_engine(run_dir: Path, url: str) -> tuple[subprocess.Popen, str]:
    return start_orchestrator(run_dir, "service:\n  enabled: true\n", None, ["--engine-url", url])


def test_sessions_older_than_max_staleness_are_marked(tmp_path: Path) -> None:
    engine, url = _start_engine(tmp_path)
    orchestrator, endpoint = start_orchestrator_with_engine(tmp_path, url)
    gateway = zmq.Context.instance().socket(zmq.DEALER)
    gateway.setsockopt(zmq.LINGER, 0)
    try:
        with Client(tmp_path, timeout_s=30) as client:
            strict = client.submit([{"id": "a", "instruction": "x", "harness": {"command": "true"}}], max_staleness=1)
            loose = client.submit([{"id": "b", "instruction": "x", "harness": {"command": "true"}}], max_staleness=5)
            gateway.connect(endpoint)  # a gateway, speaking the protocol by hand: takes both under v0
            gateway.send(wire.encode(wire.Hello(gateway_id="g", host="h", slots=2)))
            gateway.send(wire.encode(wire.Credit(n=2)))
            sessions = [s.session_id for s in assigned(gateway, 2)]
            client.update_weights(tmp_path / "w1", "v1")
            client.update_weights(tmp_path / "w2", "v2")  # both sessions now lag by 2 versions
            for sid in sessions:
                gateway.send(wire.encode(wire.Result(session_id=sid, status="completed", reward=1.0, n_calls=1,
                                                     n_traces=1, n_tokens=3, shard="g-000000.shard")))
            deadline = time.monotonic() + 60
            while not client.status(strict)[strict].done or not client.status(loose)[loose].done:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert client.status(strict)[strict].stale == 1 and client.status(loose)[loose].stale == 0
            with pytest.raises(ConfigError, match="max_staleness"):
                client.submit([{"id": "c", "instruction": "x", "harness": {"command": "true"}}], max_staleness=-1)
        journal = [json.loads(line) for line in (tmp_path / "journal" / "orchestrator.jsonl").read_text().splitlines()]
        assert {e["task"]: e.get("stale", False) for e in journal if e["event"] == "result"} == {"a": True, "b": False}
    finally:
        gateway.close()
        for proc in (engine, orchestrator):
            proc.kill()
            proc.wait()


def test_an_engine_that_registers_later_gets_the_newest_weights(tmp_path: Path) -> None:
    engine, url = _start_engine(tmp_path)
    orchestrator, endpoint = start_orchestrator(tmp_path, "service:\n  enabled: true\n", None)
    step = zmq.Context.instance().socket(zmq.DEALER)
    step.setsockopt(zmq.LINGER, 0)
    try:
        with Client(tmp_path, timeout_s=30) as client:
            assert client.update_weights(tmp_path / "w3", "v3").engines == []  # nobody to load them yet
            step.connect(endpoint)  # an engine step (re)starts with the topology's weights, v0
            step.send(wire.encode(wire.EngineHello(engine_id="e0", url=url, weight_version="v0", host="h")))
            deadline = time.monotonic() + 60
            while "weights v3" not in {m.name: m.detail for m in client.run_status().members}.get("e0", ""):
                assert time.monotonic() < deadline, client.run_status().members
                time.sleep(0.05)
        info = json.loads(urllib.request.urlopen(f"{url}/get_model_info", timeout=10).read())
        assert info["weight_version"] == "v3"
    finally:
        step.close()
        for proc in (engine, orchestrator):
            proc.kill()
            proc.wait()


def test_an_engine_lost_to_silence_is_registered_again_when_heard_with_the_weights_it_missed(tmp_path: Path) -> None:
    engine, url = _start_engine(tmp_path)
    topology = "service:\n  enabled: true\ngateway:\n  heartbeat_s: 0.1\n  peer_timeout_s: 1.0\n"
    orchestrator, endpoint = start_orchestrator(tmp_path, topology, None)
    step = zmq.Context.instance().socket(zmq.DEALER)
    step.setsockopt(zmq.LINGER, 0)

    def engine_member() -> wire.Member:
        return {m.name: m for m in client.run_status().members}["e0"]

    try:
        with Client(tmp_path, timeout_s=30) as client:
            step.connect(endpoint)
            step.send(wire.encode(wire.EngineHello(engine_id="e0", url=url, weight_version="v0", host="h")))
            wait_for(lambda: "e0" in {m.name for m in client.run_status().members}, "e0 registered")
            # the step stays silent (a stalled node): lost after peer_timeout_s, and it misses an update
            wait_for(lambda: not engine_member().up, "e0 lost to silence")
            assert engine_member().detail == "silent"
            assert client.update_weights(tmp_path / "w4", "v4").engines == []
            step.send(wire.encode(wire.Heartbeat(sender="h", t=time.time())))  # heard again
            wait_for(lambda: engine_member().up and engine_member().detail == f"{url} weights v4",
                     "e0 registered again and given v4")
        info = json.loads(urllib.request.urlopen(f"{url}/get_model_info", timeout=10).read())
        assert info["weight_version"] == "v4"
        journal = [json.loads(line) for line in (tmp_path / "journal" / "orchestrator.jsonl").read_text().splitlines()]
        assert [(e["event"], e.get("reason")) for e in journal if e["event"] in ("engine_up", "engine_down")][:3] == [
            ("engine_up", None), ("engine_down", "silent"), ("engine_up", None)]
    finally:
        step.close()
        for proc in (engine, orchestrator):
            proc.kill()
            proc.wait()


def test_an_unknown_topology_mode_is_refused_before_the_run_starts(tmp_path: Path) -> None:
    topology = tmp_path / "topology.yaml"
    topology.write_text("service:\n  enabled: true\n  weight_update_mode: sideways\n")
    done = polar("run", "--service", "-c", topology, "--run-dir", tmp_path / "run", timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{topology}:3: service.weight_update_mode:" in done.stderr
