"""The engine client: JSON and SSE against the scripted engine, HTTP framing against raw servers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from polar_hpc.proxy.engine_client import EngineClient, EngineError

PROMPT = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}, "return_logprob": True}


def run(coro_fn: Callable[[], Awaitable]) -> object:
    return asyncio.run(coro_fn())


def test_json_and_streams_share_one_kept_alive_connection(engine):
    async def go():
        client = EngineClient(engine[0])
        try:
            answers = [await client.post_json("/generate", PROMPT) for _ in range(3)]
            events = [e async for e in client.stream_json("/generate", {**PROMPT, "stream": True})]
            info = await client.get_json("/get_model_info")
            found, missing = await client.find_json("/get_model_info"), await client.find_json("/no/such/route")
            assert found == info and missing is None  # find_json: None where the engine has no such route
            return answers, events, info, len(client._idle)
        finally:
            await client.close()

    answers, events, info, idle = run(go)
    assert len(answers[0]["meta_info"]["output_token_logprobs"]) == len(answers[0]["output_ids"])
    assert [len(e["output_ids"]) for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["output_ids"] == answers[0]["output_ids"]
    assert "tokenizer_path" in info
    assert idle == 1  # every call went over the same connection


def test_engine_refusal_is_400_and_unreachable_is_502(engine):
    async def go():
        errors = []
        for url, body in ((engine[0], {"input_ids": []}), ("http://127.0.0.1:9", PROMPT)):
            client = EngineClient(url)
            with pytest.raises(EngineError) as e:
                await client.post_json("/generate", body)
            errors.append(e.value)
            await client.close()
        return errors

    refused, unreachable = run(go)
    assert (refused.status, refused.message) == (400, "the prompt is empty")
    assert unreachable.status == 502 and "unreachable" in unreachable.message
    assert not unreachable.started


async def _raw_server(answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable]):
    async def handle(reader, writer):
        try:
            await answer(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return head + await reader.readexactly(length)


def test_chunked_sse_split_anywhere_and_close_delimited_bodies():
    events = b'data: {"a": 1}\n\n: comment\ndata: {"a": 2}\n\ndata: [DONE]\n\n'
    chunks = [events[i:i + 7] for i in range(0, len(events), 7)]

    async def answer(reader, writer):
        assert (await _request(reader)).startswith(b"POST /prefix/generate HTTP/1.1\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for chunk in chunks:
            writer.write(b"%x;ext=1\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"0\r\nTrailer: x\r\n\r\n")
        await _request(reader)  # the same connection serves the next call
        writer.write(b'HTTP/1.0 200 OK\r\n\r\n{"b": 3}')

    async def go():
        server, url = await _raw_server(answer)
        client = EngineClient(url + "/prefix")
        try:
            got = [e async for e in client.stream_json("/generate", {})]
            return got, await client.post_json("/generate", {}), len(client._idle)
        finally:
            await client.close()
            server.close()

    got, plain, idle = run(go)
    assert got == [{"a": 1}, {"a": 2}]
    assert plain == {"b": 3}
    assert idle == 0  # a body that ends with its connection leaves nothing to reuse


def test_a_pooled_connection_the_engine_closed_is_replaced():
    served = []

    async def answer(reader, writer):
        await _request(reader)
        served.append(1)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{"n": 1}')
        await writer.drain()  # then close: the client still holds it as idle

    async def go():
        server, url = await _raw_server(answer)
        client = EngineClient(url)
        try:
            first = await client.post_json("/x", {})
            await asyncio.sleep(0.05)
            return first, await client.post_json("/x", {})
        finally:
            await client.close()
            server.close()

    assert run(go) == ({"n": 1}, {"n": 1})
    assert len(served) == 2


def test_a_pooled_connection_the_engine_reset_is_replaced():
    """Under uvloop (the proxy's loop), writing to a reset transport raises: the client must not."""
    async def answer(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    async def go():
        server, url = await _raw_server(answer)  # it closes each connection after one answer: a reset
        client = EngineClient(url)
        try:
            first = await client.get_text("/m", 100)
            deadline = time.monotonic() + 10
            while not client._idle[0].writer.is_closing():  # the reset has reached the pooled connection
                assert time.monotonic() < deadline, "the reset never arrived"
                await asyncio.sleep(0.01)
            return first, await client.get_text("/m", 100)
        finally:
            await client.close()
            server.close()

    assert uvloop.run(go()) == ("ok", "ok")


@pytest.mark.parametrize("reply, words", [
    (b"SSH-2.0-OpenSSH\r\n\r\n", "bad answer"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{", "unreachable"),
    (b"HTTP/1.1 503 Busy\r\nContent-Length: 25\r\n\r\n{\"message\": \"overloaded\"}", "HTTP 503: overloaded"),
])
def test_answers_that_are_not_json_objects_are_502(reply, words):
    async def answer(reader, writer):
        await _request(reader)
        writer.write(reply)

    async def go():
        server, url = await _raw_server(answer)
        client = EngineClient(url)
        try:
            with pytest.raises(EngineError) as e:
                await client.post_json("/x", {})
            return e.value
        finally:
            await client.close()
            server.close()

    error = run(go)
    assert error.status == 502 and words in error.message


def test_a_cancelled_stream_drops_its_connection():
    async def go():
        hung_up = asyncio.Event()

        async def answer(reader, writer):
            await _request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b'10\r\ndata: {"a": 1}\n\n\r\n')
            await writer.drain()
            if await reader.read() == b"":  # the client hung up
                hung_up.set()

        server, url = await _raw_server(answer)
        client = EngineClient(url)

        async def consume():
            async for _ in client.stream_json("/generate", {}):
                await asyncio.sleep(10)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.wait_for(hung_up.wait(), 5)
        await client.close()
        server.close()
        return len(client._idle)

    assert run(go) == 0


def test_get_text_reads_at_most_its_bound():
    """A body past the bound is cut there and its connection dropped; a whole one keeps it; a 404 is
    an EngineError."""
    replies = {b"/big": b"200 OK", b"/small": b"200 OK", b"/gone": b"404 Not Found"}
    bodies = {b"/big": b"x" * 300_000, b"/small": b"small", b"/gone": b"not found"}

    async def answer(reader, writer):
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):  # the client hung up
            while head := await reader.readuntil(b"\r\n\r\n"):
                path = head.split()[1]
                writer.write(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s"
                             % (replies[path], len(bodies[path]), bodies[path]))
                await writer.drain()

    async def go():
        server, url = await _raw_server(answer)
        client = EngineClient(url)
        try:
            cut = await client.get_text("/big", 100_000)
            dropped = not client._idle
            small = await client.get_text("/small", 100_000)
            kept = len(client._idle)
            with pytest.raises(EngineError) as e:
                await client.get_text("/gone", 100_000)
            return cut, dropped, small, kept, e.value
        finally:
            await client.close()
            server.close()

    cut, dropped, small, kept, error = run(go)
    assert cut == "x" * 100_000 and dropped
    assert small == "small" and kept == 1
    assert error.status == 502 and "HTTP 404" in error.message
