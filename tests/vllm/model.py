"""The model the vLLM tests serve: `model_dir()` is the tiny model (`polar_hpc.engines.tiny`),
built once by the vLLM venv's Python (`$POLAR_VLLM_PYTHON`, default `.ci/vllm-venv/bin/python`)
into `.pytest_cache/polar-tiny-model/HASH`, HASH covering the builder's source, the tokenizer it
starts from and the calculator agent and mini-swe-agent config it is taught for; later sessions reuse it. A lock keeps
concurrent sessions from building twice."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np

from polar_hpc.engines.scripted.build_tokenizer import ASSET_DIR
from polar_hpc.engines.tiny.conversation import AGENT, MINI_CONFIG

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "polar_hpc" / "engines" / "tiny"
CACHE = ROOT / ".pytest_cache" / "polar-tiny-model"
BUILD_S = 900  # ~40 s on an idle machine, minutes on a busy one


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in [*sorted(BUILDER.glob("*.py")), *sorted(ASSET_DIR.glob("tokenizer*.json")), AGENT, MINI_CONFIG]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def vllm_python() -> Path:
    return Path(os.environ.get("POLAR_VLLM_PYTHON") or ROOT / ".ci" / "vllm-venv" / "bin" / "python")


def build(out: Path) -> None:
    """Build the tiny model into `out` (which must not exist) with the vLLM venv's Python."""
    python = vllm_python()
    if not python.exists():
        raise RuntimeError(f"no vLLM python at {python} to build the tiny model (POLAR_VLLM_PYTHON)")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([str(python), "-m", "polar_hpc.engines.tiny", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=BUILD_S)
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model failed ({done.returncode}): {done.stderr[-3000:]}")


def model_dir() -> Path:
    out = CACHE / source_hash()
    if out.is_dir():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir():  # another session may have built it meanwhile
            build(out)
    return out


def perturbed(src: Path, dst: Path, scale: float = 0.05) -> Path:
    """A copy of the checkpoint folder with every float32 tensor nudged by normal noise of `scale`
    (deterministically): other greedy output, the same tokenizer and template."""
    shutil.copytree(src, dst)
    rng = np.random.default_rng(0)
    for path in dst.glob("*.safetensors"):
        raw = path.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header, data = json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])
        for name, entry in header.items():
            if name != "__metadata__" and entry["dtype"] == "F32":
                start, end = entry["data_offsets"]
                values = np.frombuffer(bytes(data[start:end]), dtype="<f4")
                data[start:end] = (values + rng.normal(0, scale, values.shape).astype("<f4")).tobytes()
        path.write_bytes(raw[:8 + n] + bytes(data))
    return dst
