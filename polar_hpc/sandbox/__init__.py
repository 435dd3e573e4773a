"""Sandboxes harnesses run in. `backend(config, tmp)` makes the factory for a topology's sandbox section."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from polar_hpc.config import SandboxConfig
from polar_hpc.sandbox import apptainer, bwrap
from polar_hpc.sandbox.base import ExecResult, Sandbox, SandboxError
from polar_hpc.sandbox.cgroups import Cgroups
from polar_hpc.sandbox.limits import Limits
from polar_hpc.sandbox.none import NoneSandbox
from polar_hpc.sandbox.uids import Uids

__all__ = ["Cgroups", "ExecResult", "Limits", "Sandbox", "SandboxError", "backend"]

Factory = Callable[..., Sandbox]


def backend(
    config: SandboxConfig, node_tmp: Path, hidden: tuple[Path, ...] = (), cgroups: Cgroups | None = None
) -> tuple[Factory, str | None]:
    """A factory for `config.backend` (auto|bwrap|apptainer|none) and a warning when isolation is weaker.

    The factory takes (root, files, prepare, network, proxy_socket=, image=, gpus=, hidden=).
    `hidden` folders (the run directory; per sandbox, e.g. a task's hidden tests, added to those)
    are kept out of sight where the backend can; the sandboxes' cgroups belong to `cgroups` (a
    gateway's, closed at its exit), else to this process's `cgroups.local()`. `auto` means bwrap
    where it works, else none; `apptainer` and `bwrap` fail when they cannot run here.
    """
    limits = Limits(config.max_pids, config.max_file_bytes, config.max_disk_bytes, config.max_output_bytes,
                    config.max_cpus)
    common = {"limits": limits, "cgroups": cgroups}
    uids = Uids(config.uid_range[0], config.uid_range[1])  # a root gateway leases each sandbox its own host uid from these
    if config.backend == "apptainer":
        if not apptainer.available():
            raise SandboxError("sandbox.backend is 'apptainer' but `apptainer` is not on PATH")
        a = config.apptainer
        settings = apptainer.ApptainerSettings(
            image=a.image,
            image_dir=Path(a.image_dir) if a.image_dir else None,
            node_local_dir=Path(a.node_local_dir) if a.node_local_dir else node_tmp / "polar-images",
            starts_per_node=a.starts_per_node,
            starts_per_image=a.starts_per_image,
        )
        return _factory(apptainer.ApptainerSandbox, hidden, settings=settings, uids=uids, **common), None
    if config.backend != "none" and bwrap.available():
        if os.geteuid() == 0 and (why := bwrap.unreachable(uids.first, uids.first)):
            raise SandboxError(f"sandbox.uid_range [{uids.first}, {uids.last}]: its uids cannot run this Python "
                               f"({sys.executable}) in a sandbox: {why} is closed to it; open the folders on the way "
                               "to others (chmod o+x) or install polar-hpc elsewhere")
        return _factory(bwrap.BwrapSandbox, hidden, uids=uids, **common), None
    if config.backend == "bwrap":
        raise SandboxError("sandbox.backend is 'bwrap' but bubblewrap is not installed or cannot run here")
    warning = None
    if config.backend == "auto":
        warning = "bubblewrap not found or not usable: harnesses run WITHOUT a sandbox (backend 'none')"
    return _factory(NoneSandbox, hidden, **common), warning


def _factory(cls: type[Sandbox], run_hidden: tuple[Path, ...], **fixed) -> Factory:
    """`cls` with `fixed` keywords; a sandbox's own `hidden` folders add to the run's."""
    def make(*args, hidden: tuple[Path, ...] = (), **kwargs) -> Sandbox:
        return cls(*args, hidden=run_hidden + tuple(hidden), **{**fixed, **kwargs})

    return make
