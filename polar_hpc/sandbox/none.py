"""No isolation: commands run as plain child processes in the session's workspace.

For machines without bubblewrap or Apptainer; the gateway warns when it falls back to this.
"""

from __future__ import annotations

from polar_hpc.sandbox.base import Sandbox


class NoneSandbox(Sandbox):
    name = "none"

    def _wrap(self, argv: list[str]) -> list[str]:
        return argv
