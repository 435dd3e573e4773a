"""The one place that knows the engine kinds: `engine.kind` -> how its servers start and update.

`get(kind)` returns a `Kind` (unknown: `ConfigError` naming the known ones):
- `weights`: the module whose `update_engines(urls, model_path, version, mode, timeout_s, api_key)`
  updates that kind's servers (engines.updates has the contract; `MODES` below are every kind's);
- `client`: the module that shapes the proxy's requests to that kind's servers and reads their
  answers (engines.capture has the contract);
- `launch`: the module whose `command(engine, host, port)` and `environment(base_env, cache_dir)`
  start one server on `tp_size` GPUs (engines.step runs one per slice of the node's GPUs), and whose
  `ready(url, version, api_key)` (-> ["URL: why"]) readies a healthy one for the run (its weight
  version label), or None
  for the scripted engine, which runs as `polar-hpc engine --kind scripted` on the CPU (it speaks
  SGLang's routes, weight updates included).
The orchestrator, the engine step and the proxy look kinds up here and nowhere branch on a kind's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from polar_hpc.errors import ConfigError
from polar_hpc.engines.sglang import client as sglang_client
from polar_hpc.engines.sglang import launch as sglang_launch
from polar_hpc.engines.sglang import weights as sglang_weights
from polar_hpc.engines.updates import MODES
from polar_hpc.engines.vllm import client as vllm_client
from polar_hpc.engines.vllm import launch as vllm_launch
from polar_hpc.engines.vllm import weights as vllm_weights

__all__ = ["KINDS", "MODES", "Kind", "get"]


@dataclass(frozen=True)
class Kind:
    weights: ModuleType
    client: ModuleType
    launch: ModuleType | None


_KINDS = {
    "scripted": Kind(weights=sglang_weights, client=sglang_client, launch=None),
    "sglang": Kind(weights=sglang_weights, client=sglang_client, launch=sglang_launch),
    "vllm": Kind(weights=vllm_weights, client=vllm_client, launch=vllm_launch),
}
KINDS = tuple(_KINDS)


def get(kind: str) -> Kind:
    if kind not in _KINDS:
        raise ConfigError(f"engine kind {kind!r} is not known (known: {', '.join(KINDS)})")
    return _KINDS[kind]
