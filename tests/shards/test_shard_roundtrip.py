from __future__ import annotations

import os

import msgspec
import pytest

from polar_hpc.shards import ShardWriter, iter_trajectories, shard_files, verify, writer
from polar_hpc.shards.format import decode_trajectory, encode_record
from polar_hpc.trajectory.model import Trace


def test_round_trip_exact(tmp_path, make_traj):
    originals = [
        make_traj("a", 0),
        make_traj("a", 1, reward=None, status="timeout", n=2000),
        make_traj("b", 0, n=0),
        make_traj("c", 0, n=17000),  # 68,000-byte arrays: msgpack's bin32
    ]
    originals[0].traces.append(
        Trace([5], [6, 7], [1, 1], [float("-inf"), -3.5], [], [], "length", ["v2"], [4],
              [{"max_tokens": 2, "seed": 1}], [{"reasons": ["response_format json_schema"], "by": "json_schema"}])
    )
    with ShardWriter(tmp_path / "run" / "shards", "gw0", max_bytes=1 << 20, max_age_s=60) as w:
        names = {w.append(t) for t in originals}
    assert names == {"gw0-000001.shard"}
    back = list(iter_trajectories(tmp_path / "run"))
    assert back == originals  # every field, ids, masks and float32 logprobs bit for bit
    assert back[1].n_tokens == 4 + 2000
    assert verify(tmp_path / "run") == []


def test_accepts_run_dir_shards_dir_or_file(tmp_path, make_traj):
    with ShardWriter(tmp_path / "shards", "gw0", 1 << 20, 60) as w:
        w.append(make_traj())
    (file,) = shard_files(tmp_path)
    for path in (tmp_path, tmp_path / "shards", file):
        assert [t.task_id for t in iter_trajectories(path)] == ["t1"]
    with pytest.raises(FileNotFoundError):
        shard_files(tmp_path / "nope")


def test_unencodable_trajectory_leaves_shard_untouched(tmp_path, make_traj):
    with pytest.raises(OverflowError):
        Trace([2**31], [], [], [], [], [], "stop", [], [])  # outside int32
    with pytest.raises(AttributeError):  # frozen: a packed field is always its array
        make_traj().traces[0].response_ids = [1, 2]
    bad = make_traj()
    bad.metadata["handle"] = object()  # nothing msgpack can hold
    with ShardWriter(tmp_path, "gw0", 1 << 20, 60) as w:
        with pytest.raises(TypeError, match="cannot encode object in a shard record"):
            w.append(bad)
        assert list(tmp_path.iterdir()) == []
        w.append(make_traj())
    assert len(list(iter_trajectories(tmp_path))) == 1


def test_short_writes_are_resumed_mid_buffer(tmp_path, make_traj, monkeypatch):
    """A writev that takes only part of what it is given (as the OS may) is continued exactly."""
    real = os.writev

    def short(fd, buffers):  # hand over at most 1001 bytes, cutting a buffer in the middle
        return real(fd, [b"".join(buffers[:8])[:1001]])

    monkeypatch.setattr(writer.os, "writev", short)
    trajs = [make_traj("a", 0, n=700), make_traj("b", 0)]
    with ShardWriter(tmp_path, "gw0", 1 << 20, 60) as w:
        for t in trajs:
            w.append(t)
    assert list(iter_trajectories(tmp_path)) == trajs


def test_a_trace_written_before_sampling_and_constrained_existed_reads_with_them_empty(make_traj):
    record = msgspec.msgpack.decode(encode_record(make_traj("a", 0))[1])
    for trace in record["traces"]:
        del trace["sampling"], trace["constrained"]
    back = decode_trajectory(msgspec.msgpack.encode(record))
    assert [(t.sampling, t.constrained) for t in back.traces] == [([], [])] * len(back.traces)


def test_per_token_versions_round_trip_and_older_traces_read_each_calls_version_over_its_tokens(make_traj):
    old = make_traj("a", 0, n=6)  # mask 0 1 1 0 1 1, calls v0 then v1, no token_versions (as older shards)
    record = msgspec.msgpack.decode(encode_record(old)[1])
    del record["traces"][0]["token_versions"]
    (trace,) = decode_trajectory(msgspec.msgpack.encode(record)).traces
    assert trace.token_versions == [] and trace.versions() == ["", "v0", "v0", "", "v1", "v1"]
    spanning = msgspec.structs.replace(old.traces[0], token_versions=["", "v0", "v0", "", "v1", "v2"])
    traj = msgspec.structs.replace(old, traces=[spanning])
    (back,) = decode_trajectory(encode_record(traj)[1]).traces
    assert back.token_versions == back.versions() == ["", "v0", "v0", "", "v1", "v2"]
    with pytest.raises(ValueError, match="6 response ids, 5 token versions"):
        msgspec.structs.replace(old.traces[0], token_versions=["v0"] * 5)
