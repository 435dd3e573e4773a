"""Sandboxes run commands in a private workspace, enforce timeouts and leave no process behind."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pydantic
import pytest

from e2e.helpers import live_processes_matching
from bwrap_required import AVAILABLE, needs_bwrap
from polar_hpc.config import SandboxConfig, load_topology
from polar_hpc.errors import ConfigError
from polar_hpc.sandbox import Limits, SandboxError, backend
from polar_hpc.sandbox.bwrap import BwrapSandbox
from polar_hpc.sandbox.none import NoneSandbox

BACKENDS = [NoneSandbox, pytest.param(BwrapSandbox, marks=needs_bwrap)]


def _run(coro):
    return asyncio.run(coro)



@pytest.mark.parametrize("cls", BACKENDS)
def test_files_prepare_exec_and_output_cap(cls, tmp_path: Path) -> None:
    src = tmp_path / "input.txt"
    src.write_text("payload\n")

    async def go():
        sb = cls(tmp_path / "sb", {"sub/in.txt": str(src)}, ["cat sub/in.txt > prepared.txt"], "host")
        await sb.start()
        r = await sb.exec("cat prepared.txt; echo $GREETING; echo oops >&2; exit 7", {"GREETING": "hi"}, 10)
        big = await sb.exec("head -c 100000 /dev/zero", {}, 10, max_output=1000)
        assert await sb.stop()
        return r, big

    r, big = _run(go())
    assert (r.returncode, r.stdout, r.stderr, r.timed_out) == (7, b"payload\nhi\n", b"oops\n", False)
    assert len(big.stdout) == 1000
    assert not (tmp_path / "sb").exists()


@pytest.mark.parametrize("cls", BACKENDS)
def test_failed_prepare_raises_with_its_stderr(cls, tmp_path: Path) -> None:
    sb = cls(tmp_path / "sb", {}, ["echo no-such-tool >&2; exit 4"], "host")
    with pytest.raises(SandboxError, match="exited 4: no-such-tool"):
        _run(sb.start())
    assert _run(sb.stop()) is (sb.pid_namespace or sb._cgroup is not None)


@pytest.mark.parametrize("cls", BACKENDS)
def test_timeout_kills_the_whole_tree(cls, tmp_path: Path) -> None:
    marker = f"9{os.getpid() % 100000:05d}7"

    async def go():
        sb = cls(tmp_path / "sb", {}, [], "host")
        await sb.start()
        r = await sb.exec(f"sleep {marker} & (sleep {marker} &); trap '' TERM; sleep {marker}", {}, 1.0)
        return r, await sb.stop()

    r, clean = _run(go())
    assert r.timed_out and r.returncode != 0
    assert clean
    assert not live_processes_matching(marker)


@needs_bwrap
def test_bwrap_runs_here() -> None:
    assert AVAILABLE, "bubblewrap is missing or cannot create namespaces here (apt-get install bubblewrap)"


@needs_bwrap
def test_topology_names_the_uids_a_root_gateway_runs_harnesses_as(tmp_path: Path) -> None:
    factory, _ = backend(SandboxConfig(backend="bwrap", uid_range=[123400, 123409]), tmp_path)
    uids = factory(tmp_path / "sb", {}, [], "proxy-only").uids
    assert uids is not None and (uids.first, uids.last) == (123400, 123409)
    for bad in ([0, 10], [60000, 70000], [10, 5], [1, True]):  # root, nobody, empty, a bool
        with pytest.raises(pydantic.ValidationError, match="uid_range"):
            SandboxConfig(uid_range=bad)
    (tmp_path / "topology.yaml").write_text("sandbox:\n  max_pids: 64\n  uid_range: [60000, 70000]\n")
    with pytest.raises(ConfigError, match=r"topology.yaml:3: sandbox.uid_range: \[60000, 70000\] holds 65534"):
        load_topology(tmp_path / "topology.yaml")


@needs_bwrap
def test_what_the_gateway_writes_into_the_workspace_is_the_harness_s(tmp_path: Path) -> None:
    """A harness's config folder written by a root gateway (presets) stays writable for the harness."""
    async def go():
        sb = BwrapSandbox(tmp_path / "sb", {}, [], "none")
        await sb.start()
        (sb.workspace / ".codex").mkdir()
        (sb.workspace / ".codex" / "config.toml").write_text("model = 'x'\n")
        os.symlink("/etc/passwd", sb.workspace / "passwd")  # given as a link, never followed
        r = await sb.exec("echo s >> .codex/config.toml && touch .codex/sessions && id -u", {}, 10)
        owners = {p.name: p.lstat().st_uid for p in (sb.workspace / ".codex", sb.workspace / "passwd")}
        uid = sb.run_as[0] if os.geteuid() == 0 else os.getuid()  # a root gateway's: the sandbox's own
        assert await sb.stop()
        return r, owners, uid

    r, owners, uid = _run(go())
    assert r.returncode == 0, r.stderr
    assert uid not in (0, 65534)
    assert r.stdout == f"{uid}\n".encode() and set(owners.values()) == {uid}
    assert Path("/etc/passwd").stat().st_uid == 0


