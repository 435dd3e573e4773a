"""Shard write and read throughput, against a plain sequential write of the same bytes.

Each record is a realistic agent trajectory: 50 traces of 4096 tokens (3072 prompt, 1024 response
with a loss mask and float32 logprobs) and the chat messages of each trace's last call. Write =
`ShardWriter.append` of every record (encoding, framing, CRC, periodic fdatasync, background
seals with fsync and rename, index) until `close()` returns. Raw = the bytes those shards hold,
written with one `write` and one `fsync` to a new file in the same folder. Read =
`iter_trajectories` over the shards (checksums, decoding to Python lists). Encode = turning the
records into their framed bytes alone (no file): the ceiling of the writer on this CPU, since
packing Python int lists into int32 arrays costs ~15 ns per token. The best of `--rounds`
alternating rounds is kept for each figure. Prints one JSON object as its last line.

    uv run python bench/shards.py [--records 100] [--rounds 2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import tempfile
import time
from pathlib import Path

from polar_hpc.shards import ShardWriter, iter_trajectories
from polar_hpc.shards.format import encode_trajectory, frame
from polar_hpc.trajectory.model import Trace, Trajectory

TRACES, PROMPT, RESPONSE = 50, 3072, 1024
WORDS = "the model reads a file then runs the tests and edits the function until every check passes".split()


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def make_record(rng: random.Random, i: int) -> Trajectory:
    traces = []
    for j in range(TRACES):
        mask = [1 if (k // 64) % 3 else 0 for k in range(RESPONSE)]  # sampled spans, tool output spans
        text = " ".join(rng.choice(WORDS) for _ in range(400))
        traces.append(Trace(
            prompt_ids=[rng.randrange(151_000) for _ in range(PROMPT)],
            response_ids=[rng.randrange(151_000) for _ in range(RESPONSE)],
            loss_mask=mask,
            logprobs=[_f32(-rng.random() * 3) if m else 0.0 for m in mask],
            messages=[{"role": "system", "content": text[:800]}, {"role": "user", "content": text},
                      {"role": "assistant", "content": text[:1200]}],
            tools=[{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
            finish_reason="tool_calls",
            weight_versions=["7"],
            call_indices=[j],
        ))
    return Trajectory(f"task{i}#0.0", f"task{i}", 0, 0, "completed", 1.0, traces,
                      {"builder": "per_request", "calls": TRACES}, 1.7e9, 1.7e9 + 60)


def write_round(folder: Path, records: list[Trajectory]) -> tuple[float, int]:
    t0 = time.perf_counter()
    with ShardWriter(folder, "bench", max_bytes=64 << 20, max_age_s=3600) as w:
        for r in records:
            w.append(r)
    elapsed = time.perf_counter() - t0
    return elapsed, sum(p.stat().st_size for p in folder.glob("*.shard"))


def raw_round(folder: Path, data: bytes) -> float:
    t0 = time.perf_counter()
    fd = os.open(folder / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    rng = random.Random(0)
    records = [make_record(rng, i) for i in range(args.records)]
    tokens = sum(r.n_tokens for r in records)
    root = Path(tempfile.mkdtemp(prefix="polar-bench-shards-", dir=args.dir))
    write_s, raw_s, read_s, encode_s = [], [], [], []
    try:
        for n in range(args.rounds):
            folder = root / f"round{n}"
            folder.mkdir()
            elapsed, size = write_round(folder, records)
            write_s.append(elapsed)
            data = b"".join(p.read_bytes() for p in sorted(folder.glob("*.shard")))
            raw_s.append(raw_round(root, data))
            del data
            (root / "raw.bin").unlink()
            t0 = time.perf_counter()
            n_read = sum(1 for _ in iter_trajectories(folder))
            read_s.append(time.perf_counter() - t0)
            assert n_read == len(records)
            shutil.rmtree(folder)
            t0 = time.perf_counter()
            for r in records:
                frame(encode_trajectory(r))
            encode_s.append(time.perf_counter() - t0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mb = size / 1e6
    figures = {
        "write_MBps": round(mb / min(write_s), 1),
        "raw_write_MBps": round(mb / min(raw_s), 1),
        "write_ratio": round(min(raw_s) / min(write_s), 3),
        "encode_MBps": round(mb / min(encode_s), 1),
        "read_records_per_s": round(len(records) / min(read_s), 1),
        "read_tokens_per_s": round(tokens / min(read_s)),
    }
    print(f"{len(records)} records, {mb:.0f} MB in shards, {tokens} tokens; best of {args.rounds} rounds")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
