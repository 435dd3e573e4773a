"""bubblewrap sandbox: read-only host root, private workspace and /tmp, every namespace unshared.

The host's root is visible read-only (the harness runs the host's interpreters); the folder that
holds the other sessions' sandboxes and the `hidden` folders (the run directory, with its shards
and keys) are covered by empty tmpfs mounts (those under /tmp are already behind the private /tmp).

Each command runs in a new PID namespace with `--die-with-parent`, so killing the bwrap process
(or the command ending) takes every process it started with it: nothing outlives its command.
With network `none` or `proxy-only` the command gets a network namespace with only loopback; the
proxy's Unix socket is bound at /run/polar/proxy.sock and `inside.py` relays 127.0.0.1:47111 to it.
With `host` the host network is shared.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from polar_hpc.sandbox.base import INSIDE, Sandbox


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


def host_tmp_dirs() -> list[str]:
    """Top-level /tmp folders holding this interpreter or a PATH entry (a checkout or virtualenv under
    /tmp): the sandbox's private /tmp would hide them, so they are bound back read-only."""
    wanted = [sys.prefix, sys.base_prefix, *os.environ.get("PATH", "").split(os.pathsep)]
    tops = set()
    for path in filter(None, wanted):
        parts = Path(os.path.realpath(path)).parts
        if len(parts) > 2 and parts[:2] == ("/", "tmp"):
            tops.add(f"/tmp/{parts[2]}")
    return sorted(tops)


class BwrapSandbox(Sandbox):
    name = "bwrap"
    pid_namespace = True
    user_namespace = True
    isolates_network = True
    inside = "/run/polar/inside.py"  # bound there, so a source tree under /tmp does not hide it

    def _wrap(self, argv: list[str]) -> list[str]:
        ws, tmp = str(self.workspace), str(self.tmp)
        args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run"]
        for folder in (self.root.parent, *self.hidden):  # the other sessions next to this one; the run dir
            if not folder.is_relative_to("/tmp") and folder.is_dir():
                args += ["--tmpfs", str(folder)]
        args += ["--bind", tmp, "/tmp"]
        shown = host_tmp_dirs()
        for path in shown:
            args += ["--ro-bind", path, path]
        for folder in self.hidden:  # e.g. a run dir inside a checkout under /tmp
            if any(folder.is_relative_to(top) for top in shown) and folder.is_dir():
                args += ["--tmpfs", str(folder)]
        args += ["--ro-bind", str(INSIDE), self.inside, "--bind", ws, ws, "--chdir", ws]
        args += ["--unshare-all", "--die-with-parent", "--new-session"]
        if self.network == "host":
            args.append("--share-net")
        elif self.relayed:
            args += ["--bind", str(self.proxy_socket), self.proxy_socket_inside]
        return args + ["--setenv", "TMPDIR", "/tmp", "--"] + argv
