"""No isolation: commands run as plain child processes in the session's workspace.

For machines without bubblewrap or Apptainer; the gateway warns when it falls back to this. The
network is the host's whatever the task asks. Teardown is verified only when the gateway could
give the sandbox a pids cgroup: without one, a daemon that leaves its process group and clears its
environment cannot be found, so `stop()` reports the teardown as unverified. A task with an image
is refused at start (`SandboxError`): the host's tree never stands in for its image. Nothing keeps
a session's secrets: commands run as the gateway's user (root for a root gateway) without
namespaces, so any process of that uid, another session's included, reads their environment.
"""

from __future__ import annotations

from polar_hpc.sandbox.base import Sandbox, SandboxError


class NoneSandbox(Sandbox):
    name = "none"

    async def _launch(self) -> None:
        if self.image:
            raise SandboxError(f"sandbox.image: {self.image}: the `none` backend runs no image (its commands would "
                               "run on the host's tree): use bwrap or apptainer")

    def _wrap(self, argv: list[str], cwd: str | None = None, user: str | None = None) -> list[str]:
        if cwd is not None or user is not None:  # it runs no image, whose folder or user these would be
            raise ValueError("the none backend runs commands in the workspace as the gateway's user only")
        return argv
