"""The command line every Python-launched engine server shares (engines/*/launch.py fill it in).

`command(engine, launch, host, port, model_flag, tp_flag, fixed)`: `engine.python` (default:
polar-hpc's own) runs `-c launch`, then the model path (`model_flag`, default `engine.model`), the
served model name, host, port, `tp_flag` = `tp_size`, the kind's `fixed` flags, and the user's
`extra_args` last (a later flag wins in the engines' argparse).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the proxy imports the engine kinds without pydantic's cost
    from polar_hpc.config import EngineConfig


def command(engine: EngineConfig, launch: str, host: str, port: int, model_flag: str, tp_flag: str,
            fixed: tuple[str, ...] = ()) -> list[str]:
    return [
        engine.python or sys.executable, "-c", launch,
        model_flag, engine.model_path or engine.model,
        "--served-model-name", engine.model,
        "--host", host,
        "--port", str(port),
        tp_flag, str(engine.tp_size),
        *fixed,
        *engine.extra_args,
    ]
