"""Sandboxes harnesses run in. `backend(name)` picks the class for a topology's sandbox.backend."""

from __future__ import annotations

from polar_hpc.sandbox import bwrap
from polar_hpc.sandbox.base import ExecResult, Sandbox, SandboxError
from polar_hpc.sandbox.none import NoneSandbox

__all__ = ["ExecResult", "Sandbox", "SandboxError", "backend"]


def backend(name: str) -> tuple[type[Sandbox], str | None]:
    """The sandbox class for `name` (auto|bwrap|none) and a warning when isolation is weaker."""
    if name == "none":
        return NoneSandbox, None
    if bwrap.available():
        return bwrap.BwrapSandbox, None
    if name == "bwrap":
        raise SandboxError("sandbox.backend is 'bwrap' but bubblewrap is not installed or cannot run here")
    return NoneSandbox, "bubblewrap not found or not usable: harnesses run WITHOUT a sandbox (backend 'none')"
