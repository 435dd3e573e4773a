"""vLLM's launcher without vLLM: the server command line, its environment (the run's key as
VLLM_API_KEY, never on a command line), the kind through the CLI, the topology and `submit
--dry-run`, and an engine step whose `engine.python` cannot run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from polar_hpc import security
from polar_hpc.config import EngineConfig
from polar_hpc.engines import kinds
from polar_hpc.engines.vllm import launch
from polar_hpc.security import ENGINE_KEY_ENV
from tests.conftest import polar

HERE = Path(__file__).parent


def test_command_line() -> None:
    extra = ["--max-model-len", "8192", "--tool-call-parser", "qwen3_coder"]
    engine = EngineConfig(kind="vllm", model="qwen3-8b", model_path="/models/Qwen3-8B", tp_size=4,
                          python="/opt/vllm/bin/python", extra_args=extra)
    argv = launch.command(engine, "0.0.0.0", 30001)
    assert argv[:3] == ["/opt/vllm/bin/python", "-c", launch.LAUNCH]
    assert " ".join(argv[3:]) == (
        "--model /models/Qwen3-8B --served-model-name qwen3-8b --host 0.0.0.0 --port 30001 --tensor-parallel-size 4"
        " --enable-auto-tool-choice --tool-call-parser hermes --logprobs-mode processed_logprobs"
        " --enable-scale-out --max-logprobs 21"
        " --max-model-len 8192 --tool-call-parser qwen3_coder"  # the user's args come last: they win
    )
    default = launch.command(EngineConfig(kind="vllm", model="org/m"), "h", 1)
    assert default[0] == sys.executable and default[4] == "org/m"
    assert "vllm.entrypoints.openai.api_server" in launch.LAUNCH  # not the `vllm` console script


def test_environment_carries_the_key_and_the_cache_inside_the_run(tmp_path: Path) -> None:
    base = {"PATH": "/bin", ENGINE_KEY_ENV: "s3cret", "VLLM_API_KEY": "someone-elses"}
    env = launch.environment(base, tmp_path / "cache")
    assert env["VLLM_API_KEY"] == "s3cret" and ENGINE_KEY_ENV not in env and env["PATH"] == "/bin"
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "cache") and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert base[ENGINE_KEY_ENV] == "s3cret"  # the caller's environment is left as it was
    assert "VLLM_API_KEY" not in launch.environment({"VLLM_API_KEY": "inherited"}, tmp_path)  # no run key: none
    argv = launch.command(EngineConfig(kind="vllm"), "h", 1)
    assert not any("s3cret" in a for a in argv)


def test_every_kind_has_weights_and_the_registry_refuses_others() -> None:
    assert kinds.KINDS == ("scripted", "sglang", "vllm")
    for kind in kinds.KINDS:
        assert set(kinds.get(kind).weights.MODES) <= set(kinds.MODES)
    assert kinds.get("vllm").weights.MODES == ("wait", "abort", "continue")
    out = polar("engine", "--kind", "vllmx", "--run-dir", "/nonexistent")
    assert out.returncode == 2 and "unknown kind 'vllmx' (known: scripted, sglang, vllm)" in out.stderr
    out = polar("engine", "--kind", "vllm")
    assert out.returncode == 2 and "needs --run-dir" in out.stderr and "Traceback" not in out.stderr


def test_submit_dry_run_renders_a_vllm_topology(calculator_dir: Path, tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text((HERE.parent / "launch" / "topology.yaml").read_text().replace(
        "kind: sglang", "kind: vllm\n  python: /opt/vllm/bin/python"))
    out = polar("submit", "-c", topo, "--tasks", calculator_dir / "task.yaml", "--run-dir", tmp_path / "run", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --gpus-per-node=8" in out.stdout and not (tmp_path / "run").exists()
    topo.write_text("engine:\n  kind: vllm\n  pyhton: /opt/vllm/bin/python\n")
    out = polar("submit", "-c", topo, "--tasks", calculator_dir / "task.yaml", "--run-dir", tmp_path / "run", "--dry-run")
    assert out.returncode == 2 and f"{topo}:3: engine.pyhton: unknown key" in out.stderr, out.stderr


def test_a_step_whose_python_cannot_run_fails_cleanly(tmp_path: Path) -> None:
    security.create_keys(tmp_path)
    (tmp_path / "topology.yaml").write_text("engine:\n  kind: vllm\n  python: /nonexistent/bin/python\n  port: 18299\n")
    out = subprocess.run([sys.executable, "-m", "polar_hpc", "engine", "--kind", "vllm", "--run-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out
    assert "vllm server 0: cannot run /nonexistent/bin/python: No such file or directory" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_step_whose_python_has_no_vllm_says_so(tmp_path: Path) -> None:
    security.create_keys(tmp_path)
    (tmp_path / "topology.yaml").write_text(f"engine:\n  kind: vllm\n  python: {sys.executable}\n  port: 18299\n")
    out = subprocess.run([sys.executable, "-m", "polar_hpc", "engine", "--kind", "vllm", "--run-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out
    assert f"engine.python {sys.executable} cannot import vllm: set engine.python to a Python with vLLM" in out.stderr, \
        out.stderr
    assert "Traceback" not in out.stderr and "starlette" not in out.stderr, out.stderr
