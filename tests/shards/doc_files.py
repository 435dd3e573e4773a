"""Run directories built from docs/shards.md alone (msgpack, zlib.crc32, struct, json), never with
polar_hpc's writer: what another implementation following the doc could leave on disk."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import msgpack

MAGIC = b"POLARSH1"


def frame(payload: bytes) -> bytes:
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def trace(n: int = 3, **extra) -> dict:
    return {
        "prompt_ids": struct.pack("<3i", 1, 2, 2**31 - 1),
        "response_ids": struct.pack(f"<{n}i", *range(10, 10 + n)),
        "loss_mask": struct.pack(f"<{n}i", *([1] * n)),
        "logprobs": struct.pack(f"<{n}f", *([-0.5] * n)),
        "messages": [{"role": "assistant", "content": "ok"}],
        "tools": [],
        "finish_reason": "stop",
        "weight_versions": ["v1"],
        "call_indices": [0],
        **extra,
    }


def trajectory(task: str, sample: int, attempt: int = 0, **extra) -> dict:
    return {
        "session_id": f"{task}#{sample}.{attempt}",
        "task_id": task,
        "sample_index": sample,
        "attempt": attempt,
        "status": "completed",
        "reward": 1.0,
        "traces": [trace()],
        "metadata": {},
        "t_start": 1.0,
        "t_end": 2.0,
        **extra,
    }


def shard_bytes(writer: str, seq: int, records: list, header: dict | None = None) -> bytes:
    """A shard file: `records` are maps (packed here) or ready payload bytes."""
    head = header if header is not None else {"format": 1, "writer": writer, "seq": seq, "created": 1.0}
    payloads = [r if isinstance(r, bytes) else msgpack.packb(r) for r in [head, *records]]
    return MAGIC + b"".join(frame(p) for p in payloads)


def write_shard(run: Path, writer: str, seq: int, records: list, indexed: bool = True) -> str:
    """Seal one shard in `run/shards` (and list it in its writer's index); its name."""
    name = f"{writer}-{seq:06d}.shard"
    folder = run / "shards"
    (folder / "index").mkdir(parents=True, exist_ok=True)
    data = shard_bytes(writer, seq, records)
    (folder / name).write_bytes(data)
    if indexed:
        entry = {"seq": seq, "shard": name, "records": len(records), "bytes": len(data), "t": 1.0}
        append_line(folder / "index" / f"{writer}.jsonl", json.dumps(entry))
    return name


def append_line(path: Path, line: str, newline: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line + ("\n" if newline else ""))


def journal(run: Path, *events: dict) -> None:
    for e in events:
        append_line(run / "journal" / "orchestrator.jsonl", json.dumps(e))


def queued(task: str, sample: int) -> dict:
    return {"event": "queued", "session": f"{task}#{sample}.0", "task": task, "sample": sample, "attempt": 0}


def result(task: str, sample: int, shard: str, attempt: int = 0) -> dict:
    return {"event": "result", "session": f"{task}#{sample}.{attempt}", "task": task, "sample": sample,
            "attempt": attempt, "status": "completed", "reward": 1.0, "shard": shard}


def offsets(path: Path) -> list[int]:
    """The byte offset of each record of a shard, header first."""
    data, pos, out = path.read_bytes(), len(MAGIC), []
    while pos < len(data):
        out.append(pos)
        pos += 8 + struct.unpack_from("<I", data, pos)[0]
    return out
