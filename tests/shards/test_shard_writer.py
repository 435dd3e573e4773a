from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polar_hpc.shards import ShardWriter, index, iter_trajectories, verify
from polar_hpc.shards.format import FRAME
from shards.helpers import record_bytes


def listing(path):
    return sorted(p.name for p in path.iterdir() if p.name != "index")


def indexed(path, writer="gw"):
    return [(e["shard"], e["records"]) for _, e in index.read_entries(index.index_path(path, writer))]


def test_rollover_by_size(tmp_path, make_traj):
    size = len(record_bytes(make_traj()))
    w = ShardWriter(tmp_path, "gw", max_bytes=3 * size, max_age_s=60)
    names = [w.append(make_traj("t", i)) for i in range(7)]
    # header + 3 records passes 3 * size: each shard holds three
    assert names == ["gw-000001.shard"] * 3 + ["gw-000002.shard"] * 3 + ["gw-000003.shard"]
    w.wait()
    assert listing(tmp_path) == [".gw-000003.shard.tmp", "gw-000001.shard", "gw-000002.shard"]
    w.close()
    assert listing(tmp_path) == ["gw-000001.shard", "gw-000002.shard", "gw-000003.shard"]
    assert indexed(tmp_path) == [("gw-000001.shard", 3), ("gw-000002.shard", 3), ("gw-000003.shard", 1)]
    assert [t.sample_index for t in iter_trajectories(tmp_path)] == list(range(7))


def test_rollover_by_age(tmp_path, make_traj):
    """A shard is sealed once it is max_age_s old; the age is set, not slept, so load cannot race it."""
    w = ShardWriter(tmp_path, "gw", max_bytes=1 << 30, max_age_s=3600)
    assert w.append(make_traj("t", 0)) == "gw-000001.shard"
    w.maybe_roll()
    assert listing(tmp_path) == [".gw-000001.shard.tmp"]  # younger than max_age_s
    w.max_age_s = 0  # from now on, every shard is old enough
    w.maybe_roll()
    w.wait()
    assert listing(tmp_path) == ["gw-000001.shard"]
    assert w.append(make_traj("t", 1)) == "gw-000002.shard"
    assert w.append(make_traj("t", 2)) == "gw-000003.shard"  # the append itself rolled the old one
    w.wait()
    assert "gw-000002.shard" in listing(tmp_path)
    w.close()
    w.close()  # idempotent
    assert listing(tmp_path) == ["gw-000001.shard", "gw-000002.shard", "gw-000003.shard"]


def test_close_without_records_writes_nothing(tmp_path):
    ShardWriter(tmp_path, "gw", 1 << 20, 60).close()
    assert listing(tmp_path) == []


def test_new_writer_continues_sequence(tmp_path, make_traj):
    for round_ in range(2):
        with ShardWriter(tmp_path, "gw", 1, 60) as w:  # one trajectory per shard
            w.append(make_traj("t", 2 * round_))
            w.append(make_traj("t", 2 * round_ + 1))
    with ShardWriter(tmp_path, "gw-2", 1, 60) as other:  # a writer id that extends "gw"
        assert other.append(make_traj("u")) == "gw-2-000001.shard"
    with ShardWriter(tmp_path, "gw", 1, 60) as w:
        assert w.append(make_traj("t", 9)) == "gw-000005.shard"
    assert [t.sample_index for t in iter_trajectories(tmp_path) if t.task_id == "t"] == [0, 1, 2, 3, 9]


TESTS = Path(__file__).resolve().parents[1]
CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from shards.helpers import make_trajectory
    from polar_hpc.shards import ShardWriter

    w = ShardWriter(Path(sys.argv[1]), "gw", max_bytes=int(sys.argv[3]), max_age_s=3600)
    names = [w.append(make_trajectory("t", i)) for i in range(8)]
    w.wait()
    print(json.dumps(names), flush=True)
    time.sleep(60)
    """
)


def _run_and_kill(shards, record_size):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(shards), str(TESTS), str(3 * record_size)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        names = json.loads(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return names


def test_killed_writer_leaves_no_partial_shard(tmp_path, make_traj):
    size = len(record_bytes(make_traj()))
    names = _run_and_kill(tmp_path, size)
    assert names == ["gw-000001.shard"] * 3 + ["gw-000002.shard"] * 3 + ["gw-000003.shard"] * 2
    assert listing(tmp_path) == [".gw-000003.shard.tmp", "gw-000001.shard", "gw-000002.shard"]
    assert verify(tmp_path) == []
    assert [t.sample_index for t in iter_trajectories(tmp_path)] == list(range(6))


def test_restarted_writer_salvages_dead_temp(tmp_path, make_traj, caplog):
    size = len(record_bytes(make_traj()))
    _run_and_kill(tmp_path, size)
    temp = tmp_path / ".gw-000003.shard.tmp"
    with open(temp, "ab") as f:  # as if killed in the middle of a write
        f.write(record_bytes(make_traj("t", 99))[: FRAME.size + 10])
    with ShardWriter(tmp_path, "gw", 1 << 20, 60) as w:
        assert listing(tmp_path) == ["gw-000001.shard", "gw-000002.shard", "gw-000003.shard"]
        assert indexed(tmp_path) == [("gw-000001.shard", 3), ("gw-000002.shard", 3), ("gw-000003.shard", 2)]
        assert w.append(make_traj("t", 8)) == "gw-000004.shard"
    assert "dropping the 18 bytes" in caplog.text
    assert verify(tmp_path) == []
    assert [t.sample_index for t in iter_trajectories(tmp_path)] == list(range(9))


def test_restarted_writer_removes_empty_temp(tmp_path, make_traj):
    (tmp_path / ".gw-000004.shard.tmp").write_bytes(b"POLARSH1")  # header never written
    with ShardWriter(tmp_path, "gw", 1 << 20, 60) as w:
        assert listing(tmp_path) == []
        assert w.append(make_traj()) == "gw-000005.shard"


def test_restarted_writer_indexes_what_the_index_lacks(tmp_path, make_traj):
    """Killed between rename and index append, with a torn index line: the next writer repairs it."""
    with ShardWriter(tmp_path, "gw", 1, 60) as w:  # one trajectory per shard
        for i in range(3):
            w.append(make_traj("t", i))
    path = index.index_path(tmp_path, "gw")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[1][:7])
    assert indexed(tmp_path) == [("gw-000001.shard", 1)]
    with ShardWriter(tmp_path, "gw", 1, 60) as w:
        w.append(make_traj("t", 3))
    assert indexed(tmp_path) == [(f"gw-00000{i}.shard", 1) for i in range(1, 5)]


def test_sealing_failure_is_raised_by_the_next_call(tmp_path, make_traj):
    w = ShardWriter(tmp_path, "gw", 1, 60)
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "gw.jsonl").mkdir()  # the index cannot be appended to
    w.append(make_traj("t", 0))
    with pytest.raises(IsADirectoryError):
        w.wait()
    w.close()