@needs_bwrap
def test_bwrap_isolation(tmp_path: Path) -> None:
    host_file = Path("/tmp") / f"polar-host-{os.getpid()}"
    host_file.write_text("host")
    inner = f"polar-inner-{os.getpid()}"
    async def go():
        sb = BwrapSandbox(tmp_path / "sb", {}, [], "none")
        await sb.start()
        ro = await sb.exec("touch /usr/polar-escape", {}, 10)
        tmp = await sb.exec(f"touch /tmp/{inner} && ls /tmp/{inner} /tmp/{host_file.name}", {}, 10)
        net = await sb.exec("cat /proc/net/dev", {}, 10)
        pid = await sb.exec("echo $$", {}, 10)
        await sb.stop()
        return ro, tmp, net, pid

    ro, tmp, net, pid = _run(go())
    host_file.unlink()
    assert ro.returncode != 0 and not Path("/usr/polar-escape").exists()
    assert tmp.stdout == f"/tmp/{inner}\n".encode() and b"No such file" in tmp.stderr  # host's /tmp hidden
    assert not (Path("/tmp") / inner).exists()
    interfaces = [line.split(":")[0].strip() for line in net.stdout.decode().splitlines()[2:]]
    assert interfaces == ["lo"]
    assert int(pid.stdout) < 10  # its own PID namespace


@pytest.mark.parametrize("cls", BACKENDS)
def test_upload_download_refuse_paths_outside_the_workspace(cls, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("data")

    async def go():
        sb = cls(tmp_path / "sb", {}, [], "host")
        await sb.start()
        await sb.upload(src, "a/b.txt")
        await sb.exec(f"ln -s {tmp_path} out; mkdir d; ln -s /etc/hostname d/link", {}, 10)
        await sb.download("a/b.txt", tmp_path / "back.txt")
        await sb.download("d", tmp_path / "d-copy")
        with pytest.raises(SandboxError, match="leaves its folder"):
            await sb.upload(src, "../escape.txt")
        with pytest.raises(SandboxError, match="out: a symbolic link"):
            await sb.download("out/in.txt", tmp_path / "leak.txt")
        await sb.stop()

    _run(go())
    assert (tmp_path / "back.txt").read_text() == "data"
    assert (tmp_path / "d-copy" / "link").is_symlink()  # copied as a link, not followed
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "leak.txt").exists()


@pytest.mark.parametrize("cls", BACKENDS)
def test_cancel_ends_a_running_command_now(cls, tmp_path: Path) -> None:
    async def go():
        sb = cls(tmp_path / "sb", {}, [], "host")
        await sb.start()
        running = asyncio.create_task(sb.exec("touch started; sleep 600", {}, 600))
        while not (sb.workspace / "started").exists():  # it runs (a hang ends at the test's timeout)
            await asyncio.sleep(0.02)
        await sb.cancel()
        return await running, await sb.stop()

    r, clean = _run(go())
    assert r.returncode != 0 and not r.timed_out  # ended by the cancel, long before its own end or timeout
    assert clean


@pytest.mark.parametrize("use_cgroup", [True, False])
def test_none_backend_finds_daemons_but_only_a_cgroup_verifies(use_cgroup: bool, tmp_path: Path) -> None:
    marker = f"8{os.getpid() % 100000:05d}{int(use_cgroup)}"

    async def go():
        sb = NoneSandbox(tmp_path / "sb", {}, [], "host", limits=Limits(use_cgroup=use_cgroup))
        await sb.start()
        await sb.exec(f"(setsid sh -c 'touch up; exec sleep {marker}' > /dev/null 2>&1 &);"
                      " until [ -e up ]; do sleep 0.02; done", {}, 10)
        alive_after_exec = live_processes_matching(marker)
        return alive_after_exec, sb._cgroup is not None, await sb.stop()

    alive_after_exec, had_cgroup, verified = _run(go())
    if use_cgroup and not had_cgroup:
        pytest.skip("no pids cgroup can be made here")
    assert alive_after_exec  # a daemon outlives its command in the none backend...
    assert not live_processes_matching(marker)  # ...but stop finds it by its environment marker and kills it
    assert verified is use_cgroup  # without a cgroup the teardown is reported unverified
