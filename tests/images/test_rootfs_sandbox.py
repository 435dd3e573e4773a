"""A bubblewrap sandbox whose image is a root filesystem folder (an `image pull` entry): the command
sees the image, not the host (a host file by its own path is not there, nor through links the image
plants at its top level: links inside the image resolve inside it), what it writes to / goes to
the session's layer and never to the image, and it runs with the image's python3 and PATH."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

from images import rootfs
from polar_hpc.sandbox.bwrap import IMAGE_PATH, BwrapSandbox
from sandbox.bwrap_required import needs_bwrap

pytestmark = needs_bwrap


def test_the_image_is_the_root_and_the_host_is_out_of_sight(tmp_path: Path) -> None:
    secret = tmp_path / "host-only" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text(token := secrets.token_hex(8))
    secret.parent.chmod(0o755)
    secret.chmod(0o644)
    root = rootfs.build(tmp_path / "image", {"etc/polar-image": "in-image\n"})
    (root / "hostroot").symlink_to("/")
    (root / "escape").symlink_to(str(secret.parent))
    (root / "proc").mkdir()  # the sandbox's own /proc, not the image's

    async def go():
        sb = BwrapSandbox(tmp_path / "sb", {}, [], "none", image=str(root))
        await sb.start()
        script = (f"cat /etc/polar-image; echo $PATH; cat {secret} /hostroot{secret} /escape/secret.txt; "
                  "touch /planted; python3 -c 'import sys; print(sys.executable)'; ls /proc/self >/dev/null && echo proc")
        r = await sb.exec(script, {}, 60)
        assert await sb.stop()
        return r

    r = asyncio.run(go())
    out, err = r.stdout.decode(), r.stderr.decode()
    assert out.splitlines() == ["in-image", IMAGE_PATH, "/usr/bin/python3", "proc"], (out, err)
    assert token not in out and err.count("No such file or directory") == 3, err
    assert not (root / "planted").exists() and (tmp_path / "sb").exists() is False  # the layer went with stop()
