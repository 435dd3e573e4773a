"""The journal decides which attempt of a (task, sample) counts; readers honour it."""

from __future__ import annotations

import logging

from polar_hpc.shards import Filter, Follower, ShardWriter, iter_trajectories, summarize
from polar_hpc.shards.format import FRAME

from shards.helpers import attempt, journal, queued, result


def _write(run, writer, trajs):
    with ShardWriter(run / "shards", writer, max_bytes=1 << 30, max_age_s=60) as w:
        return [w.append(t) for t in trajs]


def keys(trajs):
    return [(t.task_id, t.sample_index, t.session_id) for t in trajs]


def test_journal_picks_the_attempt_that_counts(tmp_path, make_traj):
    first = make_traj("a", 0, reward=0.0)  # its gateway was declared lost, but it finished anyway
    retry = attempt(make_traj("a", 0, reward=1.0), 1)
    other = make_traj("a", 1)
    (s1,) = set(_write(tmp_path, "gw0", [first, other]))
    (s2,) = set(_write(tmp_path, "gw1", [retry]))
    journal(tmp_path, queued("a", 0), queued("a", 1),
            {"event": "requeued", "session": retry.session_id, "previous": first.session_id, "attempt": 1},
            result(other, s1), result(retry, s2))

    got = keys(iter_trajectories(tmp_path))
    assert got == [("a", 1, "a#1.0"), ("a", 0, "a#0.1")]  # the stray met first is skipped
    assert summarize(tmp_path)["duplicates"] == 1 and summarize(tmp_path)["mean_reward"] == 1.0
    assert len(list(iter_trajectories(tmp_path, unique=False))) == 3
    assert keys(Follower(tmp_path, poll_s=0.01)) == [("a", 1, "a#1.0"), ("a", 0, "a#0.1")]


def test_without_journal_first_copy_wins(tmp_path, make_traj):
    _write(tmp_path, "gw0", [make_traj("a", 0)])
    _write(tmp_path, "gw1", [attempt(make_traj("a", 0), 1)])
    assert keys(iter_trajectories(tmp_path)) == [("a", 0, "a#0.0")]


def test_undecided_records_are_held_until_the_journal_decides(tmp_path, make_traj):
    """The journal behind the shard: nothing handed out twice, nothing lost, across a restart."""
    a0, a0_retry, a1 = make_traj("a", 0), attempt(make_traj("a", 0), 1), make_traj("a", 1)
    (s,) = set(_write(tmp_path, "gw0", [a0, a0_retry, a1]))
    journal(tmp_path, queued("a", 0), queued("a", 1), result(a1, s))
    cursor = tmp_path / "trainer" / "cursor.json"

    first = Follower(tmp_path, cursor=cursor, poll_s=0.01, idle_timeout_s=0.05)
    assert keys(first) == [("a", 1, "a#1.0")]
    assert len(first.undecided) == 2 and not first.complete()

    journal(tmp_path, result(a0_retry, s))  # the retry counts; a0 becomes a stray
    second = Follower(tmp_path, cursor=cursor, poll_s=0.01, idle_timeout_s=5)
    assert keys(second) == [("a", 0, "a#0.1")]
    assert second.complete() and second.stats["strays"] == 1 and not second.undecided


def test_group_by_task_waits_for_every_sample_and_survives_restart(tmp_path, make_traj):
    trajs = [make_traj(task, i, reward=float(i)) for task in ("a", "b") for i in range(3)]
    journal(tmp_path, *(queued(t.task_id, t.sample_index) for t in trajs))
    names = _write(tmp_path, "gw0", trajs[:5])  # a0 a1 a2 b0 b1
    journal(tmp_path, *(result(t, n) for t, n in zip(trajs[:5], names)))
    cursor = tmp_path / "cursor.json"
    kept = Filter(reward=(1.0, None))

    first = Follower(tmp_path, cursor=cursor, group_by_task=True, filter=kept, poll_s=0.01, idle_timeout_s=0.05)
    assert [keys(g) for g in first] == [[("a", 1, "a#1.0"), ("a", 2, "a#2.0")]]  # b is incomplete
    assert first.stats["filtered"] == 2  # a0 and b0
    names = _write(tmp_path, "gw0", trajs[5:])
    journal(tmp_path, result(trajs[5], names[0]))

    second = Follower(tmp_path, cursor=cursor, group_by_task=True, filter=kept, poll_s=0.01, idle_timeout_s=5)
    assert [keys(g) for g in second] == [[("b", 1, "b#1.0"), ("b", 2, "b#2.0")]]  # b1 held across the restart
    assert second.complete() and second.stats["filtered"] == 0


def test_flipped_bit_is_skipped_by_the_follower(tmp_path, make_traj, caplog):
    trajs = [make_traj("a", i) for i in range(3)]
    names = _write(tmp_path, "gw0", trajs)
    journal(tmp_path, *(queued("a", i) for i in range(3)), *(result(t, n) for t, n in zip(trajs, names)))
    shard = tmp_path / "shards" / names[0]
    data = bytearray(shard.read_bytes())
    data[-FRAME.size] ^= 0x01  # inside the last record's payload
    shard.write_bytes(bytes(data))
    follower = Follower(tmp_path, poll_s=0.01)
    with caplog.at_level(logging.WARNING):
        got = [t.sample_index for t in follower]
    assert got == [0, 1] and follower.stats["problems"] == 1 and follower.complete()
    assert f"{shard}: byte offset" in caplog.text and "checksum mismatch" in caplog.text
