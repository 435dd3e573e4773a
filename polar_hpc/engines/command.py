"""The one builder of each engine's command line.

`python_engine(engine, launch, host, port, model_flag, tp_flag, fixed)`: what every Python-launched
engine server shares (engines/*/launch.py fill it in): `engine.python` (default: polar-hpc's own)
runs `-c launch`, then the model path (`model_flag`, default `engine.model`), the served model name,
host, port, `tp_flag` = `tp_size`, the kind's `fixed` flags, and the user's `extra_args` last (a
later flag wins in the engines' argparse).

`scripted(engine, run_dir, port=, host=, ready_file=, node=)`: the `polar-hpc engine --kind scripted`
arguments of the run's scripted engine, for `polar-hpc run` (launch.local) and for the engine step
(engines.step) alike: model name, weight version, token delay, context length, the policy script
(absolute) and, with `engine.sample_log`, the sample log `<run>/logs/engine-samples.jsonl`
(`engine-samples-TAG.jsonl` for an engine step: TAG its node, or a grow job's `g<job>-<node>`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the proxy imports the engine kinds without pydantic's cost
    from polar_hpc.config import EngineConfig


def python_engine(engine: EngineConfig, launch: str, host: str, port: int, model_flag: str, tp_flag: str,
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


def scripted(engine: EngineConfig, run_dir: Path, *, port: int, host: str | None = None,
             ready_file: Path | None = None, node: str | None = None) -> list[str]:
    args = ["engine", "--kind", "scripted", "--port", str(port)]
    args += ["--host", host] if host is not None else []
    args += ["--ready-file", str(ready_file)] if ready_file is not None else []
    args += ["--model-name", engine.model, "--weight-version", engine.weight_version]
    args += ["--token-delay-ms", str(engine.token_delay_ms), "--context-length", str(engine.context_length)]
    if engine.script:
        args += ["--script", str(Path(engine.script).resolve())]
    if engine.sample_log:
        name = "engine-samples.jsonl" if node is None else f"engine-samples-{node}.jsonl"
        args += ["--sample-log", str(run_dir / "logs" / name)]
    return args
