"""The health of a run's processes as their logs (`logs/*.log`) tell it.

`LogHealth(run_dir, errors).poll()` reads what each log gained since the last poll (at most 500
logs, 1 MiB a poll each, lossy past that): ERROR, WARNING and CRITICAL lines and tracebacks go to
`errors`, grouped by kind (`kind_of`); `processes` holds each process's error count, last line,
when its log last changed, and the bytes skipped. A log that is not a regular file is not read.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

from polar_hpc import nofollow
from polar_hpc.observe.figures import Kinds, kind_of
from polar_hpc.observe.tail import Tail

_LOG_LEVEL = re.compile(r"\b(ERROR|WARNING|CRITICAL)\b")


class LogHealth:
    def __init__(self, run_dir: Path, errors: Kinds) -> None:
        self.logs_dir, self.errors = run_dir / "logs", errors
        self._tails: dict[str, Tail] = {}
        self.processes: dict[str, dict[str, Any]] = {}

    def poll(self) -> None:
        try:
            logs = sorted(n for n in nofollow.listdir(self.logs_dir) if n.endswith(".log"))
        except OSError:
            return
        for entry in logs[:500]:
            st = nofollow.lstat(self.logs_dir / entry)
            if st is None or not stat.S_ISREG(st.st_mode):
                continue
            tail = self._tails.setdefault(entry, Tail(self.logs_dir / entry, max_bytes=1 << 20, lossy=True, below=2))
            name = entry.removesuffix(".log")
            proc = self.processes.setdefault(name, {"name": name, "errors": 0, "last_line": ""})
            proc["changed"] = st.st_mtime
            in_traceback = False
            for line in tail.lines():
                if line.strip():
                    proc["last_line"] = line[:300]
                level = _LOG_LEVEL.search(line)
                ends_traceback = in_traceback and line[:1] not in (" ", "")  # `SomeError: why`
                if level or ends_traceback:
                    proc["errors"] += level is None or level.group(1) != "WARNING"
                    self.errors.add(f"{name}: {kind_of(line[level.start():] if level else line)}", line[:500])
                in_traceback = line.startswith("Traceback") or (in_traceback and not ends_traceback)
            proc["skipped_bytes"] = tail.skipped
