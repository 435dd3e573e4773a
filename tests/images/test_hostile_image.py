"""A hostile image from the loopback registry: a setuid-root copy of `id`, a setgid file, files and
folders writable by everyone and a FIFO. `image pull` keeps none of it (no setuid/setgid bit,
nothing writable by group or others, no special file, the entry 0755), and a sandbox in that image,
whose mounts are all nosuid, runs the binary as its own unprivileged user."""

from __future__ import annotations

import asyncio
import os
import secrets
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import polar
from images import rootfs
from images.conftest import Registry, harbor_task, needs_tools
from polar_hpc.sandbox.bwrap import BwrapSandbox
from sandbox.bwrap_required import needs_bwrap

pytestmark = [needs_tools, needs_bwrap, pytest.mark.timeout(300)]


def _push(registry: Registry, folder: Path) -> tuple[str, dict[str, int]]:
    """The hostile image pushed to `registry`; its reference and the modes its layer carries."""
    root = rootfs.build(folder / "root", {"etc/polar-image": "hostile\n", "srv/open/file": "x\n"})
    os.chmod(root / "usr/bin/id", 0o4755)  # setuid root (the files are root's once in the image)
    os.chmod(root / "usr/bin/env", 0o2755)  # setgid
    os.chmod(root / "srv/open", 0o777)
    os.chmod(root / "srv/open/file", 0o666)
    os.mkfifo(root / "srv/fifo")
    layout = f"{folder / 'oci'}:1"
    for argv in (["umoci", "init", "--layout", str(folder / "oci")], ["umoci", "new", "--image", layout],
                 ["umoci", "insert", "--rootless", "--image", layout, str(root), "/"]):
        subprocess.run(argv, check=True, capture_output=True)
    reference = f"{registry.address}/polar/hostile:{secrets.token_hex(4)}"
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}", f"docker://{reference}"],
                   check=True, capture_output=True)
    modes = {}
    for blob in (folder / "oci" / "blobs" / "sha256").iterdir():
        try:
            with tarfile.open(blob) as layer:
                modes |= {m.name.lstrip("./"): m.mode | (stat.S_IFIFO if m.isfifo() else 0) for m in layer}
        except tarfile.TarError:
            continue  # the manifest and config
    return reference, modes


def test_a_hostile_image_is_tamed_in_the_cache_and_runs_nosuid(tmp_path: Path, registry: Registry) -> None:
    reference, modes = _push(registry, tmp_path / "image")
    assert modes["usr/bin/id"] & 0o7777 == 0o4755 and modes["usr/bin/env"] & 0o7777 == 0o2755  # really hostile
    assert modes["srv/open"] & 0o777 == 0o777 and stat.S_ISFIFO(modes["srv/fifo"])
    suite, cache = tmp_path / "suite", tmp_path / "cache"
    harbor_task(suite / "hostile", reference, "hostile")
    r = polar("image", "pull", suite, "--cache", cache, timeout=280)
    assert r.returncode == 0, r.stderr
    [entry] = cache.glob("sha256-*.rootfs")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o755 and not stat.S_IMODE(cache.stat().st_mode) & 0o022
    found = []
    for here, dirs, names in os.walk(entry):
        for name in dirs + names:
            st = os.lstat(os.path.join(here, name))
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_mode & (stat.S_ISUID | stat.S_ISGID | 0o022) or not (stat.S_ISREG(st.st_mode)
                                                                           or stat.S_ISDIR(st.st_mode)):
                found.append((os.path.join(here, name), oct(st.st_mode)))
    assert found == []
    assert (entry / "usr/bin/id").is_file() and not (entry / "srv/fifo").exists()

    async def go():
        sb = BwrapSandbox(tmp_path / "sb", {}, [], "none", image=str(entry))
        await sb.start()
        r = await sb.exec("id -u; cat /proc/self/uid_map; grep -v ' /proc' /proc/self/mountinfo", {}, 60)
        host_uid = sb.run_as[0] if os.geteuid() == 0 else os.getuid()  # a root gateway's: the session's own
        assert await sb.stop()
        return r, host_uid

    r, host_uid = asyncio.run(go())
    uid, uid_map, *mounts = r.stdout.decode().splitlines()
    # the image's user (root: its User is unset) inside its own user namespace, an unprivileged uid on the host
    assert uid == "0" and uid_map.split()[:3] == ["0", str(host_uid), "1"], r
    options = [line.split()[5].split(",") for line in mounts]
    assert options and all("nosuid" in o for o in options), mounts
