"""A harness that looks for its task's hidden tests and solution (tests/sandbox/test_hidden_parts.py).

argv[1] is a JSON object: `secrets` (strings only the hidden parts and their git history hold),
`roots` (folders to search whole: every file read, every git repository's history and index
searched), `skip` (folders not to walk: the virtualenv bound back), `project` (polar-hpc's
checkout), `show` (a path in the project's history holding a solution). Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

spec = json.loads(sys.argv[1])
secrets = [s.encode() for s in spec["secrets"]]
found: list[str] = []
repositories: list[str] = []
walked = 0


def git(*args: str) -> bytes:
    return subprocess.run(["git", "-c", "safe.directory=*", *args], capture_output=True, timeout=60).stdout


for root in spec["roots"]:
    for here, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(here, d) not in spec["skip"]]
        if ".git" in dirs or ".git" in names:
            repositories.append(here)
        for name in names:
            walked += 1
            try:
                with open(os.path.join(here, name), "rb") as f:
                    data = f.read(1 << 20)
            except OSError:
                continue
            found += [f"{here}/{name}" for s in secrets if s in data]
for repo in repositories:
    history = git("-C", repo, "log", "-p", "--all") + git("-C", repo, "grep", "-h", "-e", "SECRET", "HEAD")
    found += [f"git:{repo}" for s in secrets if s in history]
shown = git("-C", spec["project"], "show", f"HEAD:{spec['show']}")
listing = sorted(os.listdir(spec["project"])) if os.path.isdir(spec["project"]) else None
print(json.dumps({"found": found, "repositories": repositories, "walked": walked, "shown": shown.decode()[:200],
                  "project": listing}), file=sys.stderr)
