"""The engine registry and weight updates: which engines serve the run, with which weights.

Engine steps register (EngineHello), heartbeat, and leave (EngineBye) or go silent (`lose`); an
engine lost to silence that is heard again (a stalled node, a starved step) is registered again as
it was (`back`), and given the newest weights if it missed an update. Every change of the live set
is journaled and relayed to every gateway as Engines (`listing`), which its proxy routes over.
Engines given with `--engine-url` (static) are not registered but take weight updates too.
UpdateWeights (`request`) makes every engine load new weights (`engines.kinds`: the run's engine
kind's `weights`, in the request's mode or `service.weight_update_mode`; a mode that kind lacks is
refused), one update at a time; the trainer that asked gets WeightsUpdated once all have answered.
The newest version (`policy`) is the one loaded by at least one engine (or asked for while none is
up); an engine that registers later with other weights (a restarted engine step) is given the
newest at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from polar_hpc import wire
from polar_hpc.config import ServiceConfig
from polar_hpc.engines import kinds
from polar_hpc.orchestrator.journal import Journal

log = logging.getLogger("polar_hpc.orchestrator")


class Registry:
    def __init__(self, service: ServiceConfig, kind: str, weight_version: str, static_urls: tuple[str, ...],
                 engine_key: str | None, journal: Journal, send: Callable[[bytes, wire.Message], None],
                 to_gateways: Callable[[wire.Message], None], peers: wire.Liveness) -> None:
        self.service, self.engine_key, self.journal = service, engine_key, journal
        weights = kinds.get(kind).weights  # the run's engine kind's updates, and the modes it has
        self.update_engines, self.modes, self.kind = weights.update_engines, weights.MODES, kind
        self.send, self.to_gateways, self.peers = send, to_gateways, peers
        self.engines: dict[bytes, wire.EngineHello] = {}
        self.static = {url: weight_version for url in static_urls}  # url -> version
        self.down: dict[str, wire.Member] = {}  # engine id -> the engine as last seen
        self.silent: dict[bytes, wire.EngineHello] = {}  # engines lost to silence, until heard again or gone
        self.policy = weight_version  # the newest weight version
        self.latest: wire.UpdateWeights | None = None  # engines that register later load these
        self.lock = asyncio.Lock()

    def hello(self, identity: bytes, msg: wire.EngineHello) -> None:
        self.engines[identity] = msg
        self.down.pop(msg.engine_id, None)
        self.peers.heard(identity)
        self.journal.write("engine_up", engine=msg.engine_id, url=msg.url, weight_version=msg.weight_version)
        self.to_gateways(self.listing())
        latest = self.latest
        if latest is not None and msg.weight_version != latest.weight_version:  # a restarted engine step
            asyncio.get_running_loop().create_task(self.update(None, latest, [msg.url]))

    def back(self, identity: bytes) -> bool:
        """An engine lost to silence is heard again: registered again (True), as it last was."""
        engine = self.silent.pop(identity, None)
        if engine is not None:
            log.warning("engine %s at %s is heard again", engine.engine_id, engine.url)
            self.hello(identity, engine)
        return engine is not None

    def lose(self, identity: bytes, why: str) -> None:
        engine = self.engines.pop(identity, None) or self.silent.pop(identity, None)
        self.peers.forget(identity)
        if engine is not None and why == "silent":
            self.silent[identity] = engine
        if engine is not None:
            log.warning("engine %s at %s is %s", engine.engine_id, engine.url, why)
            self.down[engine.engine_id] = wire.Member("engine", engine.engine_id, engine.host, False, detail=why)
            self.journal.write("engine_down", engine=engine.engine_id, reason=why)
            self.to_gateways(self.listing())

    def listing(self) -> wire.Engines:
        versions = {**self.static, **{e.url: e.weight_version for e in self.engines.values()}}
        return wire.Engines(urls=sorted(e.url for e in self.engines.values()), versions=versions)

    def members(self) -> list[wire.Member]:
        members = [wire.Member("engine", e.engine_id, e.host, True, 0, f"{e.url} weights {e.weight_version}")
                   for e in self.engines.values()]
        members += [wire.Member("engine", url, "", True, 0, f"{url} weights {version}")
                    for url, version in self.static.items()]
        return members + list(self.down.values())

    def request(self, identity: bytes, msg: wire.UpdateWeights) -> wire.Refused | None:
        """A trainer's UpdateWeights: refused at once, or answered when every engine has answered."""
        mode = msg.mode or self.service.weight_update_mode
        if mode not in self.modes:
            why = "not known" if mode not in kinds.MODES else f"not one that {self.kind} engines have"
            return wire.Refused(error=f"weight update mode {mode!r} is {why} ({', '.join(self.modes)})")
        asyncio.get_running_loop().create_task(self.update(identity, msg))
        return None

    async def update(self, identity: bytes | None, msg: wire.UpdateWeights, only: list[str] | None = None) -> None:
        """Every engine (or `only` these) loads the weights; the trainer that asked gets the answer."""
        async with self.lock:
            urls = only or sorted(set(self.static) | {e.url for e in self.engines.values()})
            mode = msg.mode or self.service.weight_update_mode
            self.journal.write("weights_update", path=msg.model_path, weight_version=msg.weight_version, engines=urls,
                               mode=mode)
            self.journal.flush()  # on record while the engines load
            pause_ms, errors = await self.update_engines(urls, msg.model_path, msg.weight_version, mode,
                                                         self.service.weight_update_timeout_s, self.engine_key)
            failed = {e.split(": ", 1)[0] for e in errors}
            for url in self.static:
                if url not in failed:
                    self.static[url] = msg.weight_version
            for engine in self.engines.values():
                if engine.url not in failed:
                    engine.weight_version = msg.weight_version
            ok = [u for u in urls if u not in failed]
            if (ok or not errors) and only is None:  # the newest weights, even with no engine up yet
                self.policy, self.latest = msg.weight_version, msg
            self.journal.write("weights", weight_version=msg.weight_version, engines=ok, errors=errors,
                               pause_ms=round(pause_ms, 3))
            log.info("weights %s on %d engines (%d failed), pause %.1f ms", msg.weight_version, len(ok), len(errors),
                     pause_ms)
            if self.engines:  # the proxies stamp the new version on calls to engines that report none
                self.to_gateways(self.listing())
        if identity is not None:
            self.send(identity, wire.WeightsUpdated(weight_version=msg.weight_version, mode=mode, engines=ok,
                                                    pause_ms=pause_ms, errors=errors))
