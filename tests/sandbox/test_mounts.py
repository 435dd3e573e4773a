"""A sandbox's `mounts`: session folders a command finds at absolute paths (Harbor's /tests,
/logs/verifier) with bubblewrap on the host's tree (the rest of / still read-only, /home still
covered), at their host folders without one; `put` replaces what a command left there, a planted
link included, without following it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bwrap_required import needs_bwrap
from polar_hpc.sandbox.bwrap import BwrapSandbox
from polar_hpc.sandbox.none import NoneSandbox

MOUNTS = {"/tests": "tests", "/logs/verifier": "logs/verifier"}


async def _session(cls, root: Path, src: Path) -> tuple[str, list[str], str]:
    sb = cls(root, {}, [], "none", mounts=MOUNTS)
    await sb.start()
    try:
        tests, logs = sb.seen_at("/tests"), sb.seen_at("/logs/verifier")
        plant = await sb.exec(f"echo x > {tests}/planted; ln -s /etc {logs}/reward.txt; echo 1 > {logs}/other", {}, 30)
        assert plant.returncode == 0, plant.stderr
        await sb.put("/tests", src)
        await sb.put("/logs/verifier", None)
        isolated = "; touch /etc/polar-x; ls -A /home | wc -l" if cls is BwrapSandbox else ""
        run = await sb.exec(f"cat {tests}/test.sh; ls -A {logs}; echo 0.5 > {logs}/reward.txt{isolated}", {}, 30)
        shown = sorted(p.name for p in sb.mounts["/tests"].iterdir())
        return run.stdout.decode() + run.stderr.decode(), shown, (sb.mounts["/logs/verifier"] / "reward.txt").read_text()
    finally:
        await sb.stop()


@pytest.mark.parametrize("cls", [pytest.param(BwrapSandbox, marks=needs_bwrap), NoneSandbox])
def test_mounts_at_their_paths_and_put_replaces_what_was_left(cls, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "test.sh").write_text("echo testing\n")
    out, shown, reward = asyncio.run(_session(cls, tmp_path / "sb", src))
    assert shown == ["test.sh"] and reward == "0.5\n"
    assert Path("/etc").is_dir()  # the planted link was removed, not followed
    if cls is NoneSandbox:
        assert out == "echo testing\n"  # /logs/verifier empty again
    else:  # / read-only, /home covered
        assert out.startswith("echo testing\n0\n") and "/etc/polar-x': Read-only file system" in out
        assert not Path("/etc/polar-x").exists()
