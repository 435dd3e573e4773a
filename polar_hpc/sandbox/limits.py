"""What bounds a sandbox: `Limits`.

Where each bound is enforced (docs/sandbox.md has the table):
- processes: `max_pids` through the sandbox's pids cgroup when the gateway can create one (root,
  or a delegated cgroup v2 subtree: cgroups.py); otherwise RLIMIT_NPROC set inside the sandbox's
  user namespace (bwrap, apptainer), which the kernel counts per namespace but does not enforce
  for host root (a root gateway's harnesses run as their own leased uid outside any user namespace: owner.py).
- CPU: `max_cpus` CPUs through the sandbox's cpu cgroup, all sandboxes weighted low against the
  gateway and its proxy (cgroups.py); none without a cgroup (the session's deadline remains).
- memory: `max_memory_bytes` (None: unbounded) through the sandbox's memory cgroup, nested in the
  gateway's own (cgroups.py; the OOM killer acts inside it and the command is reported as breaking
  the limit); without one, RLIMIT_AS per process inside the sandbox (a malloc past it fails).
- one file's size: RLIMIT_FSIZE (every backend).
- the session's disk: the sandbox folder's size (its /dev/shm included: bwrap and apptainer bind
  the folder's `shm/` there), checked every 0.5 s while a command runs.
- output kept: `max_output` bytes per stream; the rest is read and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_pids: int = 512
    max_file_bytes: int = 1 << 30
    max_disk_bytes: int = 4 << 30
    max_output: int = 1 << 20
    max_cpus: float = 1.0
    max_memory_bytes: int | None = None
    use_cgroup: bool = True  # False: rely on RLIMIT_NPROC (as on clusters without delegation)
