"""No isolation: commands run as plain child processes in the session's workspace.

For machines without bubblewrap or Apptainer; the gateway warns when it falls back to this. The
network is the host's whatever the task asks. Teardown is verified only when the gateway could
give the sandbox a pids cgroup: without one, a daemon that leaves its process group and clears its
environment cannot be found, so `stop()` reports the teardown as unverified.
"""

from __future__ import annotations

from polar_hpc.sandbox.base import Sandbox


class NoneSandbox(Sandbox):
    name = "none"

    def _wrap(self, argv: list[str]) -> list[str]:
        return argv
