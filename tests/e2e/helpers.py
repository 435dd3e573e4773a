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


def live_processes_matching(marker: str, program: str | None = None) -> list[int]:
    """PIDs of live (non-zombie) processes whose command line contains `marker` (and whose argv[0]
    is `program`, if given: a sandboxed command's launchers carry it in their arguments too)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in b" ".join(argv).decode(errors="replace") and state != "Z" and program in (None, argv[0].decode()):
            found.append(int(entry.name))
    return found


def check_fidelity(trace, samples: dict[tuple, dict]) -> int:
    """Each sampled run of a merged trace (loss mask 1) is exactly what the engine sampled after
    the tokens before it, ids and logprobs; unsampled tokens have logprob 0. Returns the number
    of engine calls the trace holds."""
    sequence = (trace.prompt_ids + trace.response_ids).tolist()
    runs = sampled_runs(trace.loss_mask.tolist())
    for start, end in runs:
        prompt = tuple(sequence[: len(trace.prompt_ids) + start])
        assert prompt in samples, "the engine never received this prompt"
        engine = samples[prompt]
        assert trace.response_ids[start:end].tolist() == engine["output_ids"]
        assert trace.logprobs[start:end].tolist() == engine["output_logprobs"]
    assert all(lp == 0.0 for lp, m in zip(trace.logprobs, trace.loss_mask) if not m)
    return len(runs)


def sampled_runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s: one per model call in a merged trace."""
    runs, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs
