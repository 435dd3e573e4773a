"""`polar-hpc shards ls|verify|export|follow` as a user runs them (a real subprocess)."""

from __future__ import annotations

import json
import time

from conftest import polar
from polar_hpc.shards import ShardWriter

from shards.helpers import journal, queued, result


def _run(tmp_path, make_traj, n=3):
    trajs = [make_traj("a", i, reward=float(i)) for i in range(n)]
    with ShardWriter(tmp_path / "shards", "gw0", 1, 60) as w:  # one trajectory per shard
        names = [w.append(t) for t in trajs]
    journal(tmp_path, *(queued("a", i) for i in range(n)), *(result(t, s) for t, s in zip(trajs, names)))
    return names


def test_ls_and_follow(tmp_path, make_traj):
    names = _run(tmp_path, make_traj)
    listed = [json.loads(line) for line in polar("shards", "ls", tmp_path, "--json").stdout.splitlines()]
    assert [(r["shard"], r["records"], r["indexed"]) for r in listed] == [(n, 1, True) for n in names]
    table = polar("shards", "ls", tmp_path)
    assert table.returncode == 0 and "gw0-000002.shard" in table.stdout

    cursor = tmp_path / "cursor.json"
    first = polar("shards", "follow", tmp_path, "--json", "--cursor", cursor, "--reward", "1:")
    assert first.returncode == 0, first.stderr
    assert [json.loads(line)["sample_index"] for line in first.stdout.splitlines()] == [1, 2]
    assert "run complete: 2 trajectories" in first.stderr and "1 filtered out" in first.stderr
    again = polar("shards", "follow", tmp_path, "--json", "--cursor", cursor)
    assert again.returncode == 0 and again.stdout == ""


def test_verify_names_file_and_offset(tmp_path, make_traj):
    names = _run(tmp_path, make_traj)
    assert polar("shards", "verify", tmp_path).returncode == 0
    shard = tmp_path / "shards" / names[1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x10
    shard.write_bytes(bytes(data))
    journal(tmp_path, queued("z", 0), result(make_traj("z", 0), "gw9-000001.shard"))
    checked = polar("shards", "verify", tmp_path)
    assert checked.returncode == 1
    damaged, missing_a1, missing_z = checked.stdout.splitlines()
    assert damaged.startswith(f"{shard}: byte offset ") and "checksum mismatch" in damaged
    assert "task 'a' sample 1: session a#1.0" in missing_a1
    assert "task 'z' sample 0" in missing_z and "gw9-000001.shard" in missing_z
    assert "FAILED: 3 shards, 2 records, 3 problems" in checked.stderr


def test_bad_input_exits_2_without_traceback(tmp_path, make_traj):
    for args in (("ls", tmp_path / "nope"), ("verify", tmp_path), ("follow", tmp_path / "nope"),
                 ("export", tmp_path, "-o", tmp_path / "x")):
        got = polar("shards", *args)
        assert got.returncode == 2 and "Traceback" not in got.stderr, args
        assert "not a run directory" in got.stderr or "no such run directory" in got.stderr
    _run(tmp_path, make_traj)
    got = polar("shards", "export", tmp_path, "-o", tmp_path / "x.csv", "--format", "csv")
    assert got.returncode == 2 and "export format 'csv'" in got.stderr and not (tmp_path / "x.csv").exists()
    got = polar("shards", "export", tmp_path, "-o", tmp_path / "x.jsonl", "--reward", "high")
    assert got.returncode == 2 and "--reward 'high': expected LO:HI" in got.stderr
    other = tmp_path / "other"
    (other / "shards").mkdir(parents=True)
    journal(other, queued("x", 0))
    assert polar("shards", "follow", other, "--cursor", tmp_path / "c.json", "--idle-timeout", "0").returncode == 0
    got = polar("shards", "follow", tmp_path, "--cursor", tmp_path / "c.json")
    assert got.returncode == 2 and "this cursor follows another run" in got.stderr
    (tmp_path / "cursor.json").write_text("{not json")
    got = polar("shards", "follow", tmp_path, "--cursor", tmp_path / "cursor.json")
    assert got.returncode == 2 and f"{tmp_path / 'cursor.json'}: not a readable shard cursor" in got.stderr


def test_follow_interrupted_keeps_its_place(tmp_path, make_traj):
    import signal
    import subprocess
    import sys

    _run(tmp_path, make_traj, n=2)
    journal(tmp_path, queued("a", 2))  # never finishes: follow waits
    cursor = tmp_path / "cursor.json"
    proc = subprocess.Popen([sys.executable, "-m", "polar_hpc", "shards", "follow", str(tmp_path), "--json",
                             "--cursor", str(cursor)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert json.loads(proc.stdout.readline())["sample_index"] == 0
    assert json.loads(proc.stdout.readline())["sample_index"] == 1
    deadline = time.monotonic() + 30
    def committed():
        return json.loads(cursor.read_text())["writers"]["gw0"]["seq"] if cursor.exists() else 0

    while committed() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the second one is committed once the follower asks for more
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted: 2 trajectories" in err and "Traceback" not in err
    again = polar("shards", "follow", tmp_path, "--json", "--cursor", cursor, "--idle-timeout", "0.5")
    assert again.returncode == 0 and again.stdout == "" and "stopped (idle)" in again.stderr
