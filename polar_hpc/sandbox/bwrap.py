"""bubblewrap sandbox: read-only host root, private workspace and /tmp, every namespace unshared.

The command runs as PID 1's child in a new PID namespace with `--die-with-parent`, so killing the
bwrap process takes every process of the session with it. With network `none` the network
namespace is unshared too; `host` and `proxy-only` keep the host network (loopback reaches the proxy).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from polar_hpc.sandbox.base import Sandbox


def available() -> bool:
    """bwrap is installed and can create namespaces on this machine."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    probe = subprocess.run(
        [exe, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--dev", "/dev", "true"],
        capture_output=True,
    )
    return probe.returncode == 0


def _interpreter_paths() -> list[str]:
    """This interpreter's environment folders that live under /tmp (they must stay visible)."""
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    return sorted(p for p in paths if p == "/tmp" or p.startswith("/tmp/"))


class BwrapSandbox(Sandbox):
    name = "bwrap"

    def _wrap(self, argv: list[str]) -> list[str]:
        ws, tmp = str(self.workspace), str(self.tmp)
        args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        args += ["--bind", tmp, "/tmp"]
        for path in _interpreter_paths():  # a virtualenv under /tmp would be hidden by the private /tmp
            args += ["--ro-bind", path, path]
        args += ["--bind", ws, ws, "--chdir", ws]
        args += ["--unshare-all", "--die-with-parent", "--new-session"]
        if self.network != "none":
            args.append("--share-net")
        return args + ["--setenv", "TMPDIR", "/tmp", "--"] + argv
