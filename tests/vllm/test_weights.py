"""A real vLLM through its engine step and a real orchestrator (one vLLM for the module): the step
starts it from `engine.python`, waits for /health and registers it; the run's key guards every route
but /health (the weight-update routes included); weight updates in both modes while streamed calls
are in flight: `wait` lets them finish; `abort` ends aborted, with no token, the calls vLLM holds
unscheduled under its pause `keep` (each one's "Added request" line in the server's log shows it
reached vLLM's engine ahead of the update's pause, on the same ordered queue); greedy output
changes with a perturbed checkpoint and comes back bit-identical (ids and logprobs) with the
original; a path that holds no checkpoint fails the update and leaves the engine serving,
unpaused, on its version; `continue`: a long greedy call whose first token reached the test goes
on across the update (vLLM's pause `keep`): its tokens carry vLLM's own per-token versions, the old
version's being the old weights' greedy tokens and the rest the new weights' greedy continuation
from that boundary; the versions the run reports are the ones the updates set; SIGTERM
deregisters the server and leaves no process of it behind.

Needs a Python with vLLM (POLAR_VLLM_PYTHON); skipped without one unless POLAR_REQUIRE_VLLM=1."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from polar_hpc import security
from polar_hpc.client import Client
from polar_hpc.engines import kinds
from polar_hpc.engines.capture import Sampled, Sampling
from polar_hpc.errors import WeightUpdateFailed
from tests.orchestrator.helpers import start_orchestrator
from tests.vllm.model import model_dir
from tests.vllm.model import perturbed as perturb
from vllm.conftest import vllm_python

PORT = 18200
HERE = Path(__file__).parent
VLLM = kinds.get("vllm").client
SHORT, LONG = 400, 4000  # streamed tokens in wait and abort updates; LONG fits --max-model-len and 4096 positions
PROMPT = list(range(1, 9))  # the long calls' prompt ids
HELD, HOLD = "continue-held", 32  # the continue step's call, held by vLLM's engine core at 32 tokens until a pause
pytestmark = pytest.mark.timeout(1200)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _status(url: str, path: str, key: str | None = None, method: str = "GET") -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(url + path, headers=headers, method=method, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


async def _complete(http: aiohttp.ClientSession, url: str, max_tokens: int) -> tuple[list[int], list[float]]:
    """A greedy completion: (token ids, logprobs)."""
    body = {"model": "tiny", "prompt": "The calculator says", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "logprobs": 1, "return_token_ids": True}
    async with http.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        choice = (await r.json())["choices"][0]
    assert len(choice["token_ids"]) == max_tokens
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


async def _stream(http: aiohttp.ClientSession, url: str, started: asyncio.Event, max_tokens: int) -> dict:
    """A long streamed call: its finish reason and how many tokens it got."""
    body = {"model": "tiny", "prompt": "Count on:", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    tokens, finish = 0, None
    async with http.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            tokens += len(choice.get("token_ids") or [])
            finish = choice.get("finish_reason") or finish
            if tokens >= 8:
                started.set()
    return {"finish": finish, "tokens": tokens}


async def _whole(http: aiohttp.ClientSession, url: str, max_tokens: int) -> dict:
    """A long call answered whole: its finish reason and how many tokens it got (streamed, vLLM
    0.32 sends no chunk at all for a call aborted before its first token)."""
    body = {"model": "tiny", "prompt": "Count on:", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    async with http.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        choice = (await r.json())["choices"][0]
    return {"finish": choice["finish_reason"], "tokens": len(choice["token_ids"] or [])}


async def _proxy_stream(http: aiohttp.ClientSession, url: str, rid: str = "held-in-flight",
                        first: asyncio.Event | None = None, go: asyncio.Event | None = None,
                        spans: list | None = None, read: list | None = None) -> Sampled:
    """A long greedy call as the proxy streams it from vLLM, read by the proxy's own vLLM client;
    `first` is set once its first token reached here (reading then waits for `go`), `spans` gets
    vLLM's own weight_versions and `read` the token ids as they arrive."""
    sampling = Sampling(LONG, temperature=0.0, controls={"ignore_eos": True})
    path, body = VLLM.generate(PROMPT, sampling, True, rid)
    reader = VLLM.Generation()
    async with http.post(url + path, json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                reader.feed(event)
                for choice in event["choices"]:
                    (spans if spans is not None else []).extend(choice.get("weight_versions") or [])
                    (read if read is not None else []).extend(choice.get("token_ids") or [])
                    if first is not None and go is not None and choice.get("token_ids") and not first.is_set():
                        first.set()
                        await go.wait()
    return reader.result()


async def _continue_while_decoding(client: Client, url: str, key: str, path: Path, version: str,
                                   mode: str, log_path: Path) -> tuple:
    """One long call decoding at vLLM when the update is sent: the update goes once the call's
    first token has reached the test (so vLLM had sampled it before the pause; the test reads no
    more until the update is done), and vLLM's engine core holds the call at HOLD tokens until the
    update's pause is queued (`hold/`), so the pause finds it unfinished, whatever this machine's
    load, and vLLM has sampled more than the test had read."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        first, go, spans, read = asyncio.Event(), asyncio.Event(), [], []
        call = asyncio.create_task(_proxy_stream(http, url, HELD, first, go, spans, read))
        await asyncio.wait_for(first.wait(), 300)
        sent_after = len(read)  # tokens the test had read when it sent the update
        update = await asyncio.to_thread(client.update_weights, path, version, mode)
        go.set()
        held = await call
        log = (await asyncio.to_thread(log_path.read_text)).count(f"held at {HOLD} tokens until a pause was queued")
        return update, held, spans, log, sent_after


async def _greedy_after(http: aiohttp.ClientSession, url: str, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """vLLM's greedy `n` tokens after the prompt ids `ids`, on the weights it serves now."""
    body = {"model": "tiny", "prompt": ids, "max_tokens": n, "temperature": 0, "ignore_eos": True, "logprobs": 0,
            "return_token_ids": True}
    async with http.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        choice = (await r.json())["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _greedy_ids(url: str, key: str, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    async def call():
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
            return await _greedy_after(http, url, ids, n)
    return asyncio.run(call())


async def _update_while_streaming(client: Client, url: str, key: str, path: Path, version: str, mode: str,
                                  log: Path):
    """Two calls in flight at vLLM when the update is sent, whatever this machine's load. `wait`:
    short streamed calls, the update once both decode, so they end after it. `abort`: the engine is
    first paused `keep` (nothing is scheduled), then two long calls are sent (one answered whole, one
    streamed as the proxy streams and read by its vLLM client) and the update waits for
    vLLM's "Added request" line of each (--enable-log-requests): logged once the call went to the
    engine core on the socket the update's own /pause then takes, which the engine reads in order;
    so the abort finds both in vLLM's scheduler, unfinished (vLLM: v1/engine/core.py pause_scheduler
    finishes every request it holds, running or waiting)."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        if mode == "wait":
            events = [asyncio.Event() for _ in range(2)]
            calls = [asyncio.create_task(_stream(http, url, e, SHORT)) for e in events]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 120)  # both are decoding
        else:
            async with http.post(f"{url}/pause", params={"mode": "keep"}, json={}) as r:
                assert r.status == 200, await r.text()
            seen = log.read_text().count("Added request")
            calls = [asyncio.create_task(_whole(http, url, LONG)), asyncio.create_task(_proxy_stream(http, url))]
            while log.read_text().count("Added request") < seen + 2:  # both reached vLLM's engine
                assert not any(c.done() for c in calls), await asyncio.gather(*calls)
                await asyncio.sleep(0.1)
        update = await asyncio.to_thread(client.update_weights, path, version, mode)
        return update, await asyncio.gather(*calls)


def _greedy(url: str, key: str) -> tuple[list[int], list[float]]:
    async def call():
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
            return await _complete(http, url, 24)
    return asyncio.run(call())


def _engine_detail(client: Client) -> list[str]:
    return [m.detail for m in client.run_status().members if m.kind == "engine" and m.up]


def test_vllm_step_weights_in_every_mode_and_clean_stop(tmp_path: Path) -> None:
    python, model = str(vllm_python()), model_dir()
    run = tmp_path / "run"
    run.mkdir()
    security.create_keys(run)
    key = security.engine_api_key(run)
    perturbed = perturb(model, tmp_path / "perturbed")
    topology = (f"engine:\n  kind: vllm\n  python: {python}\n  model: tiny\n  model_path: {model}\n  port: {PORT}\n"
                "  startup_timeout_s: 900\n"
                "  extra_args: [--enforce-eager, --dtype, float32, --max-model-len, '4096', --enable-log-requests]\n"
                "gateway:\n  heartbeat_s: 0.5\nservice:\n  enabled: true\n")
    orch, _ = start_orchestrator(run, topology, None)
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_CI_ENV": "1", "HF_HUB_OFFLINE": "1",  # a bad path is no hub id
                        "PYTHONPATH": os.pathsep.join([str(HERE / "hold"), *filter(None, [os.environ.get("PYTHONPATH")])]),
                        "POLAR_TEST_HOLD": f"{HELD}:{HOLD}"}  # hold/: vLLM's engine core holds the continue step's call
    step = subprocess.Popen([sys.executable, "-m", "polar_hpc", "engine", "--kind", "vllm", "--run-dir", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    client = Client(run, timeout_s=300)
    try:
        deadline = time.monotonic() + 900
        while not _engine_detail(client):  # the step registers the server once /health answers
            assert step.poll() is None, step.stdout.read() + (run / "logs" / f"engine-{os.uname().nodename}-0.log").read_text()
            assert time.monotonic() < deadline, "the vLLM engine step never registered"
            time.sleep(1)
        (detail,) = _engine_detail(client)
        url = detail.split()[0]
        assert detail == f"{url} weights v0" and url.endswith(f":{PORT}")
        auth = {"Authorization": f"Bearer {key}"}
        with urllib.request.urlopen(urllib.request.Request(url + "/weight_info", headers=auth)) as r:
            assert json.load(r) == {"weight_version": "v0"}  # the step set vLLM's own label
        assert (run / "cache" / f"engine-{os.uname().nodename}-0").is_dir()  # VLLM_CACHE_ROOT inside the run
        server_pids = _descendants(step.pid)
        assert server_pids

        assert _status(url, "/health") == 200  # the key guards every route but /health
        for path, method in (("/v1/models", "GET"), ("/collective_rpc", "POST"), ("/pause", "POST"),
                             ("/is_paused", "GET"), ("/metrics", "GET")):
            assert _status(url, path, method=method) == 401, path
            assert _status(url, path, "wrong-key", method) == 401, path
        assert _status(url, "/v1/models", key) == 200 and _status(url, "/is_paused", key) == 200

        original = _greedy(url, key)
        assert _greedy(url, key) == original  # greedy is deterministic here

        log = run / "logs" / f"engine-{os.uname().nodename}-0.log"
        update, calls = asyncio.run(_update_while_streaming(client, url, key, perturbed, "v1", "wait", log))
        assert update.errors == [] and update.engines == [url] and update.mode == "wait", update
        assert [c["finish"] for c in calls] == ["length", "length"] and [c["tokens"] for c in calls] == [SHORT, SHORT]
        changed = _greedy(url, key)
        assert changed[0] != original[0]
        assert _engine_detail(client) == [f"{url} weights v1"]

        update, calls = asyncio.run(_update_while_streaming(client, url, key, model, "v2", "abort", log))
        assert update.errors == [] and update.engines == [url] and update.mode == "abort", update
        whole, streamed = calls  # a `wait` update would have let them run to LONG
        assert whole == {"finish": "abort", "tokens": 0} and (streamed.finish, streamed.ids) == ("abort", [])
        assert _greedy(url, key) == original  # bit-identical: ids and logprobs
        assert _engine_detail(client) == [f"{url} weights v2"]

        (tmp_path / "empty").mkdir()
        for bad in (tmp_path / "no-such-checkpoint", tmp_path / "empty"):  # refused before the engine is paused
            with pytest.raises(WeightUpdateFailed, match=f"no engine loaded weights v3: {url}: {bad} is no folder holding"):
                client.update_weights(bad, "v3", "abort")
        with urllib.request.urlopen(urllib.request.Request(url + "/is_paused", headers={"Authorization": f"Bearer {key}"})) as r:
            assert json.load(r) == {"is_paused": False}
        assert _greedy(url, key) == original and _engine_detail(client) == [f"{url} weights v2"]

        # continue: a call decoding on v2 goes on across the update to v3 on the perturbed weights
        before = _greedy_ids(url, key, PROMPT, HOLD + 32)  # v2's greedy tokens, to tell them from v3's
        update, held, spans, hold_lines, sent_after = asyncio.run(
            _continue_while_decoding(client, url, key, perturbed, "v3", "continue", log))
        assert update.errors == [], update
        assert (held.finish, len(held.ids), len(held.logprobs)) == ("length", LONG, LONG)
        assert held.token_versions is not None, (f"every token {held.weight_version}: the call was not held across "
                                                 f"the update (it ended before the {update.mode} update's pause took)")
        n = held.token_versions.count("v2")
        assert held.token_versions == ["v2"] * n + ["v3"] * (LONG - n), held.token_versions[:70]
        held_or_sooner = (n == HOLD) if hold_lines == 1 else (hold_lines == 0 and 0 < n < HOLD)
        assert held_or_sooner, f"{n} tokens of v2, {hold_lines} holds, {sent_after} read when the update was sent"
        assert spans == [{"version": "v2", "start": 0, "end": n}, {"version": "v3", "start": n, "end": LONG}]  # vLLM's
        assert held.ids[:n] == before[0][:n] and held.logprobs[:n] == pytest.approx(before[1][:n], abs=1e-4)
        after = _greedy_ids(url, key, PROMPT + held.ids[:n], 32)  # v3's greedy tokens from the boundary on
        assert held.ids[n:n + 32] == after[0] and held.logprobs[n:n + 32] == pytest.approx(after[1], abs=1e-4)
        assert held.ids[n:n + 32] != before[0][n:n + 32]  # the weights changed at the boundary
        assert update.mode == "continue" and _engine_detail(client) == [f"{url} weights v3"]

        step.send_signal(signal.SIGTERM)
        assert step.wait(120) == 0, step.stdout.read()
        deadline = time.monotonic() + 10
        while _engine_detail(client):  # deregistered (EngineBye), not after a heartbeat timeout
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert [p for p in server_pids if _alive(p)] == []  # no process of the server is left
    finally:
        client.close()
        if step.poll() is None:
            step.kill()
        orch.kill()
        orch.wait()
