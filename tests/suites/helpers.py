"""Suite fixtures: copies of the examples/swe tasks to break or run under other names. Their
environment is a Dockerfile, run on the host's tree (`dockerfile: host`) rather than built."""

from __future__ import annotations

import shutil
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "swe"
ON_HOST = EXAMPLES / "oracle.yaml"  # the examples as a suite file whose Dockerfiles are not built
TASKS = ("fix-median", "fix-roman", "fix-slugify")


def copy_task(dest: Path, name: str, source: str = "fix-median") -> Path:
    """examples/swe/<source> copied to dest/<name>."""
    target = dest / name
    shutil.copytree(EXAMPLES / source, target)
    return target


def suite_file(path: Path, suite: Path, harness: str) -> Path:
    """A suite reference running `suite` (on the host's tree) with a harness given as YAML flow text."""
    path.write_text(f"suite: {suite}\nharness: {harness}\ndockerfile: host\n")
    return path
