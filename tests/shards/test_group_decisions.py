"""A task's decided group (early acceptance, `decided` in the journal): readers take the group and
never a sample of its cancelled tail, whatever its record says, across a follower's restart."""

from __future__ import annotations

from polar_hpc.shards import Follower, ShardWriter, iter_trajectories

from shards.helpers import journal, queued, result


def _write(run, trajs):
    with ShardWriter(run / "shards", "gw0", max_bytes=1 << 30, max_age_s=60) as w:
        return [w.append(t) for t in trajs]


def _cancelled(traj, written: str) -> dict:
    """The tail's result as the orchestrator journals it: cancelled, no shard, whatever it reported."""
    return {**result(traj, ""), "status": "cancelled", "reward": None, "written": written, "reported": traj.status}


def keys(trajs):
    return [(t.task_id, t.sample_index) for t in trajs]


def test_follower_hands_out_the_decided_group_never_its_tail(tmp_path, make_traj):
    a = [make_traj("a", i, reward=float(i)) for i in range(4)]
    a[3] = make_traj("a", 3, status="cancelled", reward=None)
    journal(tmp_path, *(queued("a", i) for i in range(4)))
    names = _write(tmp_path, [a[1], a[0], a[2]])  # a2 finished too, just after the group was decided
    journal(tmp_path, result(a[1], names[0]), result(a[0], names[1]))
    cursor = tmp_path / "cursor.json"

    first = Follower(tmp_path, cursor=cursor, group_by_task=True, poll_s=0.01, idle_timeout_s=0.05)
    assert list(first) == [] and not first.complete()  # 2 of 4 read: the group is open
    assert len(first.groups["a"]) == 2 and len(first.undecided) == 1  # a2: no result yet

    journal(tmp_path, {"event": "decided", "task": "a", "accepted": [0, 1], "cancelled": [2, 3], "reason": "accept"})
    second = Follower(tmp_path, cursor=cursor, group_by_task=True, poll_s=0.01, idle_timeout_s=0.05)
    assert [keys(g) for g in second] == [[("a", 0), ("a", 1)]]  # before the tail's results are in
    assert second.stats["strays"] == 1 and not second.undecided  # a2, a tail's record: never handed out

    (tail,) = _write(tmp_path, [a[3]])  # the cancelled sample's own record
    journal(tmp_path, _cancelled(a[2], names[2]), _cancelled(a[3], tail))
    third = Follower(tmp_path, cursor=cursor, group_by_task=True, poll_s=0.01, idle_timeout_s=5)
    assert list(third) == [] and third.complete() and third.stats["strays"] == 1

    assert keys(iter_trajectories(tmp_path)) == [("a", 1), ("a", 0)]  # the one-shot reader agrees
    fresh = Follower(tmp_path, group_by_task=True, poll_s=0.01, idle_timeout_s=5)
    assert [keys(g) for g in fresh] == [[("a", 0), ("a", 1)]] and fresh.complete()


def test_a_group_decided_by_fraction_is_handed_out_smaller(tmp_path, make_traj):
    a = [make_traj("a", i) for i in range(4)]
    journal(tmp_path, *(queued("a", i) for i in range(4)))
    names = _write(tmp_path, a[:2])
    journal(tmp_path, result(a[0], names[0]), result(a[1], names[1]),
            {"event": "decided", "task": "a", "accepted": [0, 1], "cancelled": [2, 3], "reason": "fraction"},
            _cancelled(a[2], ""), _cancelled(a[3], ""))
    follower = Follower(tmp_path, group_by_task=True, poll_s=0.01, idle_timeout_s=5)
    assert [keys(g) for g in follower] == [[("a", 0), ("a", 1)]] and follower.complete()
