"""Calls a real scripted engine aborts (/pause_generation mode abort) through a real proxy: the
harness gets a retryable error in its API's shape (HTTP 503 + Retry-After + x-should-retry when
nothing was streamed yet; the API's error event once the stream began), the aborted attempt leaves
no record, and the session's next record carries meta["aborted_attempts"] (with the seconds the attempt took)."""

from __future__ import annotations

import asyncio
import json

from pathlib import Path

import aiohttp
import pytest

from polar_hpc import wire
from proxy.helpers import MODEL, start_engine, start_proxy, stop

ASK = [{"role": "user", "content": "What is 2 + 2?"}]
BODIES = {  # path, body (a long enough reply: 200 tokens x 30 ms)
    "openai_chat": ("/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 200}),
    "openai_responses": ("/v1/responses", {"model": MODEL, "input": ASK, "max_output_tokens": 200}),
    "anthropic": ("/v1/messages", {"model": MODEL, "messages": ASK, "max_tokens": 200}),
}


@pytest.fixture(scope="module")
def slow_engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slow")
    proc, url, log = start_engine(tmp, "slow", "--token-delay-ms", "30")
    yield url, log
    stop(proc)


@pytest.fixture(params=["tito", "passthrough"])
def proxy(request, short_tmp, gateway, slow_engine):
    p = start_proxy(short_tmp, gateway, slow_engine[0], mode=request.param)
    p.mode = request.param
    yield p
    p.stop()


async def _call(url: str, token: str, api: str, stream: bool,
                answered: asyncio.Event | None = None) -> tuple[int, dict, bytes]:
    """Status, headers and body of one call; `answered` is set when the first bytes of the body come."""
    path, body = BODIES[api]
    headers = {"Authorization": f"Bearer {token}", "x-api-key": token}
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, json={**body, "stream": stream}, headers=headers) as r:
            chunks = []
            async for chunk in r.content.iter_any():
                if answered is not None:
                    answered.set()
                chunks.append(chunk)
            return r.status, dict(r.headers), b"".join(chunks)


def _begun(log: Path) -> int:
    return log.read_text().count("\n") if log.exists() else 0


async def _abort_mid_call(proxy, engine: tuple[str, Path], token: str, api: str, stream: bool) -> tuple[int, dict, bytes]:
    engine, log = engine
    begun, streamed = _begun(log), asyncio.Event()
    call = asyncio.create_task(_call(proxy.url, token, api, stream, streamed))
    while _begun(log) == begun:  # the sample log gets a line as a generation begins
        assert not call.done()
        await asyncio.sleep(0.02)
    if stream and proxy.mode == "tito":  # the stream began: tokens were decoded (of 200 x 30 ms)
        await asyncio.wait_for(streamed.wait(), 60)
    assert not call.done()
    async with aiohttp.ClientSession() as http:
        async with http.post(engine + "/pause_generation", json={"mode": "abort"}) as r:
            assert r.status == 200
        answer = await asyncio.wait_for(call, 60)
        async with http.post(engine + "/continue_generation", json={}) as r:
            assert r.status == 200
    return answer


def _events(raw: bytes) -> list[tuple[str | None, object]]:
    """(event name, data) of each Server-Sent Event."""
    out = []
    for block in raw.decode().split("\n\n"):
        name = next((line[7:] for line in block.splitlines() if line.startswith("event: ")), None)
        data = next((line[6:] for line in block.splitlines() if line.startswith("data: ")), None)
        if data is not None:
            out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


@pytest.mark.parametrize("api", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
def test_an_aborted_call_gets_a_retryable_error_in_its_api_shape(proxy, slow_engine, api, stream):
    sid = f"{api}-{stream}"
    proxy.gateway.open(sid, f"tok-{sid}")
    status, headers, raw = asyncio.run(_abort_mid_call(proxy, slow_engine, f"tok-{sid}", api, stream))
    began = stream and proxy.mode == "tito"  # passthrough sends nothing before the engine's whole answer
    if not began:
        assert status == 503 and headers["Retry-After"] == "1" and headers["x-should-retry"] == "true"
        body = json.loads(raw)
        if api == "anthropic":
            assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
            message = body["error"]["message"]
        else:
            assert body["error"]["type"] == "server_error"
            message = body["error"]["message"]
    else:
        assert status == 200
        events = _events(raw)
        name, data = events[-1] if api != "openai_chat" else events[-2]
        if api == "openai_chat":
            assert events[-1] == (None, "[DONE]") and data["error"]["type"] == "server_error"
            message = data["error"]["message"]
        elif api == "openai_responses":
            assert name == "response.failed" and data["response"]["error"]["code"] == "server_error"
            message = data["response"]["error"]["message"]
        else:
            assert name == "error" and data["error"]["type"] == "overloaded_error"
            message = data["error"]["message"]
    assert "aborted" in message and "weight update" in message

    # no record for the aborted attempt; the retry's record says one attempt was aborted, on v0
    status, _, _ = asyncio.run(_call(proxy.url, f"tok-{sid}", api, False))
    assert status == 200
    record = proxy.gateway.expect(wire.CallRecord)
    assert record.call_index == 0 and record.session_id == sid
    noted = record.meta["aborted_attempts"]
    assert (noted["count"], noted["versions"]) == (1, ["v0"]) and noted["seconds"] > 0, noted
    status, _, _ = asyncio.run(_call(proxy.url, f"tok-{sid}", api, False))
    assert "aborted_attempts" not in proxy.gateway.expect(wire.CallRecord).meta
