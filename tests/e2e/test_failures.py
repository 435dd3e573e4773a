"""Sessions that go wrong stay contained: the others complete and nothing captured is lost."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import polar
from e2e.helpers import live_processes_matching, trajectories, write_jsonl

CALCULATOR = Path(__file__).resolve().parents[2] / "examples" / "calculator"

WRONG_KEY = (
    "import os, urllib.request, urllib.error\n"
    "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=b'{}',\n"
    "    headers={'Authorization': 'Bearer not-a-session', 'Content-Type': 'application/json'})\n"
    "try:\n    urllib.request.urlopen(req); code = 200\n"
    "except urllib.error.HTTPError as e:\n    code = e.code\n"
    "open('reward.txt', 'w').write('1.0' if code == 401 else '0.0')\n"
)


def _task(task_id: str, command: str, **extra) -> dict:
    return {"id": task_id, "instruction": "What is 2 + 3?", "harness": {"command": command}, **extra}


def test_crash_timeout_and_wrong_key_are_contained(tmp_path: Path) -> None:
    (tmp_path / "wrong_key.py").write_text(WRONG_KEY)
    shutil.copy(CALCULATOR / "agent.py", tmp_path)  # sandbox files come from the task file's folder
    marker = f"98{os.getpid() % 10000:04d}1"
    tasks = [
        _task("crash", "python -c \"import sys; sys.stderr.write('boom-marker\\\\n'); sys.exit(3)\""),
        _task("forever", f"sleep {marker} & sleep {marker}", timeout_s=3),
        _task("wrong-key", "python wrong_key.py", sandbox={"files": {"wrong_key.py": "wrong_key.py"}},
              evaluator={"kind": "reward_file", "path": "reward.txt"}),
        _task("good", "python agent.py", num_samples=2, sandbox={"files": {"agent.py": "agent.py"}},
              evaluator={"kind": "regex", "pattern": "\\b5\\b"}),
    ]
    run_dir = tmp_path / "run"
    result = polar("run", write_jsonl(tmp_path / "tasks.jsonl", tasks), "--run-dir", run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    by_id = {(t.task_id, t.sample_index): t for t in trajectories(run_dir)}
    assert set(by_id) == {("crash", 0), ("forever", 0), ("wrong-key", 0), ("good", 0), ("good", 1)}

    crash = by_id[("crash", 0)]
    assert crash.status == "error"
    assert "boom-marker" in crash.metadata["stderr_tail"] and crash.metadata["exit_code"] == 3

    forever = by_id[("forever", 0)]
    assert forever.status == "timeout"
    assert 2.5 <= forever.t_end - forever.t_start < 60  # its deadline, not its sleep of days
    assert live_processes_matching(marker) == [], "the timed-out harness's process tree must be gone"

    assert by_id[("wrong-key", 0)].reward == 1.0, "a wrong API key must get 401"
    assert all(by_id[("good", i)].status == "completed" and by_id[("good", i)].reward == 1.0 for i in (0, 1))


def test_ctrl_c_stops_every_process_and_keeps_what_was_captured(tmp_path: Path) -> None:
    marker = f"97{os.getpid() % 10000:04d}3"
    run_dir = tmp_path / "run"
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [_task("slow", f"sleep {marker}", num_samples=3)])
    proc = subprocess.Popen([sys.executable, "-m", "polar_hpc", "run", str(tasks), "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 180
    while len(live_processes_matching(marker, "sleep")) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)  # the 3 harnesses themselves (bwrap and its launchers carry the marker too)
    assert len(live_processes_matching(marker, "sleep")) == 3, "sessions never started running"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    assert live_processes_matching(marker) == []
    assert live_processes_matching(str(run_dir)) == [], "no polar-hpc process may outlive `run`"
    statuses = sorted(t.status for t in trajectories(run_dir))
    assert statuses == ["cancelled"] * 3, statuses


def test_summary_names_the_first_error(tmp_path: Path) -> None:
    tasks = write_jsonl(tmp_path / "t.jsonl", [_task("crash", "echo 'no module named foo' >&2; exit 5")])
    result = polar("run", tasks, "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "1 written: 1 error" in result.stdout
    assert "crash#0: harness exited with code 5: no module named foo" in " ".join(result.stdout.split())


@pytest.mark.skipif(shutil.which("apptainer") is not None, reason="apptainer is installed here")
def test_a_process_that_dies_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text("sandbox:\n  backend: apptainer\n")  # not installed here: the gateway cannot start
    run_dir = tmp_path / "run"
    result = polar("run", CALCULATOR / "task.yaml", "-c", topo, "--run-dir", run_dir)
    assert result.returncode == 1
    assert "error: gateway exited with code 2" in result.stderr
    assert "sandbox.backend is 'apptainer' but `apptainer` is not on PATH" in result.stderr
    assert "Traceback" not in result.stderr
    assert live_processes_matching(str(run_dir)) == [], "the engine and orchestrator are stopped too"
