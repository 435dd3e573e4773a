"""Helpers for end-to-end runs: write task files, read shards and the engine's sample log."""

from __future__ import annotations

import json
import os
from pathlib import Path

from polar_hpc.shards.reader import iter_trajectories


def write_jsonl(path: Path, tasks: list[dict]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def trajectories(run_dir: Path) -> list:
    return sorted(iter_trajectories(run_dir), key=lambda t: (t.task_id, t.sample_index))


def engine_samples(run_dir: Path) -> dict[tuple, dict]:
    """The scripted engine's own log: input ids -> what it sampled for them."""
    samples = {}
    for line in (run_dir / "logs" / "engine-samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        samples[tuple(s["input_ids"])] = s
    return samples


def live_processes_matching(marker: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose command line contains `marker`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found
