"""/pause_generation with mode abort on a real scripted engine process: generations in flight end
at once with SGLang's abort finish reason (stream and not, /generate and /v1/chat/completions),
new ones are held until /continue_generation, then run on the new weights."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from tests.proxy.helpers import engine_gauges, start_engine, stop, wait_gauge

ASK = {"text": "What is 2 + 2?", "sampling_params": {"max_new_tokens": 40}, "return_logprob": True}
CHAT = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 40,
        "logprobs": True, "return_token_ids": True}


@pytest.fixture
def engine(tmp_path: Path):
    proc, url, _ = start_engine(tmp_path, "engine", "--token-delay-ms", "50")
    yield url
    stop(proc)


async def _last(http: aiohttp.ClientSession, url: str, path: str, body: dict, stream: bool,
                events: list[int] | None = None) -> dict:
    """The answer, or the last event of the stream (counted in `events[0]` as they come)."""
    async with http.post(url + path, json={**body, "stream": stream}) as r:
        assert r.status == 200, await r.text()
        if not stream:
            return await r.json()
        last = None
        async for line in r.content:
            if line.startswith(b"data: {"):
                last = line[6:]
                if events is not None:
                    events[0] += 1
        return json.loads(last)


async def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.02)


async def _post(http: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with http.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def test_abort_ends_every_generation_in_flight_and_holds_new_ones(engine: str) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            streamed = {path: [0] for path in ("/generate", "/v1/chat/completions")}
            calls = [asyncio.create_task(_last(http, engine, path, body, stream, streamed[path] if stream else None))
                     for path, body in (("/generate", ASK), ("/v1/chat/completions", CHAT))
                     for stream in (False, True)]
            await asyncio.to_thread(wait_gauge, engine, "num_running_reqs", 4)
            await _until(lambda: all(n[0] >= 2 for n in streamed.values()), "the streams decode")  # the others too
            await _post(http, engine + "/pause_generation", {"mode": "abort"})
            gen, gen_stream, chat, chat_stream = await asyncio.gather(*calls)
            for answer in (gen, gen_stream):
                meta = answer["meta_info"]
                assert meta["finish_reason"]["type"] == "abort" and meta["finish_reason"]["message"]
                assert 0 < len(answer["output_ids"]) < 40 and len(meta["output_token_logprobs"]) == len(answer["output_ids"])
                assert meta["weight_version"] == "v0"
            assert chat["choices"][0]["finish_reason"] == "abort"
            assert 0 < len(chat["choices"][0]["response_token_ids"]) < 40
            assert len(chat["choices"][0]["logprobs"]["content"]) == len(chat["choices"][0]["response_token_ids"])
            assert chat_stream["choices"][0]["finish_reason"] == "abort"

            held = asyncio.create_task(_last(http, engine, "/generate", ASK, False))
            await asyncio.to_thread(wait_gauge, engine, "num_queue_reqs", 1)
            assert not held.done()  # paused: new generations wait at the door
            loaded = await _post(http, engine + "/update_weights_from_disk",
                                 {"model_path": "/tmp/w1", "weight_version": "v1"})
            assert loaded["success"] and loaded["num_paused_requests"] == 1
            assert not held.done()
            await _post(http, engine + "/continue_generation", {})
            answer = await held
            assert answer["meta_info"]["finish_reason"]["type"] != "abort"
            assert answer["meta_info"]["weight_version"] == "v1" and len(answer["output_ids"]) > 0

    asyncio.run(scenario())


def test_update_alone_waits_for_generations_in_flight(engine: str) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            body = {**ASK, "sampling_params": {"max_new_tokens": 12}}
            running = asyncio.create_task(_last(http, engine, "/generate", body, False))
            await asyncio.to_thread(wait_gauge, engine, "num_running_reqs", 1)
            await _post(http, engine + "/update_weights_from_disk", {"model_path": "/tmp/w2", "weight_version": "v2"})
            assert running.done()  # the load waited for it
            answer = await running
            assert answer["meta_info"]["finish_reason"]["type"] != "abort"
            assert answer["meta_info"]["weight_version"] == "v0"

    asyncio.run(scenario())


def test_update_takes_the_set_load_time_with_the_door_closed(tmp_path: Path) -> None:
    """`--update-load-ms`: an update answers no sooner than its load time, and a generation that
    arrives meanwhile waits for it and runs on the new weights."""
    proc, url, _ = start_engine(tmp_path, "engine", "--update-load-ms", "1000")
    try:
        async def scenario() -> None:
            async with aiohttp.ClientSession() as http:
                t0 = time.monotonic()
                update = asyncio.create_task(_post(http, url + "/update_weights_from_disk",
                                                   {"model_path": "/tmp/w2", "weight_version": "v2"}))
                while True:  # generations until one arrives while the update loads (before it, they just run)
                    generation = asyncio.create_task(_last(http, url, "/generate", ASK, False))
                    while not generation.done() and engine_gauges(url)["num_queue_reqs"] == 0:
                        await asyncio.sleep(0.01)
                    if not generation.done():
                        break  # held at the door
                    assert not update.done(), "the update ended without holding a generation at its door"
                answer = await generation
                assert (await update)["success"] and time.monotonic() - t0 >= 1.0
                assert answer["meta_info"]["weight_version"] == "v2"

        asyncio.run(scenario())
    finally:
        stop(proc)


def test_a_negative_load_time_is_refused(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "polar_hpc", "engine", "--update-load-ms", "-1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "update-load-ms" in r.stderr and "Traceback" not in r.stderr
