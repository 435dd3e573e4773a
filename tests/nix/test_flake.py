"""flake.nix, flake.lock and nix/ checked offline: they parse, and the real flake with its real
lock exposes packages/devShells/apps.default for x86_64-linux and aarch64-linux. Nothing is built
(nixpkgs is not reachable from CI); docs/nix.md says what this does and does not prove.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nix.helpers import NEEDS_NIX, ROOT, SYSTEMS, nix_eval, run

pytestmark = NEEDS_NIX


def test_every_nix_file_parses(nix_env):
    files = [ROOT / "flake.nix", *sorted((ROOT / "nix").glob("*.nix"))]
    assert {f.name for f in files} >= {"flake.nix", "uv-lock.nix", "polar-hpc.nix", "gateway.nix"}
    for f in files:
        done = run(["nix-instantiate", "--parse", str(f)], nix_env)
        assert done.returncode == 0, f"{f}: {done.stderr}"


@pytest.mark.parametrize("text, error", [("{ a = 1;\n  b = ; }\n", "syntax error"),
                                         ("{ pkgs }:\n  pkgs.hello // pksg\n", "undefined variable 'pksg'")])
def test_the_parse_check_fails_on_a_broken_file(nix_env, tmp_path, text, error):
    broken = tmp_path / "broken.nix"
    broken.write_text(text)
    done = run(["nix-instantiate", "--parse", str(broken)], nix_env)
    assert done.returncode != 0
    assert error in done.stderr and "broken.nix:2" in done.stderr


def flake_copy(tmp_path: Path) -> Path:
    """The flake's own files, alone (a path: flake is copied whole into the store)."""
    dest = tmp_path / "flake"
    dest.mkdir()
    for name in ("flake.nix", "flake.lock"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "nix", dest / "nix")
    return dest


def nix_flake(flake: Path, env: dict[str, str], command: str, *args: str) -> subprocess.CompletedProcess:
    """Run `nix COMMAND ARGS` offline on the flake copy, refusing any change to its flake.lock."""
    return run(["nix", "--extra-experimental-features", "nix-command flakes", *command.split(),
                "--offline", "--no-update-lock-file", *args], env, cwd=flake)


def test_flake_outputs_exist_for_both_systems(nix_env, tmp_path):
    flake = flake_copy(tmp_path)
    # Listing names and app types forces no package, so nixpkgs itself is never needed.
    names = "bySystem: builtins.mapAttrs (_: builtins.attrNames) bySystem"
    for kind in ("packages", "devShells", "apps"):
        done = nix_flake(flake, nix_env, "eval", "--json", f"path:{flake}#{kind}", "--apply", names)
        assert done.returncode == 0, done.stderr
        outputs = json.loads(done.stdout)
        assert sorted(outputs) == sorted(SYSTEMS), kind
        for system in SYSTEMS:
            assert "default" in outputs[system], (kind, system)
    assert {"gateway-image", "gateway-closure"} <= set(outputs_of(flake, nix_env, "packages"))
    for system in SYSTEMS:
        done = nix_flake(flake, nix_env, "eval", "--raw", f"path:{flake}#apps.{system}.default.type")
        assert (done.returncode, done.stdout) == (0, "app"), done.stderr


def outputs_of(flake: Path, env: dict[str, str], kind: str) -> list[str]:
    done = nix_flake(flake, env, "eval", "--json", f"path:{flake}#{kind}.x86_64-linux",
                     "--apply", "builtins.attrNames")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_flake_lock_pins_the_flakes_nixpkgs_branch(nix_env, tmp_path):
    flake = flake_copy(tmp_path)
    done = nix_flake(flake, nix_env, "flake metadata", "--json", f"path:{flake}")
    assert done.returncode == 0, done.stderr
    node = json.loads(done.stdout)["locks"]["nodes"]["nixpkgs"]
    url = nix_eval(f"(import {ROOT}/flake.nix).inputs.nixpkgs.url", nix_env)
    assert url == "github:{owner}/{repo}/{ref}".format(**node["original"])
    locked = node["locked"]
    assert (locked["type"], locked["owner"], locked["repo"]) == ("github", "NixOS", "nixpkgs")
    assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"])
    assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", locked["narHash"])


def test_a_flake_lock_out_of_date_with_flake_nix_is_refused(nix_env, tmp_path):
    flake = flake_copy(tmp_path)
    text = (flake / "flake.nix").read_text()
    (flake / "flake.nix").write_text(re.sub(r"nixos-\d\d\.\d\d", "nixos-26.05", text))
    done = nix_flake(flake, nix_env, "eval", "--json", f"path:{flake}#apps", "--apply", "builtins.attrNames")
    assert done.returncode != 0
    assert "nixos-26.05" in done.stderr
