"""Per-sandbox cgroups (sandbox/cgroups.py) on real bwrap sandboxes and real processes: the CPU
quota holds a spinner pool, a kill (freeze, SIGKILL, thaw) ends a running fork bomb whole, and an
owner's close and a run's sweep remove every process and folder of theirs, never another run's;
a memory cgroup nests in this process's own, its OOM kill is reported as the memory limit, and
without one RLIMIT_AS bounds each process (and the log says so).

A test that fails still leaves no bomb behind: each sweeps its own run's cgroups when it ends.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bwrap_required import needs_bwrap
from e2e.helpers import live_processes_matching
from polar_hpc.sandbox import Cgroups, Limits
from polar_hpc.sandbox.bwrap import BwrapSandbox
from polar_hpc.sandbox.cgroups import CGROUP_ROOT, PARENT

pytestmark = needs_bwrap

SPIN = """
import os, sys, time
for _ in range(int(sys.argv[1])):
    if os.fork() == 0:
        end = time.monotonic() + float(sys.argv[2])
        while time.monotonic() < end:
            pass
        os._exit(0)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
t = os.times()
print(t.children_user + t.children_system)
"""

BOMB = "import os\nfor _ in range(7):\n    os.fork()\nwhile True:\n    pass\n"  # 128 spinners, within max_pids


@pytest.fixture
def owner():
    """Cgroups of a run of this test alone; whatever the test leaves is killed and removed."""
    cgroups = Cgroups(f"t{secrets.token_hex(4)}")
    if cgroups.create("probe", Limits()) is None:
        pytest.skip("no pids cgroup can be made here (not root, no delegation)")
    yield cgroups
    cgroups.sweep(live_too=True)  # the test's other processes' cgroups
    cgroups.close()
    assert not _owner_folders(cgroups.owner)


def _owner_folders(owner: str) -> list[Path]:
    return [p for p in CGROUP_ROOT.glob(f"*/{PARENT}/{owner}") if p.is_dir()]


def _box(root: Path, cgroups: Cgroups, **limits) -> BwrapSandbox:
    return BwrapSandbox(root, {}, [], "none", limits=Limits(**limits), cgroups=cgroups)


def test_cpu_quota_holds_a_spinner_pool(owner: Cgroups, tmp_path: Path) -> None:
    (tmp_path / "spin.py").write_text(SPIN)

    async def go():
        sb = _box(tmp_path / "sb", owner, max_cpus=0.5)
        await sb.start()
        (sb.workspace / "spin.py").write_text(SPIN)
        t0 = time.monotonic()
        r = await sb.exec(f"{sys.executable} spin.py 8 3", {}, 60)
        wall = time.monotonic() - t0
        assert await sb.stop()
        return r, wall

    r, wall = asyncio.run(go())
    assert r.returncode == 0, r.stderr
    cpu = float(r.stdout)
    assert cpu <= 0.5 * wall * 1.2 + 0.3, (cpu, wall)  # 8 spinners for 3 s: 24 CPU-seconds unbounded


def test_kill_ends_a_running_fork_bomb_and_close_leaves_nothing(owner: Cgroups, tmp_path: Path) -> None:
    marker = f"bomb-{secrets.token_hex(4)}"

    async def go():
        sb = _box(tmp_path / "sb", owner, max_pids=200)
        await sb.start()
        running = asyncio.create_task(sb.exec(f"{sys.executable} -c '{BOMB}' {marker}", {}, 120))
        deadline = time.monotonic() + 30
        while len(sb._cgroup.pids()) < 128 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        during = len(sb._cgroup.pids())
        t0 = time.monotonic()
        killed = await asyncio.to_thread(owner.close)  # what a gateway's exit does
        elapsed = time.monotonic() - t0
        result = await running
        return during, killed, elapsed, result

    during, killed, elapsed, result = asyncio.run(go())
    assert during >= 128 and killed >= 128
    assert elapsed < 60, elapsed  # a ceiling only a hang reaches
    assert result.returncode != 0
    assert not live_processes_matching(marker)
    assert not _owner_folders(owner.owner)


# the sleeper is in the cgroup once its shell has joined and exec'd sleep
SETTLED = "while p.pid not in cg.pids() or open(f'/proc/{p.pid}/comm').read() != 'sleep\\n':\n    time.sleep(0.01)\n"


def _dead_owner(run: str, marker: str) -> subprocess.CompletedProcess:
    """A process that puts a sleeper in a cgroup of `run` and exits without cleaning up."""
    script = (
        "import os, subprocess, sys, time\n"
        "from polar_hpc.sandbox import Cgroups, Limits\n"
        f"cg = Cgroups({run!r}).create('sb-x', Limits())\n"
        f"p = subprocess.Popen(cg.wrap(['sleep', '{marker}']), start_new_session=True,\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        + SETTLED +
        "print(Cgroups(sys.argv[1]).owner)\n"
        "os._exit(0)\n"
    )
    return subprocess.run([sys.executable, "-c", script, run], capture_output=True, text=True, check=True)


def test_sweep_closes_dead_owners_of_its_run_only(owner: Cgroups) -> None:
    other = Cgroups(f"t{secrets.token_hex(4)}")
    mine, theirs = f"1{secrets.randbelow(10**8) + 1000:08d}", f"2{secrets.randbelow(10**8) + 1000:08d}"
    try:
        dead = _dead_owner(owner.run, mine).stdout.strip()
        _dead_owner(other.run, theirs)
        assert live_processes_matching(mine) and live_processes_matching(theirs)
        assert owner.sweep() == [dead]
        assert not live_processes_matching(mine) and not _owner_folders(dead)
        assert live_processes_matching(theirs), "another run's cgroups are not ours to sweep"
    finally:
        other.sweep()
    assert not live_processes_matching(theirs)


def test_sweep_spares_a_live_owner_unless_told(owner: Cgroups) -> None:
    marker = f"3{secrets.randbelow(10**8) + 1000:08d}"
    script = (
        "import os, subprocess, time\n"
        "from polar_hpc.sandbox import Cgroups, Limits\n"
        f"cg = Cgroups({owner.run!r}).create('sb-x', Limits())\n"
        "p = subprocess.Popen(cg.wrap(['sleep', os.environ['MARKER']]), stdout=subprocess.DEVNULL)\n"
        + SETTLED +
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    live = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"MARKER": marker})  # not on its own command line
    try:
        assert live.stdout.readline() == "ready\n"
        assert owner.sweep() == [] and live_processes_matching(marker)
        assert len(owner.sweep(live_too=True)) == 1 and not live_processes_matching(marker)
    finally:
        live.kill()
        live.wait()
        owner.sweep(live_too=True)


def test_owner_names_tell_runs_and_processes_apart() -> None:
    a, b = Cgroups("run-a"), Cgroups("run-b")
    assert a.owner.startswith("run-a.") and b.owner.startswith("run-b.")
    assert a.owner.split(".")[1] == str(os.getpid())


HOG = "python3 -c 'b = bytearray(256 << 20); print(len(b))'"  # 256 MiB, touched
SMALL = "python3 -c 'b = bytearray(16 << 20); print(len(b))'"


def _own_memory_group() -> Path:
    [line] = [x for x in Path("/proc/self/cgroup").read_text().splitlines() if "memory" in x.split(":")[1].split(",")]
    return CGROUP_ROOT / "memory" / line.split(":", 2)[2].lstrip("/")


def test_memory_cgroup_nests_in_our_own_and_its_oom_kill_is_named(owner: Cgroups, tmp_path: Path) -> None:
    """A 64 MiB sandbox: its memory cgroup sits under this process's own memory cgroup (never at the
    root, out of the machine's accounting); a 256 MiB allocation is killed and reported as breaking
    the memory limit; a 16 MiB one beside it, and after it in the same sandbox, runs."""
    own = _own_memory_group()
    if not (own / "cgroup.procs").exists():
        pytest.skip("no v1 memory hierarchy here")

    async def go():
        hog, calm = (_box(tmp_path / n, owner, max_memory_bytes=64 << 20) for n in ("hog", "calm"))
        await hog.start()
        await calm.start()
        folder = next(f for t, f in hog._cgroup.folders if "memory" in t.controllers)
        limits = [(folder / f"memory.{k}limit_in_bytes").read_text().strip() for k in ("", "memsw.")]
        results = await asyncio.gather(hog.exec(HOG, {}, 60), calm.exec(SMALL, {}, 60))
        after = await hog.exec(SMALL, {}, 60)
        assert await hog.stop() and await calm.stop()
        return folder, limits, results, after

    folder, limits, (big, small), after = asyncio.run(go())
    assert folder.parent.parent == own / PARENT and folder.parent.name == owner.owner
    assert limits[0] == str(64 << 20) and limits[1] in (str(64 << 20), "")
    assert big.limit == "memory limit exceeded (memory_mb=64)" and big.returncode != 0, big
    assert small.returncode == 0 and small.stdout == b"16777216\n" and small.limit is None
    assert after.returncode == 0 and after.limit is None
    assert not folder.exists(), "stop() removes the memory cgroup too"


def test_without_a_memory_cgroup_rlimit_as_bounds_each_process(tmp_path: Path, caplog) -> None:
    async def go():
        sb = _box(tmp_path / "sb", Cgroups(), max_memory_bytes=64 << 20, use_cgroup=False)
        await sb.start()
        results = await sb.exec(HOG, {}, 60), await sb.exec(SMALL, {}, 60)
        await sb.stop()
        return results

    with caplog.at_level("WARNING", logger="polar_hpc.sandbox"):
        big, small = asyncio.run(go())
    assert big.returncode == 1 and b"MemoryError" in big.stderr, big
    assert small.returncode == 0 and small.stdout == b"16777216\n"
    assert "no memory cgroup can be made here" in caplog.text and "RLIMIT_AS" in caplog.text


def test_an_owner_makes_its_folders_again_after_a_close(owner: Cgroups) -> None:
    """Create finds the hierarchies and makes the owner's folders once; a close (or another gateway's
    sweep) that removed them since does not leave later sandboxes without a cgroup."""
    owner.close()
    assert not _owner_folders(owner.owner)
    again = owner.create("after-close", Limits(max_pids=64))
    assert again is not None and again.path is not None and again.path.is_dir()
    assert (again.path / "pids.max").read_text().strip() == "64"
