"""SGLang on a GPU node: the server command line, and how a node's GPUs split into servers.

A node with `gpus` GPUs runs `gpus // tp_size` servers (at least one), server i on ports
`engine.port + i` with its own slice of the node's CUDA_VISIBLE_DEVICES. The command runs
`sglang.launch_server` with the model path, served model name, host, port, tp size and the user's
`extra_args`, in that order (a later flag wins in SGLang's argparse), through a few lines of
Python (`LAUNCH`) that add `--api-key` from the environment variable `security.ENGINE_KEY_ENV` when
it is set: the run's engine API key then guards every route but /health, and never appears on a
command line other users of the node can read (`ps`).
"""

from __future__ import annotations

import sys

from polar_hpc.config import EngineConfig
from polar_hpc.security import ENGINE_KEY_ENV

LAUNCH = (
    "import os, runpy, sys; "
    f"key = os.environ.pop({ENGINE_KEY_ENV!r}, ''); "
    "sys.argv += ['--api-key', key] if key else []; "
    "runpy.run_module('sglang.launch_server', run_name='__main__', alter_sys=True)"
)


def command(engine: EngineConfig, host: str, port: int, python: str = sys.executable) -> list[str]:
    return [
        python, "-c", LAUNCH,
        "--model-path", engine.model_path or engine.model,
        "--served-model-name", engine.model,
        "--host", host,
        "--port", str(port),
        "--tp-size", str(engine.tp_size),
        *engine.extra_args,
    ]


def split_devices(visible: str | None, gpus: int, tp_size: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each server of the node (None: leave the variable as it is)."""
    devices = [d for d in (visible or "").split(",") if d] or [str(i) for i in range(gpus)]
    if len(devices) < tp_size:
        return [visible]
    return [",".join(devices[i * tp_size:(i + 1) * tp_size]) for i in range(len(devices) // tp_size)]
