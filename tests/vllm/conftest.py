"""ONE real vLLM server for the whole test session (`vllm` fixture), from `model.model_dir()`.

Its Python is `$POLAR_VLLM_PYTHON` (default `.ci/vllm-venv/bin/python`, made by `.ci/install_vllm`),
run as the engine step runs it (`launch.LAUNCH`: with the route of its sampling defaults).
Without it the vLLM tests skip, unless `POLAR_REQUIRE_VLLM=1`, where they fail. The server runs
with the flags the proxy's capture needs (`SERVE_FLAGS`: the engine step's `launch.FLAGS`)
on a free port, on the CPU; it is stopped when the session ends. `start_vllm(tmp)` starts another
one (for a test that kills an engine); start it sparingly: each takes ~3 GB and a minute.
`POLAR_VLLM_URL` names a vLLM already serving `model_dir()` as `proxy.helpers.MODEL` with
`SERVE_FLAGS`, started by `launch.LAUNCH`, to use instead (while developing: it saves the minute).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from polar_hpc.engines.vllm import launch
from proxy.helpers import MODEL
from vllm import model
from vllm.model import model_dir

ROOT = Path(__file__).resolve().parents[2]
SERVE_FLAGS = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048", *launch.FLAGS]
START_S = 600  # to healthy; ~50 s on an idle machine, minutes on a busy one


def vllm_python() -> Path | None:
    """The vLLM venv's Python; a skip without one, a failure where POLAR_REQUIRE_VLLM=1."""
    python = model.vllm_python()
    if python.exists():
        return python
    if os.environ.get("POLAR_REQUIRE_VLLM") == "1":
        pytest.fail(f"POLAR_REQUIRE_VLLM=1 but there is no vLLM python at {python} (set POLAR_VLLM_PYTHON)")
    pytest.skip(f"no vLLM python at {python} (.ci/install_vllm makes one; POLAR_VLLM_PYTHON names it)")


@dataclass
class Vllm:
    url: str  # before /v1
    model: str  # the served model name
    folder: Path
    proc: subprocess.Popen | None

    def post(self, path: str, body: dict) -> dict:
        """vLLM's own answer to a direct call."""
        request = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            return json.loads(r.read())

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=120) as r:
            return json.loads(r.read())

    def stop(self, kill: bool = False) -> None:
        """Stop it (`kill`: at once, SIGKILL, as a crash would)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)  # the engine core is a child
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_vllm(tmp: Path, name: str = "vllm", weights: Path | None = None) -> Vllm:
    """A vLLM serving the tiny model, or the checkpoint folder `weights` (its tokenizer and template)."""
    python = vllm_python()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, VLLM_CACHE_ROOT=str(tmp / "cache"), VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_CI_ENV="1",
               VLLM_SERVER_DEV_MODE="1", OMP_NUM_THREADS="1")
    folder = weights or model_dir()
    args = [str(python), "-c", launch.LAUNCH, "--model", str(folder),
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), *SERVE_FLAGS]
    proc = subprocess.Popen(args, env=env, stdout=open(tmp / f"{name}.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    server = Vllm(f"http://127.0.0.1:{port}", MODEL, folder, proc)
    deadline = time.monotonic() + START_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}: {(tmp / f'{name}.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"vLLM not healthy after {START_S} s")
        time.sleep(1)


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Vllm:
    if os.environ.get("POLAR_VLLM_URL"):
        yield Vllm(os.environ["POLAR_VLLM_URL"].rstrip("/"), MODEL, model_dir(), None)
        return
    server = start_vllm(tmp_path_factory.mktemp("vllm"))
    yield server
    server.stop()
