"""The SGLang server command line and how a node's GPUs split into servers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from polar_hpc.config import EngineConfig
from polar_hpc.engines.sglang import launch as sglang
from polar_hpc.engines.step import split_devices
from polar_hpc.security import ENGINE_KEY_ENV


def test_command_line() -> None:
    engine = EngineConfig(kind="sglang", model="qwen3-8b", model_path="/models/Qwen3-8B", tp_size=4,
                          python="/venv/bin/python", extra_args=["--mem-fraction-static", "0.8", "--tp-size", "2"])
    assert sglang.command(engine, "0.0.0.0", 30001) == [
        "/venv/bin/python", "-c", sglang.LAUNCH, "--model-path", "/models/Qwen3-8B",
        "--served-model-name", "qwen3-8b", "--host", "0.0.0.0", "--port", "30001", "--tp-size", "4",
        "--enable-metrics",
        "--mem-fraction-static", "0.8", "--tp-size", "2",  # the user's args come last: they win
    ]
    assert sglang.command(EngineConfig(kind="sglang", model="org/m"), "h", 1)[4] == "org/m"


def test_gpus_split_into_servers_of_tp_size() -> None:
    assert split_devices("0,1,2,3,4,5,6,7", 8, 4) == ["0,1,2,3", "4,5,6,7"]
    assert split_devices("3,5", 2, 1) == ["3", "5"]
    assert split_devices(None, 2, 2) == ["0,1"]  # no variable: the node's GPUs by count
    assert split_devices("0", 1, 8) == ["0"]  # fewer GPUs than tp_size: one server, as given


def test_the_api_key_reaches_sglang_but_no_command_line(tmp_path: Path) -> None:
    """The launcher adds --api-key from the environment; the key is not in the process's argv as
    the OS shows it (`ps`), and SGLang's own processes do not inherit the variable."""
    fake = tmp_path / "sglang"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "launch_server.py").write_text(
        "import json, os, sys\n"
        "cmdline = open(f'/proc/{os.getpid()}/cmdline', 'rb').read().decode()\n"
        f"print(json.dumps({{'argv': sys.argv[1:], 'cmdline': cmdline, 'env': os.environ.get({ENGINE_KEY_ENV!r})}}))\n"
    )
    argv = sglang.command(EngineConfig(kind="sglang", model="m"), "h", 1)
    env = {"PYTHONPATH": str(tmp_path), ENGINE_KEY_ENV: "s3cret"}
    seen = json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout)
    assert seen["argv"][-2:] == ["--api-key", "s3cret"] and seen["argv"][:2] == ["--model-path", "m"]
    assert "s3cret" not in seen["cmdline"] and seen["env"] is None
    bare = json.loads(subprocess.run(argv, env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                                     check=True).stdout)
    assert "--api-key" not in bare["argv"]
