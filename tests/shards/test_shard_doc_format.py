"""docs/shards.md describes the bytes the writer produces: checked with a reader written from it."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import msgpack
import msgspec

from polar_hpc.shards import ShardWriter, iter_trajectories, verify

from shards import doc_files

DOC = Path(__file__).resolve().parents[2] / "docs" / "shards.md"


def _section_keys(title: str) -> list[str]:
    """Keys in the first column of the table under the heading `title`, in order."""
    text = DOC.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+)`", text, flags=re.M)


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
    assert list(header) == header_keys == ["format", "writer", "seq", "created"]
    assert header["format"] == 1 and header["writer"] == "gw7" and header["seq"] == 1
    assert isinstance(header["created"], float)

    trace_table = DOC.read_text().split("Each trace is a msgpack map:", 1)[1].split("\n## ", 1)[0]
    trace_keys = re.findall(r"^\| `(\w+)`", trace_table, flags=re.M)
    trajectory_keys = [k for k in _section_keys("Trajectory payload") if k not in trace_keys]
    assert list(record) == trajectory_keys  # the doc: the reference writer uses the tables' order
    (trace,) = record["traces"]
    assert list(trace) == trace_keys and trace_keys[:4] == ["prompt_ids", "response_ids", "loss_mask", "logprobs"]

    expected = traj.traces[0]
    for key in ("prompt_ids", "response_ids", "loss_mask"):
        raw = trace[key]
        assert isinstance(raw, bytes) and len(raw) == 4 * len(getattr(expected, key))
        assert list(struct.unpack(f"<{len(raw) // 4}i", raw)) == getattr(expected, key).tolist()
    raw = trace["logprobs"]
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == expected.logprobs.tolist()
    assert record["task_id"] == "a" and record["sample_index"] == 3 and record["reward"] == 1.0
    assert record["metadata"] == traj.metadata and trace["call_indices"] == [0, 1]


def _doc_reader():
    """The doc's sample reader, as printed (it imports the real `msgpack`)."""
    code = DOC.read_text().split("## A reader in a few lines", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace["read_shard"]


def test_doc_example_reader_reads_our_writer(tmp_path, make_traj):
    trajs = [make_traj("a", 0), make_traj("a", 1, n=3)]
    with ShardWriter(tmp_path, "gw", 1 << 20, 60) as w:
        for t in trajs:
            w.append(t)
    header, records, problems = _doc_reader()(tmp_path / "gw-000001.shard")
    assert header["writer"] == "gw" and len(records) == 2 and problems == []
    for got, want in zip(records, trajs):
        tr, exp = got["traces"][0], want.traces[0]
        assert tr["prompt_ids"] == exp.prompt_ids.tolist() and tr["response_ids"] == exp.response_ids.tolist()
        assert tr["loss_mask"] == exp.loss_mask.tolist() and tr["logprobs"] == exp.logprobs.tolist()


def test_doc_example_reader_survives_odd_files(tmp_path):
    """Trailing bytes, a damaged header, an empty file, a framed record that is not a trajectory,
    unknown keys: the doc's reader reports and goes on, as the reference reader does."""
    read_shard = _doc_reader()
    good = [doc_files.trajectory("a", 0, future=1), doc_files.trajectory("a", 1)]
    data = doc_files.shard_bytes("gw", 1, good)
    cases = {
        "trailing": data + b"\x07\x00\x00",
        "empty": b"",
        "foreign": b"hello world",
        "header crc": data[:20] + bytes([data[20] ^ 1]) + data[21:],
        "not a header": doc_files.shard_bytes("gw", 1, good, header={"writer": "gw"}),
        "format 2": doc_files.shard_bytes("gw", 1, good, header={"format": 2}),
        "bad record": doc_files.shard_bytes("gw", 1, [good[0], msgpack.packb([1]), b"\xc1",
                                                      msgpack.packb(doc_files.trajectory("a", 9, traces=[{}])), good[1]]),
        "cut record": data[:-3],
    }
    got = {}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        header, records, problems = read_shard(tmp_path / name)
        got[name] = (header is not None, [t["sample_index"] for t in records], len(problems))
        assert all(p.startswith(str(tmp_path / name)) for p in problems)
    assert got == {
        "trailing": (True, [0, 1], 1), "empty": (False, [], 1), "foreign": (False, [], 1),
        "header crc": (False, [], 2), "not a header": (False, [], 1), "format 2": (False, [], 1),
        "bad record": (True, [0, 1], 3), "cut record": (True, [0], 1),
    }
    assert read_shard(tmp_path / "trailing")[1][0]["traces"][0]["response_ids"] == [10, 11, 12]
    for name in cases:  # the reference reader agrees on what is readable
        assert [t.sample_index for t in iter_trajectories(tmp_path / name)] == got[name][1], name
        assert len(verify(tmp_path / name)) == got[name][2] - (name == "header crc"), name
