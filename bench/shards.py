"""Shard write and read throughput, against a plain sequential write of the same bytes.

Each record is what the gateway writes for a realistic agent session: 50 model calls, each a
call record as the proxy captures it (3072 prompt ids, 1024 sampled ids with float32 logprobs,
the chat request and reply), turned into 50 traces of 4096 tokens by the real builder
(`build(calls, "per_request")`), as the gateway does before it appends. Write =
`ShardWriter.append` of every record (encoding, CRC, `writev`, periodic fdatasync, background
seals with fsync, rename and index) until `close()` returns. Raw = the bytes those shards hold,
written to one new file with plain sequential `write`s, then sealed the same way (fsync, rename,
fsync of the folder). After one untimed writer pass (which yields the bytes raw writes), writer
and raw alternate over `--rounds` rounds, taking turns at going first; each figure is the median,
and `write_ratio` is the median of the rounds' raw/write ratios (a round's two ran back to back, so
the shared disk's drift between rounds cancels out).
Read = `iter_trajectories` over the shards (checksums, decoding into the traces' arrays). The line
before the JSON gives the builder's and the encoder's own speed (no file) for context.

    uv run python bench/shards.py [--records 100] [--rounds 15] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from polar_hpc.shards import ShardWriter, iter_trajectories
from polar_hpc.shards.format import encode_record
from polar_hpc.trajectory.builders import build
from polar_hpc.trajectory.model import Trajectory
from polar_hpc.wire import CallRecord

CALLS, PROMPT, RESPONSE = 50, 3072, 1024
WORDS = np.array("the model reads a file then runs the tests and edits the function until every check passes".split())
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def make_calls(rng: np.random.Generator, session: str) -> list[CallRecord]:
    """One session's call records as the proxy hands them over (plain lists, as msgpack decodes)."""
    calls = []
    for j in range(CALLS):
        text = " ".join(rng.choice(WORDS, 400))
        request = {"model": "policy", "tools": TOOLS, "messages": [
            {"role": "system", "content": text[:800]}, {"role": "user", "content": text}]}
        reply = {"role": "assistant", "content": text[:1200]}
        calls.append(CallRecord(
            session_id=session, call_index=j, api="openai_chat", request=request,
            response={"choices": [{"message": reply, "finish_reason": "tool_calls"}]},
            prompt_ids=rng.integers(0, 151_000, PROMPT).tolist(),
            output_ids=rng.integers(0, 151_000, RESPONSE).tolist(),
            output_logprobs=(rng.random(RESPONSE, dtype=np.float32) * -3).tolist(),
            finish_reason="tool_calls", weight_version="7", engine_url="http://engine",
            stream=False, t_start=1.7e9 + j, t_end=1.7e9 + j + 0.5,
        ))
    return calls


def make_record(calls: list[CallRecord], i: int) -> Trajectory:
    traces, metadata = build(calls, "per_request")
    return Trajectory(calls[0].session_id, f"task{i}", 0, 0, "completed", 1.0, traces, metadata, 1.7e9, 1.7e9 + 60)


def write_round(folder: Path, records: list[Trajectory]) -> float:
    t0 = time.perf_counter()
    with ShardWriter(folder, "bench", max_bytes=64 << 20, max_age_s=3600) as w:
        for r in records:
            w.append(r)
    return time.perf_counter() - t0


def raw_round(folder: Path, data: bytes) -> float:
    t0 = time.perf_counter()
    fd = os.open(folder / ".raw.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)
    os.close(fd)
    os.rename(folder / ".raw.tmp", folder / "raw.bin")
    dir_fd = os.open(folder, os.O_RDONLY)
    os.fsync(dir_fd)
    os.close(dir_fd)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    records, build_s = [], 0.0
    for i in range(args.records):
        calls = make_calls(rng, f"task{i}#0.0")
        t0 = time.perf_counter()
        records.append(make_record(calls, i))
        build_s += time.perf_counter() - t0
    tokens = sum(r.n_tokens for r in records)
    t0 = time.perf_counter()
    for r in records:
        encode_record(r)
    encode_s = time.perf_counter() - t0
    root = Path(tempfile.mkdtemp(prefix="polar-bench-shards-", dir=args.dir))
    write_s, raw_s, read_s = [], [], []
    try:
        write_round(root / "warmup", records)  # untimed: the bytes raw writes, and a warm start
        shards = sorted((root / "warmup").glob("*.shard"))
        data = b"".join(p.read_bytes() for p in shards)
        shutil.rmtree(root / "warmup")
        for n in range(args.rounds):
            folder = root / f"round{n}"
            if n % 2:  # alternate which goes first
                raw_s.append(raw_round(root, data))
                write_s.append(write_round(folder, records))
            else:
                write_s.append(write_round(folder, records))
                raw_s.append(raw_round(root, data))
            (root / "raw.bin").unlink()
            t0 = time.perf_counter()
            n_read = sum(1 for _ in iter_trajectories(folder))
            read_s.append(time.perf_counter() - t0)
            assert n_read == len(records)
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mb = len(data) / 1e6
    write, raw, read = (statistics.median(s) for s in (write_s, raw_s, read_s))
    figures = {
        "write_MBps": round(mb / write, 1),
        "raw_write_MBps": round(mb / raw, 1),
        "write_ratio": round(statistics.median(r / w for r, w in zip(raw_s, write_s)), 3),
        "read_records_per_s": round(len(records) / read, 1),
        "read_tokens_per_s": round(tokens / read),
    }
    print(f"{len(records)} records, {mb:.0f} MB in {len(shards)} shards, {tokens} tokens; median of {args.rounds} "
          f"rounds; build {mb / build_s:.0f} MB/s, encode {mb / encode_s:.0f} MB/s (no file)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
