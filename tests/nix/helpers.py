"""Running nix offline for tests/nix: a private store, and evaluation of nix/uv-lock.nix."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = {"x86_64-linux": "x86_64", "aarch64-linux": "aarch64"}
# Stand-ins for the pinned nixpkgs' python311 and glibc versions (the build passes the real
# ones); any 3.11 release and any glibc newer than the lock's manylinux tags select the same.
PYTHON, GLIBC = "3.11.14", "2.40-66"

NEEDS_NIX = pytest.mark.skipif(
    shutil.which("nix-instantiate") is None,
    reason="nix-instantiate not installed (Debian package nix-bin, which .ci/run installs)",
)


def run(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def nix_eval(expr: str, env: dict[str, str]) -> object:
    done = run(["nix-instantiate", "--eval", "--strict", "--json", "-E", expr], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def uv_lock_expr(system: str, lock: Path) -> str:
    return (f'import {ROOT}/nix/uv-lock.nix {{ lockFile = {lock}; system = "{system}";'
            f' pythonVersion = "{PYTHON}"; glibcVersion = "{GLIBC}"; }}')


def lock_closure(system: str, env: dict[str, str], lock: Path = ROOT / "uv.lock") -> dict:
    return nix_eval(uv_lock_expr(system, lock), env)
