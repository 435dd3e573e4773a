"""Which engine serves a call: session-sticky, least-loaded for new sessions, failover on error.

`Router(urls)` holds one pooled `EngineClient` per engine (create it inside the event loop; close
with `close()`). `attempt(session_id, fn)` runs `await fn(client)` on the session's engine and
returns `(result, retried)`: a session keeps its engine (for SGLang's prefix cache) while it works;
a new session gets the engine with the fewest calls in flight. When an engine is unreachable or
fails (502) before anything was received, it is marked down for `down_s` seconds and the call is
retried on the next engine, each engine at most once; `retried` lists the engines that failed.
`version(url)` is the engine's weight version as the last `set_engines(urls, versions)` gave it.
A 400 (the request's fault) is not retried. `set_engines(urls)` changes the membership (clients
of engines that left are closed once idle; sessions on them move on their next call). While there
is no engine at all (one restarting), a call waits up to `hold_s` for one to register, then fails
with `EngineError(503)` (`NO_ENGINE`: the harness should retry later).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from polar_hpc import metrics
from polar_hpc.proxy.engine_client import EngineClient, EngineError

T = TypeVar("T")
NO_ENGINE = 503


class Router:
    def __init__(self, urls: list[str], down_s: float = 5.0, hold_s: float = 30.0) -> None:
        if not urls:
            raise ValueError("the proxy needs at least one engine URL")
        self.down_s, self.hold_s = down_s, hold_s
        self._some = asyncio.Event()  # set while at least one engine is registered
        self._clients: dict[str, EngineClient] = {}
        self._load: dict[str, int] = {}
        self._down_until: dict[str, float] = {}
        self._sticky: dict[str, str] = {}
        self.set_engines(urls)

    @property
    def urls(self) -> list[str]:
        return list(self._clients)

    def set_engines(self, urls: list[str], versions: dict[str, str] | None = None) -> None:
        urls = [u.rstrip("/") for u in urls]
        self._versions = {u.rstrip("/"): v for u, v in (versions or {}).items()}
        for url in urls:
            if url not in self._clients:
                self._clients[url] = EngineClient(url)
                self._load[url] = 0
        self._gone = [self._clients.pop(u) for u in list(self._clients) if u not in urls]
        if self._clients:
            self._some.set()
        else:
            self._some.clear()

    async def close(self) -> None:
        for client in [*self._clients.values(), *self._gone]:
            await client.close()

    def version(self, url: str) -> str:
        """The engine's weight version as the registry last said ("" if it did not)."""
        return self._versions.get(url, "")

    def client(self, url: str) -> EngineClient:
        return self._clients[url]

    def forget(self, session_id: str) -> None:
        self._sticky.pop(session_id, None)

    def _order(self, session_id: str) -> list[str]:
        now = time.monotonic()
        up = sorted(
            (u for u in self._clients if self._down_until.get(u, 0) <= now),
            key=lambda u: self._load[u],
        )
        down = sorted((u for u in self._clients if u not in up), key=lambda u: self._down_until[u])
        sticky = self._sticky.get(session_id)
        if sticky in up:
            up.remove(sticky)
            up.insert(0, sticky)
        return up + down

    async def attempt(
        self, session_id: str, fn: Callable[[EngineClient], Awaitable[T]]
    ) -> tuple[T, list[str]]:
        if not self._clients:
            try:
                await asyncio.wait_for(self._some.wait(), self.hold_s)
            except TimeoutError:
                raise EngineError(NO_ENGINE, f"no engine is serving (waited {self.hold_s:g} s for "
                                  "one to register); retry later") from None
        retried: list[str] = []
        last: EngineError | None = None
        for url in self._order(session_id):
            client = self._clients.get(url)
            if client is None:
                continue
            self._load[url] += 1
            t0 = time.perf_counter()
            try:
                result = await fn(client)
            except EngineError as e:
                if e.status == 400 or e.started:
                    raise
                self._down_until[url] = time.monotonic() + self.down_s
                retried.append(url)
                last = e
                continue
            finally:
                metrics.engine_time(t0)
                if url in self._load:
                    self._load[url] -= 1
            self._sticky[session_id] = url
            return result, retried
        if last is None:  # every engine left while the call waited for its turn
            raise EngineError(NO_ENGINE, "no engine is serving; retry later")
        raise EngineError(502, f"no engine could answer (tried {len(retried)}): {last.message}")
