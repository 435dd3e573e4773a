"""SGLang on a GPU node: the server command line, and how a node's GPUs split into servers.

A node with `gpus` GPUs runs `gpus // tp_size` servers (at least one), server i on ports
`engine.port + i` with its own slice of the node's CUDA_VISIBLE_DEVICES. The command is
`python -m sglang.launch_server` with the model path, served model name, host, port, tp size and
the user's `extra_args`, in that order (a later flag wins in SGLang's argparse).
"""

from __future__ import annotations

import sys

from polar_hpc.config import EngineConfig


def command(engine: EngineConfig, host: str, port: int, python: str = sys.executable) -> list[str]:
    return [
        python, "-m", "sglang.launch_server",
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
