"""SGLang on a node: the server command line and its environment.

`command(engine, host, port)` (engines.command) runs `sglang.launch_server` with the Python `engine.python` (default:
polar-hpc's own) and the model path, served model name, host, port, tp size and the user's
`extra_args`, in that order (a later flag wins in SGLang's argparse), with `--enable-metrics` (its
/metrics: the orchestrator reads its queue from it) before the user's args, through a few lines of
Python (`LAUNCH`) that add `--api-key` from the environment variable `security.ENGINE_KEY_ENV` when
it is set: the run's engine API key then guards every route but /health, and never appears on a
command line other users of the node can read (`ps`). `environment(base, cache_dir)` is `base`.
`ready(url, version, api_key)` does nothing: SGLang's version label is set by its updates
(/update_weights_from_disk's `weight_version`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from polar_hpc.engines import command as engine_command
from polar_hpc.security import ENGINE_KEY_ENV

if TYPE_CHECKING:  # annotations only: the proxy imports the engine kinds without pydantic's cost
    from polar_hpc.config import EngineConfig

LAUNCH = (
    "import os, runpy, sys; "
    f"key = os.environ.pop({ENGINE_KEY_ENV!r}, ''); "
    "sys.argv += ['--api-key', key] if key else []; "
    "runpy.run_module('sglang.launch_server', run_name='__main__', alter_sys=True)"
)


def command(engine: EngineConfig, host: str, port: int) -> list[str]:
    return engine_command.python_engine(engine, LAUNCH, host, port, "--model-path", "--tp-size", ("--enable-metrics",))


def environment(base: dict[str, str], cache_dir: Path) -> dict[str, str]:
    return dict(base)


def ready(url: str, version: str, api_key: str | None) -> list[str]:
    return []
