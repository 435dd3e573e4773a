"""nix/uv-lock.nix against uv.lock and pyproject.toml, evaluated offline (no nixpkgs needed).

Compared: the names of pyproject's [project.dependencies] against the root dependencies nix reads
from uv.lock, whose locked versions must lie in pyproject's compatible ranges; then, for x86_64-linux and
aarch64-linux, the whole runtime closure (names, versions, edges), the wheel chosen for each
package and its sha256 against what packaging's marker evaluation and tag ranking (pip's and
uv's rules) select from the same lock.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from nix.helpers import NEEDS_NIX, PYTHON, ROOT, SYSTEMS, lock_closure, run, uv_lock_expr

pytestmark = NEEDS_NIX


def test_nix_dependencies_are_pyprojects_at_versions_it_allows(nix_env):
    ranges = {}
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(line)
        assert req.specifier, line  # every runtime dependency names the versions it works with
        ranges[canonicalize_name(req.name)] = req.specifier
    for system in SYSTEMS:
        closure = lock_closure(system, nix_env)
        direct = {name: closure["packages"][name]["version"] for name in closure["direct"]}
        assert set(direct) == set(ranges), system
        assert {n: v for n, v in direct.items() if v not in ranges[n]} == {}, system  # uv.lock's pins are in range


def reference_closure(machine: str, lock_file: Path = ROOT / "uv.lock") -> dict[str, dict]:
    """The closure and wheels pip's rules (packaging) select from a uv.lock for the same target."""
    entries = tomllib.loads(lock_file.read_text())["package"]
    env = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "platform_machine": machine, "python_version": "3.11", "python_full_version": PYTHON}
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    platforms = []
    for g in range(40, 4 if machine == "x86_64" else 16, -1):  # glibc 2.40 down to the oldest
        platforms += [f"manylinux_2_{g}_{machine}"] + ([f"{legacy[g]}_{machine}"] if g in legacy else [])
    ranked = [*cpython_tags((3, 11), ["cp311"], platforms),
              *compatible_tags((3, 11), "cp311", platforms)]
    rank = {tag: i for i, tag in enumerate(ranked)}

    def deps(p: dict) -> list[dict]:
        return [d for d in p.get("dependencies", [])
                if "marker" not in d or Marker(d["marker"]).evaluate(env)]

    def entry(dep: dict) -> dict:
        (hit,) = [p for p in entries if p["name"] == dep["name"]
                  and dep.get("version", p["version"]) == p["version"]]
        return hit

    def wheel_rank(w: dict) -> int:
        tags = parse_wheel_filename(w["url"].rsplit("/", 1)[1])[3]
        return min((rank[t] for t in tags if t in rank), default=len(rank))

    out, todo = {}, deps(entry({"name": "polar-hpc"}))
    while todo:
        p = entry(todo.pop())
        if p["name"] in out:
            continue
        best = min(p["wheels"], key=wheel_rank)  # the first of equals, as on the nix side
        assert wheel_rank(best) < len(rank), f"{p['name']}: no wheel for {machine}"
        out[p["name"]] = {"version": p["version"], "deps": sorted(d["name"] for d in deps(p)),
                          "url": best["url"], "sha256": best["hash"].removeprefix("sha256:")}
        todo += deps(p)
    return out


def nix_closure(system: str, env: dict[str, str], lock: Path = ROOT / "uv.lock") -> dict[str, dict]:
    return {name: {"version": p["version"], "deps": sorted(p["deps"]), "url": p["wheel"]["url"],
                   "sha256": p["wheel"]["sha256"]}
            for name, p in lock_closure(system, env, lock)["packages"].items()}


@pytest.mark.parametrize("system", SYSTEMS)
def test_nix_closure_and_wheels_are_the_ones_pip_rules_pick(nix_env, system):
    got = nix_closure(system, nix_env)
    want = reference_closure(SYSTEMS[system])
    assert sorted(got) == sorted(want)
    assert "colorama" not in got and "hf-xet" in got  # a win32-only and a machine-marked dependency
    for name in want:
        assert got[name] == want[name], name
    native = [p["url"] for p in got.values() if not p["url"].endswith("-any.whl")]
    assert native and all(SYSTEMS[system] in url for url in native)


ROOT_ENTRY = """
[[package]]
name = "polar-hpc"
version = "0"
source = { editable = "." }
"""


