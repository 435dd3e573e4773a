"""The shell harness: a task's command, run in its sandbox, pointed at the proxy.

The harness sees an ordinary OpenAI-compatible endpoint (OPENAI_BASE_URL, OPENAI_API_KEY = its
session token) and an Anthropic one (ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY = the same token), its
instruction in the file named by POLAR_INSTRUCTION_FILE and, when it is at most ENV_INSTRUCTION_MAX
bytes (the kernel refuses longer environment strings), in POLAR_INSTRUCTION, and, on the host's
tree, this interpreter's bin folder first on PATH (so `python` is the one that has the project's
environment); in a task's image the PATH is the image's own (its Env), as in its container. The
file is written without following links (the workspace is the sandbox's).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from polar_hpc.config import Task
from polar_hpc.sandbox import files

INSTRUCTION_FILE = "instruction.txt"
ENV_INSTRUCTION_MAX = 64 << 10  # bytes; one environment string may not exceed 128 KiB


def environment(task: Task, proxy_url: str, token: str, session_id: str, workspace: Path) -> dict[str, str]:
    """Write the instruction file into `workspace` and return the harness's environment."""
    instruction = task.instruction.encode()
    files.write(workspace, INSTRUCTION_FILE, instruction)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
    base = {
        **({} if task.sandbox.image else {"PATH": path}),
        "OPENAI_BASE_URL": f"{proxy_url}/v1",
        "OPENAI_API_KEY": token,
        "ANTHROPIC_BASE_URL": proxy_url,  # the SDKs add /v1/messages
        "ANTHROPIC_API_KEY": token,
        "POLAR_SESSION_ID": session_id,
        "POLAR_INSTRUCTION_FILE": str(workspace / INSTRUCTION_FILE),
    }
    if len(instruction) <= ENV_INSTRUCTION_MAX:
        base["POLAR_INSTRUCTION"] = task.instruction
    return base | dict(task.harness.env)
