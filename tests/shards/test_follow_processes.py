"""Writers and followers in separate processes, killed with SIGKILL where it hurts most."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from polar_hpc.shards import Follower, ShardWriter

from shards.helpers import journal, make_trajectory, queued

TESTS = Path(__file__).resolve().parents[1]
N = 8  # samples per task

WRITER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from shards.helpers import attempt, journal, make_trajectory, result
    from polar_hpc.shards import ShardWriter

    run, writer, task, n, mode = Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
    w = ShardWriter(run / "shards", writer, max_bytes=int(sys.argv[7]), max_age_s=float(sys.argv[8]))
    for i in range(n):
        traj = make_trajectory(task, i, n=50)
        if i == 0:
            traj = attempt(traj, 1)  # attempt 0 ran on a gateway declared lost
        name = w.append(traj)
        if mode in ("result-first", "hang"):  # as the gateway does today: Result right after the append
            journal(run, result(traj, name))
        else:  # the journal behind the shard
            w.seal(); w.wait(); time.sleep(0.02); journal(run, result(traj, name))
        w.maybe_roll()
        time.sleep(0.01)
    print("appended", flush=True)
    if mode != "hang":
        w.close()
    else:
        time.sleep(60)
    """
)

FOLLOWER = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    from polar_hpc.shards import Follower

    f = Follower(Path(sys.argv[1]), cursor=Path(sys.argv[2]), poll_s=0.05, idle_timeout_s=30)
    stop_after = int(sys.argv[3])
    for count, t in enumerate(f, 1):
        print(json.dumps([t.task_id, t.sample_index, t.session_id]), flush=True)
        if count == stop_after:
            f.commit()
            os.kill(os.getpid(), signal.SIGKILL)
    print(json.dumps({"complete": f.complete(), "strays": f.stats["strays"]}), flush=True)
    """
)


def _writer(run, writer, task, mode, max_bytes=3000, max_age_s=0.3, n=N):
    args = [str(TESTS), str(run), writer, task, str(n), mode, str(max_bytes), str(max_age_s)]
    return subprocess.Popen([sys.executable, "-c", WRITER, *args], stdout=subprocess.PIPE, text=True)


def _follower(run, cursor, stop_after=-1):
    return subprocess.Popen([sys.executable, "-c", FOLLOWER, str(run), str(cursor), str(stop_after)],
                            stdout=subprocess.PIPE, text=True)


def _lost_gateway_strays(run):
    """Attempt 0 of sample 0 of each task, written by a gateway the orchestrator declared lost."""
    with ShardWriter(run / "shards", "gw-lost", 1 << 20, 60) as w:
        for task in ("a", "b"):
            w.append(make_trajectory(task, 0, n=50))
    journal(run, *({"event": "requeued", "session": f"{t}#0.1", "previous": f"{t}#0.0", "attempt": 1}
                   for t in ("a", "b")))


@pytest.mark.parametrize("restart_after", [None, 5], ids=["straight", "trainer-killed-and-restarted"])
def test_two_writers_and_a_follower(tmp_path, restart_after):
    run, cursor = tmp_path / "run", tmp_path / "trainer" / "cursor.json"
    (run / "shards").mkdir(parents=True)
    follower = _follower(run, cursor, restart_after or -1)  # started before the job: waits for the journal
    time.sleep(0.2)
    journal(run, *(queued(t, i) for t in ("a", "b") for i in range(N)))
    _lost_gateway_strays(run)
    writers = [_writer(run, "gw-a", "a", "result-first"), _writer(run, "gw-b", "b", "seal-first")]
    lines = follower.stdout.read().splitlines()
    assert follower.wait(timeout=60) == (-signal.SIGKILL if restart_after else 0)
    if restart_after:
        assert len(lines) == restart_after
        again = _follower(run, cursor)
        lines += again.stdout.read().splitlines()
        assert again.wait(timeout=60) == 0
    for w in writers:
        assert w.wait(timeout=60) == 0

    *items, end = [json.loads(line) for line in lines]
    assert end["complete"] is True
    assert sorted(map(tuple, items)) == sorted(
        (t, i, f"{t}#{i}.{1 if i == 0 else 0}") for t in ("a", "b") for i in range(N)
    )  # every key once, the attempt the journal accepted, none twice across the restart
    if not restart_after:
        assert end["strays"] == 2


def test_writer_killed_mid_shard(tmp_path):
    """Journaled but unsealed records are invisible until a restarted writer salvages them."""
    run = tmp_path / "run"
    journal(run, *(queued("a", i) for i in range(4)))
    writer = _writer(run, "gw-a", "a", "hang", max_bytes=1 << 20, max_age_s=3600, n=4)
    assert writer.stdout.readline().strip() == "appended"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    follower = Follower(run, poll_s=0.01, idle_timeout_s=0.1)
    assert list(follower) == [] and not follower.complete()
    assert [p.name for p in (run / "shards").iterdir()] == [".gw-a-000001.shard.tmp"]

    ShardWriter(run / "shards", "gw-a", 1 << 20, 60).close()  # the gateway restarts on its node
    follower.idle_timeout_s = 5
    assert sorted(t.sample_index for t in follower) == [0, 1, 2, 3] and follower.complete()
