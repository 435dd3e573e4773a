"""Follow an append-only text file line by line, with bounded reads.

`Tail(path).lines()` returns the whole lines appended since the last call (a last line without its
newline is still being written: it waits for the next call). One call reads at most `max_bytes`;
a line longer than `max_line` is cut to it; a file that shrank (rotated, rewritten) is read again
from its start. With `lossy=True` (logs) a file that grew by more than `max_bytes` since the last
look is caught up by skipping to its last `max_bytes` (counted in `skipped`), so a huge log never
stalls a reader; otherwise (the journal) every byte is read, `max_bytes` per call: call again
while `more`. The file, and the `below - 1` folders above it, are never a followed link.
"""

from __future__ import annotations

import os
from pathlib import Path

from polar_hpc import nofollow


class Tail:
    def __init__(self, path: Path, max_bytes: int = 4 << 20, max_line: int = 4096, lossy: bool = False,
                 below: int = 1) -> None:
        self.path = Path(path)
        self.below = below  # the file and the folders above it in the run directory, none followed (nofollow)
        self.offset = 0
        self.max_bytes = max_bytes
        self.max_line = max_line
        self.lossy = lossy
        self.more = False  # the last call stopped at max_bytes
        self.skipped = 0  # bytes never read (caught up past them)

    def lines(self) -> list[str]:
        try:
            with nofollow.fopen(self.path, "rb", self.below) as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:
                    self.offset = 0
                if self.lossy and size - self.offset > self.max_bytes:
                    self.skipped += size - self.max_bytes - self.offset
                    self.offset = size - self.max_bytes
                f.seek(self.offset)
                data = f.read(self.max_bytes)
                self.more = self.offset + len(data) < size
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) == self.max_bytes:  # one line longer than a whole read: drop it
            self.offset += len(data)
            self.skipped += len(data)
            return []
        self.offset += end
        return [line[: self.max_line].decode(errors="replace") for line in data[:end].split(b"\n")[:-1]]