def wheels(*filenames: str) -> str:
    return "wheels = [\n" + "".join(
        f'  {{ url = "https://files.example/{f}", hash = "sha256:{hashlib.sha256(f.encode()).hexdigest()}" }},\n'
        for f in filenames) + "]\n"


TRICKY_LOCK = ROOT_ENTRY + """dependencies = [
  { name = "fast" },
  { name = "old-py", marker = "python_full_version < '3.11'" },
  { name = "arm-only", marker = "platform_machine == 'aarch64' and sys_platform == 'linux'" },
  { name = "forked", version = "1.0", marker = "python_full_version < '3.12'" },
  { name = "forked", version = "2.0", marker = "python_full_version >= '3.12'" },
]

[[package]]
name = "fast"
version = "1"
""" + wheels(
    "fast-1-py3-none-any.whl",
    "fast-1-cp38-abi3-manylinux_2_17_x86_64.whl",
    "fast-1-cp311-abi3-manylinux_2_35_x86_64.whl",
    "fast-1-cp311-cp311-manylinux2014_x86_64.whl",
    "fast-1-cp311-cp311-manylinux_2_24_x86_64.whl",
    "fast-1-cp311-cp311-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl",
    "fast-1-cp311-cp311-manylinux_2_41_x86_64.whl",
    "fast-1-cp310-abi3-manylinux_2_28_aarch64.whl",
    "fast-1-cp311-cp311-musllinux_1_2_aarch64.whl",
    "fast-1-cp312-abi3-manylinux_2_28_aarch64.whl",
) + """
[[package]]
name = "arm-only"
version = "2"
""" + wheels("arm_only-2-py2.py3-none-any.whl") + """
[[package]]
name = "forked"
version = "2.0"
""" + wheels("forked-2.0-py3-none-any.whl") + """
[[package]]
name = "forked"
version = "1.0"
""" + wheels("forked-1.0-py3-none-any.whl")


@pytest.mark.parametrize("system", SYSTEMS)
def test_tag_ranking_and_markers_follow_pip_on_a_tricky_lock(nix_env, tmp_path, system):
    # Interpreter ABI before abi3 before pure; newest glibc first, none past 2.40; no musl.
    (tmp_path / "uv.lock").write_text(TRICKY_LOCK)
    got = nix_closure(system, nix_env, tmp_path / "uv.lock")
    assert got == reference_closure(SYSTEMS[system], tmp_path / "uv.lock")
    expected = {"x86_64-linux": "fast-1-cp311-cp311-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl",
                "aarch64-linux": "fast-1-cp310-abi3-manylinux_2_28_aarch64.whl"}[system]
    assert got["fast"]["url"].endswith(expected)
    assert ("arm-only" in got) == (system == "aarch64-linux") and "old-py" not in got
    assert got["forked"]["version"] == "1.0"  # locked twice; the 3.11 fork's version


BAD_LOCKS = {
    "parenthesised marker": (
        """dependencies = [{ name = "x", marker = "(sys_platform == 'linux')" }]\n""",
        "polar-hpc -> x: parenthesised marker"),
    "several versions, none named": (
        """dependencies = [{ name = "two" }]\n"""
        + """\n[[package]]\nname = "two"\nversion = "1"\n""" + wheels("two-1-py3-none-any.whl")
        + """\n[[package]]\nname = "two"\nversion = "2"\n""" + wheels("two-2-py3-none-any.whl"),
        "'two' is locked in several versions"),
    "dependency missing from the lock": (
        """dependencies = [{ name = "ghost" }]\n""",
        "package 'ghost' is required but not locked"),
    "no wheel for the target": (
        """dependencies = [{ name = "winonly" }]\n\n[[package]]\nname = "winonly"\nversion = "1.0"\n"""
        + wheels("winonly-1.0-cp311-cp311-win_amd64.whl"),
        "winonly 1.0 has no wheel for CPython 3.11"),
}


@pytest.mark.parametrize("case", BAD_LOCKS)
def test_a_lock_nix_cannot_follow_is_refused_by_name(nix_env, tmp_path, case):
    text, message = BAD_LOCKS[case]
    (tmp_path / "uv.lock").write_text(ROOT_ENTRY + text)
    done = run(["nix-instantiate", "--eval", "--strict", "--json", "-E",
                uv_lock_expr("x86_64-linux", tmp_path / "uv.lock")], nix_env)
    assert done.returncode != 0
    assert message in done.stderr
