"""An image as the container its task was written for (bwrap, sandbox/layer.py): the image's
config (Env, WorkingDir, User) applied; root inside a user namespace whose host uid is the
sandbox's unprivileged one; a per-session writable layer that keeps the session's writes from one
command to the next, counts in its disk limit, and never reaches the cache entry."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from images import rootfs
from polar_hpc.sandbox.base import SandboxError
from polar_hpc.sandbox.bwrap import BwrapSandbox
from polar_hpc.sandbox.layer import open_up
from polar_hpc.sandbox.limits import Limits
from polar_hpc.sandbox.none import NoneSandbox
from polar_hpc.sandbox.owner import NOBODY, give
from sandbox.bwrap_required import needs_bwrap

pytestmark = needs_bwrap


def entry(folder: Path, config: dict) -> Path:
    """A cache entry as `image pull` leaves it: the root filesystem (owned by the sandbox's host
    uid when pulled as root) and its OCI config beside it."""
    passwd = "root:x:0:0::/root:/bin/sh\nsvc:x:1000:1000::/:/bin/sh\n"
    root = rootfs.build(folder / "sha256-test.rootfs", {"app/data.txt": "from the image\n", "etc/passwd": passwd})
    (folder / "sha256-test.config.json").write_text(json.dumps({"config": config}))
    if os.geteuid() == 0:
        give(root, *NOBODY)
    return root


def run(sb: BwrapSandbox, *commands: str, **at: str | None):
    async def go():
        await sb.start()
        try:
            return [await sb.exec(c, {"TASK": "task's"}, 120, **at) for c in commands]
        finally:
            assert await sb.stop()
    return asyncio.run(go())


def test_root_in_the_image_workdir_env_and_a_layer_that_never_reaches_the_cache(tmp_path: Path) -> None:
    root = entry(tmp_path, {"Env": ["PATH=/usr/bin:/bin", "GREETING=image's", "TASK=image's"], "WorkingDir": "/app"})
    sb = BwrapSandbox(tmp_path / "sb", {}, [], "none", image=str(root))
    assert sb.workdir == "/app"
    first, second = run(  # in the WorkingDir, as a Harbor task's harness and tests run
        sb,
        'id -u; pwd; echo "$GREETING $TASK"; echo agent >> data.txt; mkdir -p /usr/local/share/x; '
        "echo installed > /usr/local/share/x/f; touch /etc/written; cat /proc/self/status | grep CapEff",
        "cat /app/data.txt /usr/local/share/x/f; ls /etc/written; "
        "python3 -c 'import os; print(os.stat(\"/usr/local/share/x/f\").st_uid)'", cwd=sb.workdir)
    out = first.stdout.decode().splitlines()
    assert first.returncode == 0, first.stderr
    assert out[:3] == ["0", "/app", "image's task's"], out  # root, the WorkingDir, the task's Env over the image's
    assert out[3].split()[1] != "0000000000000000", out  # a container's root has its capabilities (in its namespace)
    assert second.returncode == 0 and second.stdout.decode().splitlines() == [
        "from the image", "agent", "installed", "/etc/written", "0"], (second.stdout, second.stderr)
    assert (root / "app/data.txt").read_text() == "from the image\n"  # the cache entry is unchanged
    assert not (root / "etc/written").exists() and not (root / "usr/local/share").exists()


def test_the_layer_is_owned_by_the_unprivileged_host_uid(tmp_path: Path) -> None:
    root = entry(tmp_path, {})
    sb = BwrapSandbox(tmp_path / "sb", {}, [], "none", image=str(root))
    seen = []

    async def go():
        await sb.start()
        r = await sb.exec("id -u; echo x > /made-by-root; echo y >> /app/data.txt", {}, 60)
        seen.append((r.stdout.decode().split(), os.stat(sb.layer.upper / "made-by-root").st_uid,
                     os.stat(sb.layer.upper / "app" / "data.txt").st_uid))
        seen.append(sb.run_as[0] if os.geteuid() == 0 else os.geteuid())  # the sandbox's uid on the host
        assert await sb.stop()

    asyncio.run(go())
    host_uid = seen[1]
    assert seen == [(["0"], host_uid, host_uid), host_uid] and host_uid not in (0, 65534), seen


def test_the_image_user_runs_without_capabilities(tmp_path: Path) -> None:
    root = entry(tmp_path, {"User": "svc"})
    [r] = run(BwrapSandbox(tmp_path / "sb", {}, [], "none", image=str(root)),
              "id -u; grep CapEff /proc/self/status")
    assert r.stdout.decode().split() == ["1000", "CapEff:", "0000000000000000"], (r.stdout, r.stderr)


@pytest.mark.parametrize(("user", "expected"), [("svc", ["1000", "1000", "0000000000000000"]),
                                                ("1000:0", ["1000", "0", "0000000000000000"]),
                                                ("root", ["0", "0"]), ("0", ["0", "0"])])
def test_a_command_runs_as_the_user_its_task_names_in_the_images_workdir(
        tmp_path: Path, user: str, expected: list[str]) -> None:
    """Harbor's [agent] / [verifier] user over the image's User ("svc"), as `docker exec -u` takes
    it; without a WorkingDir a command starts at /, as a container does."""
    root = entry(tmp_path, {"User": "svc"})
    sb = BwrapSandbox(tmp_path / "sb", {}, [], "none", image=str(root))
    assert sb.workdir == "/"
    [r] = run(sb, "id -u; id -g; pwd; grep CapEff /proc/self/status", cwd=sb.workdir, user=user)
    out = r.stdout.decode().split()
    assert r.returncode == 0 and out[:2] == expected[:2] and out[2] == "/", (out, r.stderr)
    assert (out[4] == "0000000000000000") == (expected[0] != "0"), out  # root has its namespace's capabilities


def test_a_user_the_image_does_not_have_is_refused(tmp_path: Path) -> None:
    root = entry(tmp_path, {})
    sb = BwrapSandbox(tmp_path / "sb", {}, [], "none", image=str(root))
    for user, missing in (("agent", "user 'agent'"), ("svc:staff", "group 'staff'")):
        with pytest.raises(SandboxError, match=f"the image has no {missing}"):
            run(sb, "true", user=user)


def test_writes_to_the_layer_count_in_the_disk_limit(tmp_path: Path) -> None:
    root = entry(tmp_path, {})
    sb = BwrapSandbox(tmp_path / "sb", {}, [], "none", image=str(root), limits=Limits(max_disk_bytes=8 << 20))
    [r] = run(sb, "while :; do head -c 1048576 /dev/zero >> /usr/big; done")
    assert r.limit and r.limit.startswith("disk limit exceeded"), (r.limit, r.stderr)


def test_a_gateway_that_is_not_root_can_remove_what_the_sandboxs_root_closed(tmp_path: Path) -> None:
    """The sandbox's root (`chmod 000` with files inside, as the overlay's own work folder is) makes
    folders its unprivileged host uid cannot enter; `open_up` reopens them for that uid, never
    through a link (an outside folder linked from inside keeps its mode)."""
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o555)
    tree = tmp_path / "session"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    (tree / "a" / "link").symlink_to(outside)
    for folder in (tree / "a" / "b", tree / "a"):
        folder.chmod(0)
    if os.geteuid() == 0:
        give(tree, *NOBODY)
    as_sandbox_uid = ["setpriv", "--reuid", str(NOBODY[0]), "--regid", str(NOBODY[1]), "--clear-groups", "--"] \
        if os.geteuid() == 0 else []
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)  # the session's folder, past pytest's 0700 ones

    def remove() -> int:
        return subprocess.run([*as_sandbox_uid, "rm", "-rf", f"/proc/self/fd/{fd}/a"], pass_fds=(fd,),
                              capture_output=True).returncode

    try:
        assert remove() != 0
        open_up(tree)
        assert (outside.stat().st_mode & 0o777) == 0o555
        assert remove() == 0 and not (tree / "a").exists()
    finally:
        os.close(fd)


def test_the_images_root_cannot_reach_the_host(tmp_path: Path) -> None:
    """Root in an image has a container's capabilities in its own user namespace only: no mount,
    no write to the kernel's settings, no other process, not the stage its sources were bound on
    (/mnt outside bwrap's root), and nothing of the host's tree."""
    secret = tmp_path / "host-only.txt"
    secret.write_text("host secret")
    secret.chmod(0o644)
    root = entry(tmp_path, {})
    (root / "mnt").mkdir()
    [r] = run(BwrapSandbox(tmp_path / "sb", {}, [], "none", image=str(root)),
              "id -u; mount -t tmpfs t /mnt 2>/dev/null || echo no-mount; "
              "(echo 1 > /proc/sys/kernel/panic) 2>/dev/null || echo no-sysctl; ls -A /mnt | wc -l; "
              "set -- /proc/[0-9]*; echo $#; "  # bwrap's init and this shell
              f"cat {secret} 2>/dev/null || echo no-host-file; "
              "unshare -Urm true 2>/dev/null; python3 -c 'import os; os.setuid(0); print(\"setuid-0\")'")
    assert r.stdout.decode().split() == ["0", "no-mount", "no-sysctl", "0", "2", "no-host-file", "setuid-0"], (
        r.stdout, r.stderr)


def test_no_backend_runs_a_task_on_the_hosts_tree_in_place_of_its_image(tmp_path: Path) -> None:
    for sb in (NoneSandbox(tmp_path / "none", {}, [], "none", image=str(entry(tmp_path, {}))),
               BwrapSandbox(tmp_path / "bwrap", {}, [], "none", image="docker://docker.io/library/debian:12")):
        with pytest.raises(SandboxError, match="sandbox.image: .*(no image|not a root filesystem folder)"):
            asyncio.run(sb.start())
        asyncio.run(sb.stop())
