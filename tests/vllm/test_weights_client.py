"""vLLM's weight-update client against a hostile stand-in server (no vLLM needed): the order of
its calls in each mode (the version label set after the load), the run's key on each, resume
after a load that fails (the server closing the connection under it, as vLLM does after a 500;
the version then left as it was), a pause that fails, a server that is down, and a path with no
checkpoint refused before anything is paused."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from polar_hpc.engines.vllm import weights


async def _serve(fail: set[str]) -> tuple[web.AppRunner, str, list[str]]:
    calls: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        query = f"?{request.query_string}" if request.query_string else ""
        calls.append(f"{request.path}{query} {request.headers.get('Authorization')} {await request.text()}")
        if request.path in fail:
            response = web.json_response({"error": "boom"}, status=500)
            response.force_close()
            return response
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", calls


def _update(tmp_path: Path, fail: set[str], mode: str,
            path: Path | None = None) -> tuple[tuple[float, list[str]], list[str], str]:
    async def scenario():
        runner, url, calls = await _serve(fail)
        try:
            result = await weights.update_engines([url], str(path or tmp_path), "v7", mode, 10, "k3y")
        finally:
            await runner.cleanup()
        return result, calls, url
    return asyncio.run(scenario())


def test_the_calls_of_an_update_in_order(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    for mode, pause in (("wait", "wait"), ("abort", "abort"), ("continue", "keep")):
        (pause_ms, errors), calls, _ = _update(tmp_path, set(), mode)
        assert errors == [] and pause_ms > 0
        assert calls == [f"/pause?mode={pause} Bearer k3y {{}}",
                         f'/collective_rpc Bearer k3y {{"method": "reload_weights", "kwargs": {{"weights_path": "{tmp_path}"}}}}',
                         '/update_weight_version Bearer k3y {"new_version": "v7"}',
                         "/resume Bearer k3y {}"]


def test_resumed_after_a_failed_load_or_pause(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    (_, errors), calls, url = _update(tmp_path, {"/collective_rpc"}, "continue")
    assert errors == [f'{url}: {url}/collective_rpc answered 500: {{"error": "boom"}}']
    assert [c.split()[0] for c in calls] == ["/pause?mode=keep", "/collective_rpc", "/resume"]  # the version stays
    (_, errors), calls, url = _update(tmp_path, {"/pause"}, "wait")
    assert errors == [f'{url}: {url}/pause answered 500: {{"error": "boom"}}']
    assert [c.split()[0] for c in calls] == ["/pause?mode=wait", "/resume"]  # a pause may fail half-way


def test_a_path_with_no_checkpoint_pauses_nothing(tmp_path: Path) -> None:
    for path in (tmp_path / "missing", tmp_path):
        (_, errors), calls, url = _update(tmp_path, set(), "abort", path)
        assert calls == [] and errors == [f"{url}: {path} is no folder holding *.safetensors"]


def test_a_server_that_is_down_is_a_failure(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    pause_ms, errors = asyncio.run(weights.update_engines(["http://127.0.0.1:9"], str(tmp_path), "v1", "wait", 5))
    assert len(errors) == 1 and errors[0].startswith("http://127.0.0.1:9: ClientConnectorError")
