"""An engine killed in the middle of a call: the proxy retries the call on the other vLLM before
the harness saw a byte, the harness gets its answer, and the call is recorded once, token-exact
against the engine that answered, its record naming the engine that failed. Needs a second vLLM
(started here, stopped at the end), serving a checkpoint nudged far from the tiny model's (same
tokenizer and template) so that its greedy reply runs long. The proxy reaches it through a relay
(`Withholding`) that passes everything but the answer to a POST: the test kills the engine once
the call is on it (being sampled, or sampled and its answer withheld), so the proxy sees the same
thing however slow the machine is: a call sent, no byte back, the connection gone."""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
import struct
import threading
import time
import urllib.request

import openai
import pytest

from polar_hpc import wire
from proxy.conftest import gateway, short_tmp  # noqa: F401 (fixtures)
from proxy.helpers import MODEL, start_proxy
from vllm.conftest import start_vllm
from vllm.model import model_dir, perturbed

pytestmark = pytest.mark.timeout(900)  # the session's vLLM may start within a test: minutes on a busy host
LONG = 400  # tokens the call may take: usually still sampling when killed (about 300 a second here)


def test_a_killed_engine_fails_over_and_nothing_is_recorded_twice(vllm, short_tmp, gateway, tmp_path) -> None:  # noqa: F811
    second = start_vllm(tmp_path, "second", perturbed(model_dir(), tmp_path / "noisy", scale=1.0))
    relay = Withholding(second.url)
    try:
        # the second engine is first in line for a new session (both idle: registration order)
        proxy = start_proxy(short_tmp, gateway, [relay.url, vllm.url], mode="tito", engine_kind="vllm")
        gateway.send(wire.Engines(urls=[relay.url, vllm.url], versions={relay.url: "a", vllm.url: "b"}))
        gateway.open("s", "tok")
        client = openai.OpenAI(base_url=proxy.base_url, api_key="tok", max_retries=0, timeout=600)
        ask = [{"role": "user", "content": "Count to a thousand."}]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(client.chat.completions.create, model=MODEL, messages=ask, max_tokens=LONG,
                               temperature=0)
            assert relay.posted.wait(120), "the call never reached the second engine"
            deadline = time.monotonic() + 120
            while _running(second) == 0 and not relay.answered.is_set():  # the engine has the call
                assert time.monotonic() < deadline and not call.done(), "the second engine never took the call"
                time.sleep(0.05)
            second.stop(kill=True)
            answer = call.result(timeout=600)
        record = gateway.expect(wire.CallRecord, timeout=60)
        gateway.quiet(2)  # one record for one call: the killed attempt left none
        assert (record.call_index, record.engine_url, record.meta["retried"]) == (0, vllm.url, [relay.url])
        assert record.weight_version == "b"
        direct = vllm.post("/v1/completions", {"model": MODEL, "prompt": record.prompt_ids, "max_tokens": LONG,
                                               "temperature": 0, "logprobs": 0, "return_token_ids": True})
        choice = direct["choices"][0]
        assert (record.output_ids, record.output_logprobs) == (choice["token_ids"], choice["logprobs"]["token_logprobs"])
        assert answer.choices[0].finish_reason == choice["finish_reason"]
        proxy.stop()
    finally:
        second.stop(kill=True)
        relay.close()


def _running(server) -> float:
    """Requests the server is sampling now (its Prometheus gauge)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:num_requests_running"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


class Withholding:
    """A TCP relay to `url` that passes requests and answers both ways, except the answer to a POST:
    that it keeps (`answered` is set when one came); `posted` is set once a POST went through.
    When the engine's side closes, the relay resets the proxy's side, as a dead engine's kernel does."""

    def __init__(self, url: str) -> None:
        host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
        self.upstream = (host, int(port))
        self.posted, self.answered = threading.Event(), threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, proxy_side: socket.socket) -> None:
        posting = threading.Event()
        try:
            engine_side = socket.create_connection(self.upstream, timeout=10)
            engine_side.settimeout(None)
        except OSError:
            return _reset(proxy_side)

        def requests() -> None:
            try:
                while data := proxy_side.recv(65536):
                    if data.startswith(b"POST "):
                        posting.set()
                    engine_side.sendall(data)
                    if posting.is_set():
                        self.posted.set()
            except OSError:
                pass

        threading.Thread(target=requests, daemon=True).start()
        try:
            while data := engine_side.recv(65536):
                if posting.is_set():
                    self.answered.set()
                else:
                    proxy_side.sendall(data)
        except OSError:
            pass
        engine_side.close()
        _reset(proxy_side)


def _reset(sock: socket.socket) -> None:
    """Close with a reset; shutdown first wakes the thread still reading it (a bare close would not)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    sock.close()
