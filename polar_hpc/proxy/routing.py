"""Which engine serves a call: session-sticky, group-affine and least-loaded for new sessions,
failover on error.

`Router(urls)` holds one pooled `EngineClient` per engine (create it inside the event loop; close
with `close()`). `attempt(session_id, fn)` runs `await fn(client)` on the session's engine and
returns `(result, retried)`: a session keeps its engine (its prefix is in that engine's cache)
while it works. A new session whose group (`join(session_id, group)`: the task id, so the samples
of one task) was placed before goes to the group's engine, where the task's prompt prefix is
cached, unless that engine carries more than `affinity_slack` requests over the least loaded;
otherwise, and for a session of no group, it goes to the least loaded engine (ties: the order of
`urls`), as does a call of no session (`session_id` "": the proxy's own look-ups). Where a new
session's call is tried is its engine, and its group's, at once, so that samples of a task that
start together go together (the last `MAX_GROUPS` groups are kept).

An engine's load is its own count of requests running and queued, read from its `/metrics`
(`engines.gauges`) every `poll_s` (0: never; one read per engine at a time, at most `gauges.MAX_BYTES`,
`POLL_TIMEOUT_S`), plus the calls this proxy started on it since that reading, and never less than
this proxy's calls in flight there; an engine whose metrics cannot be read (none served, an error)
counts only this proxy's calls in flight. `readings()` is each engine's last reading (requests,
prefix-cache hit rate) for the proxy's metrics; `placed` counts new sessions by how they were
placed (`group`, `group_busy`: the group's engine was too busy, `least_loaded`).

When an engine is unreachable or fails (502) before anything was received, it is marked down for
`down_s` seconds and the call is retried on the next engine, each engine at most once; `retried`
lists the engines that failed. `version(url)` is the engine's weight version as the last
`set_engines(urls, versions)` gave it. A 400 (the request's fault) is not retried.
`set_engines(urls)` changes the membership (clients of engines that left are closed once idle;
sessions on them move on their next call). While there is no engine at all (one restarting), a
call waits up to `hold_s` for one to register, then fails with `EngineError(503)` (`NO_ENGINE`:
the harness should retry later).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from polar_hpc import metrics
from polar_hpc.engines import gauges
from polar_hpc.proxy.engine_client import EngineClient, EngineError

T = TypeVar("T")
NO_ENGINE = 503
MAX_GROUPS = 65536
POLL_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Reading:
    """What an engine's /metrics said: requests running and queued, its prefix-cache hit rate."""

    requests: float
    hit_rate: float | None
    local: int  # this proxy's calls in flight on the engine when it was read


class Router:
    def __init__(self, urls: list[str], *, hold_s: float, affinity_slack: int, poll_s: float,
                 down_s: float = 5.0) -> None:
        if not urls:
            raise ValueError("the proxy needs at least one engine URL")
        self.down_s, self.hold_s, self.affinity_slack, self.poll_s = down_s, hold_s, affinity_slack, poll_s
        self._some = asyncio.Event()  # set while at least one engine is registered
        self._clients: dict[str, EngineClient] = {}
        self._load: dict[str, int] = {}
        self._read: dict[str, Reading] = {}
        self._down_until: dict[str, float] = {}
        self._sticky: dict[str, str] = {}
        self._group_of: dict[str, str] = {}  # session -> its group
        self._groups: OrderedDict[str, str] = OrderedDict()  # group -> its engine, oldest first
        self.placed: Counter[str] = Counter()
        self.set_engines(urls)
        self._reading: dict[str, asyncio.Task] = {}  # url -> its /metrics being read
        self._poller = asyncio.create_task(self._poll()) if poll_s > 0 else None

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
        for url in [u for u in self._read if u not in self._clients]:
            del self._read[url]
        if self._clients:
            self._some.set()
        else:
            self._some.clear()

    async def close(self) -> None:
        for task in [self._poller, *self._reading.values()]:
            if task is not None:
                task.cancel()
        for client in [*self._clients.values(), *self._gone]:
            await client.close()

    def version(self, url: str) -> str:
        """The engine's weight version as the registry last said ("" if it did not)."""
        return self._versions.get(url, "")

    def client(self, url: str) -> EngineClient:
        return self._clients[url]

    def join(self, session_id: str, group: str) -> None:
        """The session is one of `group`'s (its task's samples); "" for none."""
        if group:
            self._group_of[session_id] = group

    def forget(self, session_id: str) -> None:
        self._sticky.pop(session_id, None)
        self._group_of.pop(session_id, None)

    def readings(self) -> dict[str, Reading]:
        return dict(self._read)

    def load(self, url: str) -> float:
        local = self._load[url]
        seen = self._read.get(url)
        return local if seen is None else max(local, seen.requests + local - seen.local)

    # --- the engines' metrics -------------------------------------------------------------------

    async def _poll(self) -> None:
        while True:
            for url, client in self._clients.items():
                if url not in self._reading:
                    self._reading[url] = asyncio.create_task(self._read_one(url, client))
            await asyncio.sleep(self.poll_s)

    async def _read_one(self, url: str, client: EngineClient) -> None:
        try:
            text = await asyncio.wait_for(client.get_text("/metrics", gauges.MAX_BYTES), POLL_TIMEOUT_S)
        except (EngineError, TimeoutError):
            self._read.pop(url, None)
            return
        finally:
            self._reading.pop(url, None)
        figures = gauges.read(text)
        if url not in self._clients or not {"running", "waiting"} & figures.keys():
            self._read.pop(url, None)
            return
        requests = figures.get("running", 0.0) + figures.get("waiting", 0.0)
        self._read[url] = Reading(requests, gauges.hit_rate(figures), self._load[url])

    # --- choosing -------------------------------------------------------------------------------

    def _order(self, session_id: str) -> list[str]:
        now = time.monotonic()
        up = sorted((u for u in self._clients if self._down_until.get(u, 0) <= now), key=self.load)
        down = sorted((u for u in self._clients if u not in up), key=lambda u: self._down_until[u])
        first = self._sticky.get(session_id)
        if first is None and session_id and up:
            first = self._place(session_id, up)
        if first in up:
            up.remove(first)
            up.insert(0, first)
        return up + down

    def _place(self, session_id: str, up: list[str]) -> str:
        """The engine for a new session's first call, `up` sorted by load."""
        group = self._group_of.get(session_id)
        engine = self._groups.get(group) if group is not None else None
        if engine not in up:
            how = "least_loaded"
        elif self.load(engine) <= self.load(up[0]) + self.affinity_slack:
            how = "group"
        else:
            how = "group_busy"
        self.placed[how] += 1
        return engine if how == "group" and engine is not None else up[0]

    def _bind(self, session_id: str, url: str) -> None:
        """The session, and its group, are on `url` from the try of its call on (so that the samples
        of a group that start together go together)."""
        self._sticky[session_id] = url
        group = self._group_of.get(session_id)
        if group is not None:
            self._groups[group] = url
            self._groups.move_to_end(group)
            if len(self._groups) > MAX_GROUPS:
                self._groups.popitem(last=False)

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
            if session_id:
                self._bind(session_id, url)
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
            return result, retried
        if last is None:  # every engine left while the call waited for its turn
            raise EngineError(NO_ENGINE, "no engine is serving; retry later")
        raise EngineError(502, f"no engine could answer (tried {len(retried)}): {last.message}")
