"""Files a harness leaves behind, and task files too big to copy, never wedge or fool the gateway."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conftest import polar
from e2e.helpers import live_processes_matching, trajectories, write_jsonl
from polar_hpc.shards.reader import iter_trajectories

SECRET = "0.0123456789"  # a float, so a followed link would score the session with it


def _task(task_id: str, command: str, **extra) -> dict:
    return {"id": task_id, "instruction": "-", "timeout_s": 60, "harness": {"command": command},
            "evaluator": {"kind": "reward_file", "path": "reward.txt"}, **extra}


def test_hostile_reward_files_and_an_oversized_upload(tmp_path: Path) -> None:
    host = tmp_path / "host"  # outside the run directory, readable by the gateway
    host.mkdir()
    (host / "reward.txt").write_text(SECRET)
    tasks_dir = tmp_path / "tasks"
    (tasks_dir / "data").mkdir(parents=True)
    with open(tasks_dir / "data" / "big.bin", "wb") as f:
        f.truncate(64 << 20)  # sparse here; 64 MiB once copied
    tasks = [
        _task("fifo", "mkfifo reward.txt"),
        _task("link", f"ln -s {host / 'reward.txt'} reward.txt"),
        _task("parent", f"ln -s {host} out", evaluator={"kind": "reward_file", "path": "out/reward.txt"}),
        _task("huge", "truncate -s 900M reward.txt"),
        _task("bigdir", "echo 1 > reward.txt", sandbox={"files": {"data": "data"}}),
        _task("good", "echo 0.5 > reward.txt", num_samples=2),
    ]
    topo = tmp_path / "topology.yaml"
    topo.write_text("sandbox:\n  max_disk_bytes: 16777216\n")  # 16 MiB
    run_dir = tmp_path / "run"
    result = polar("run", write_jsonl(tasks_dir / "tasks.jsonl", tasks), "-c", topo, "--run-dir", run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    by_id = {(t.task_id, t.sample_index): t for t in trajectories(run_dir)}
    assert len(by_id) == 7
    expected = {"fifo": "reward.txt: not a regular file (a FIFO)",
                "link": "reward.txt: a symbolic link (not followed)",
                "parent": "/out: a symbolic link (not followed)",
                "huge": "larger than 4096 bytes"}
    for task_id, detail in expected.items():
        t = by_id[(task_id, 0)]
        assert t.status == "completed" and t.reward is None, (task_id, t.metadata)
        assert detail in t.metadata["evaluation"], (task_id, t.metadata["evaluation"])
    bigdir = by_id[("bigdir", 0)]
    assert bigdir.status == "error" and bigdir.reward is None
    assert "over the disk limit (max_disk_bytes=16777216)" in bigdir.metadata["error"], bigdir.metadata
    assert all(by_id[("good", i)].reward == 0.5 for i in (0, 1))
    shards = run_dir / "shards"
    written = [p for p in shards.rglob("*") if p.is_file()]
    assert written and not [p.name for p in written if p.name.endswith(".tmp")], "every shard is sealed"
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), f"{path.name} holds the host file's content"


def test_sigterm_stops_the_gateway_during_a_long_copy(tmp_path: Path) -> None:
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    with open(tasks_dir / "big.bin", "wb") as f:
        f.truncate(3 << 30)  # sparse: minutes to copy on a slow disk, within the 4 GiB default limit
    tasks = write_jsonl(tasks_dir / "tasks.jsonl", [_task("big", "true", sandbox={"files": {"big.bin": "big.bin"}})])
    node = Path(tempfile.mkdtemp(prefix="gwf-", dir="/tmp"))  # short: ipc socket paths live here
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "polar_hpc", "run", str(tasks), "--run-dir", str(run_dir)],
                            env=os.environ | {"TMPDIR": str(node)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        copies = []
        while time.monotonic() < deadline and not any(p.stat().st_size > (1 << 20) for p in copies):
            time.sleep(0.1)
            copies = list(node.glob("polar-local0-*/*/work/big.bin"))
        assert copies, "the copy never started"
        [gateway] = [p for p in live_processes_matching(str(run_dir)) if " gateway --run-dir" in _cmdline(p)]
        os.kill(gateway, signal.SIGTERM)
        t0 = time.monotonic()
        while gateway in live_processes_matching(str(run_dir)) and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        stopped = time.monotonic() - t0
        assert stopped < 30, f"the gateway took {stopped:.1f}s to honour SIGTERM (Slurm's default KillWait)"
        assert not list(node.glob("polar-local0-*/*/work")), "the session's files are removed"
        out, _ = proc.communicate(timeout=60)
        assert "Traceback" not in out, out
        written = [(t.session_id, t.status) for t in iter_trajectories(run_dir, unique=False)]
        assert written == [("big#0.0", "cancelled")], written  # what it had, as cancelled; no new session taken
    finally:
        proc.kill()
        shutil.rmtree(node, ignore_errors=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
