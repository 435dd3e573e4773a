"""docs/shards.md describes the bytes the writer produces: checked with a reader written from it."""

from __future__ import annotations

import re
import struct
import sys
import types
import zlib
from pathlib import Path

import msgspec

from polar_hpc.shards import ShardWriter

DOC = Path(__file__).resolve().parents[2] / "docs" / "shards.md"


def _section_keys(title: str) -> set[str]:
    """Keys in the first column of the table under the heading `title`."""
    text = DOC.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)`", text, flags=re.M))


def _independent_read(path: Path) -> list:
    data = path.read_bytes()
    assert data[:8] == b"POLARSH1"
    pos, payloads = 8, []
    while pos < len(data):
        length, crc = struct.unpack("<II", data[pos : pos + 8])
        payload = data[pos + 8 : pos + 8 + length]
        assert len(payload) == length and zlib.crc32(payload) == crc
        payloads.append(msgspec.msgpack.decode(payload))  # untyped: plain maps, lists, bytes
        pos += 8 + length
    assert pos == len(data)
    return payloads


def test_layout_matches_doc(tmp_path, make_traj):
    traj = make_traj("a", 3, n=5)
    with ShardWriter(tmp_path, "gw7", 1 << 20, 60) as w:
        w.append(traj)
    header, record = _independent_read(tmp_path / "gw7-000001.shard")

    header_keys = _section_keys("Header payload")
    assert set(header) == header_keys == {"format", "writer", "seq", "created"}
    assert header["format"] == 1 and header["writer"] == "gw7" and header["seq"] == 1
    assert isinstance(header["created"], float)

    trace_table = DOC.read_text().split("Each trace is a msgpack map:", 1)[1].split("\n## ", 1)[0]
    trace_keys = set(re.findall(r"^\| `(\w+)`", trace_table, flags=re.M))
    trajectory_keys = _section_keys("Trajectory payload") - trace_keys
    assert set(record) == trajectory_keys
    (trace,) = record["traces"]
    assert set(trace) == trace_keys

    expected = traj.traces[0]
    for key in ("prompt_ids", "response_ids", "loss_mask"):
        raw = trace[key]
        assert isinstance(raw, bytes) and len(raw) == 4 * len(getattr(expected, key))
        assert list(struct.unpack(f"<{len(raw) // 4}i", raw)) == getattr(expected, key).tolist()
    raw = trace["logprobs"]
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == expected.logprobs.tolist()
    assert record["task_id"] == "a" and record["sample_index"] == 3 and record["reward"] == 1.0
    assert record["metadata"] == traj.metadata and trace["call_indices"] == [0, 1]


def test_doc_example_reader_runs(tmp_path, make_traj, monkeypatch):
    """The doc's sample reader (with msgspec standing in for `msgpack`) reads a real shard."""
    code = DOC.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setitem(sys.modules, "msgpack", types.SimpleNamespace(unpackb=msgspec.msgpack.decode))
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    trajs = [make_traj("a", 0), make_traj("a", 1, n=3)]
    with ShardWriter(tmp_path, "gw", 1 << 20, 60) as w:
        for t in trajs:
            w.append(t)
    header, records = namespace["read_shard"](tmp_path / "gw-000001.shard")
    assert header["writer"] == "gw" and len(records) == 2
    for got, want in zip(records, trajs):
        tr, exp = got["traces"][0], want.traces[0]
        assert tr["prompt_ids"] == exp.prompt_ids.tolist() and tr["response_ids"] == exp.response_ids.tolist()
        assert tr["loss_mask"] == exp.loss_mask.tolist() and tr["logprobs"] == exp.logprobs.tolist()
