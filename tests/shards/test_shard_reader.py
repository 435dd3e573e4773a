from __future__ import annotations

import logging

from polar_hpc.shards import ShardWriter, iter_trajectories, rows, summarize, verify
from polar_hpc.shards.format import FRAME, MAGIC, frame
from shards.helpers import record_bytes


def _write(run, writer, trajs, per_shard=2):
    with ShardWriter(run / "shards", writer, max_bytes=1 << 30, max_age_s=60) as w:
        for i, t in enumerate(trajs):
            w.append(t)
            if (i + 1) % per_shard == 0:
                w.seal()


def _offsets(path):
    """Byte offset of each record (header first)."""
    data = path.read_bytes()
    pos, out = len(MAGIC), []
    while pos < len(data):
        out.append(pos)
        pos += FRAME.size + FRAME.unpack_from(data, pos)[0]
    return out


def test_flipped_byte_is_named_and_skipped(tmp_path, make_traj, caplog):
    _write(tmp_path, "a", [make_traj("a", i) for i in range(4)])
    _write(tmp_path, "b", [make_traj("b", i) for i in range(3)])
    damaged = tmp_path / "shards" / "a-000001.shard"
    second = _offsets(damaged)[2]
    data = bytearray(damaged.read_bytes())
    data[second + FRAME.size + 20] ^= 0x40
    damaged.write_bytes(bytes(data))

    size = len(data)
    assert verify(tmp_path) == [
        f"{damaged}: byte offset {second}: checksum mismatch ({size - second} bytes skipped)"
    ]
    assert verify(tmp_path / "shards" / "b-000001.shard") == []
    with caplog.at_level(logging.WARNING):
        got = [(t.task_id, t.sample_index) for t in iter_trajectories(tmp_path)]
    assert got == [("a", 0), ("a", 2), ("a", 3), ("b", 0), ("b", 1), ("b", 2)]
    assert f"{size - second} bytes skipped" in caplog.text and "a-000001.shard" in caplog.text


def test_truncated_and_foreign_files(tmp_path, make_traj):
    _write(tmp_path, "a", [make_traj("a", i) for i in range(2)])
    shard = tmp_path / "shards" / "a-000001.shard"
    last = _offsets(shard)[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[:-5])
    (tmp_path / "shards" / "junk.shard").write_bytes(b"hello world")
    (tmp_path / "shards" / ".a-000002.shard.tmp").write_bytes(b"partial")  # hidden: never read
    problems = verify(tmp_path)
    assert problems == [
        f"{shard}: byte offset {last}: truncated record: length {len(data) - last - FRAME.size} "
        f"but {len(data) - last - FRAME.size - 5} bytes left ({len(data) - 5 - last} bytes skipped)",
        f"{tmp_path / 'shards' / 'junk.shard'}: byte offset 0: not a polar shard (bad magic) "
        "(11 bytes skipped)",
        f"{tmp_path / 'shards' / 'junk.shard'}: not named <writer>-<seq>.shard: in no index, and no follower reads it",
    ]
    assert [t.sample_index for t in iter_trajectories(tmp_path)] == [0]


def test_good_checksum_bad_payload_is_a_problem(tmp_path, make_traj):
    _write(tmp_path, "a", [make_traj("a", 0)])
    shard = tmp_path / "shards" / "a-000001.shard"
    end = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"".join(frame(b"\x93\x01\x02\x03")))  # valid msgpack, not a trajectory
        f.write(record_bytes(make_traj("a", 1)))
    (problem,) = verify(shard)
    assert problem == f"{shard}: byte offset {end}: bad trajectory record: Expected `object`, got `array` (12 bytes skipped)"
    assert [t.sample_index for t in iter_trajectories(shard)] == [0, 1]  # the bad record alone is skipped


def test_summarize_rows_and_duplicates(tmp_path, make_traj):
    trajs = [
        make_traj("a", 0, reward=1.0),
        make_traj("a", 1, reward=0.0),
        make_traj("b", 0, status="timeout", reward=None),
        make_traj("b", 1, status="error", reward=None),
        make_traj("c", 0, reward=0.5, n=10),
    ]
    _write(tmp_path, "gw0", trajs, per_shard=2)
    retry = make_traj("a", 1, reward=1.0)
    retry.attempt = 1
    _write(tmp_path, "gw1", [retry])
    summary = summarize(tmp_path)
    assert summary == {
        "shards": 4,
        "trajectories": 5,
        "by_status": {"completed": 3, "error": 1, "timeout": 1},
        "rewarded": 3,
        "mean_reward": 0.5,
        "tokens": 4 * (4 + 6) + (4 + 10),
        "duplicates": 1,
        "problems": [],
    }
    listed = list(rows(tmp_path))
    keys = [(r["task_id"], r["sample_index"]) for r in listed]
    assert keys == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0)]
    assert listed[4] == {
        "task_id": "c", "sample_index": 0, "status": "completed", "reward": 0.5,
        "traces": 1, "tokens": 14, "session_id": "c#0.0",
    }
    assert len(list(iter_trajectories(tmp_path, unique=False))) == 6


def test_summarize_empty_run(tmp_path):
    summary = summarize(tmp_path)
    assert summary["shards"] == 0 and summary["trajectories"] == 0 and summary["mean_reward"] is None
