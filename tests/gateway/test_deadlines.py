"""A session's deadline fires whatever stage it is in; a harness that cannot launch ends `error` at once."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import polar
from e2e.helpers import trajectories, write_jsonl


TIMEOUT_S = 6  # long enough that a busy machine runs "true" in it, far below the 60 s sleeps


def _task(task_id: str, command: str = "true", **extra) -> dict:
    return {"id": task_id, "instruction": "-", "timeout_s": TIMEOUT_S, "harness": {"command": command}, **extra}


def _run(tmp_path: Path, tasks: list[dict], topology: str) -> dict:
    (tmp_path / "topology.yaml").write_text(topology)
    run_dir = tmp_path / "run"
    result = polar("run", write_jsonl(tmp_path / "tasks.jsonl", tasks), "-c", tmp_path / "topology.yaml",
                   "--run-dir", run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    return {t.task_id: t for t in trajectories(run_dir)}


def test_deadline_fires_in_init_run_and_postrun(tmp_path: Path) -> None:
    once = tmp_path / "once"  # the session's own prepare makes it; the evaluator's fresh sandbox then waits
    fresh = {"kind": "command", "command": "true", "timeout_s": 1, "sandbox": "fresh"}
    tasks = [
        _task("init", sandbox={"prepare": ["sleep 60"]}),
        _task("run", "sleep 60"),
        _task("postrun", sandbox={"prepare": [f"mkdir {once} || sleep 60"]}, evaluator=fresh),
    ]
    by_id = _run(tmp_path, tasks, "sandbox:\n  backend: none\n")  # `once` is shared only without isolation
    for task_id, t in by_id.items():
        assert t.status == "timeout", (task_id, t.metadata)
        assert t.t_end - t.t_start < 45, (task_id, t.t_end - t.t_start)  # its deadline, not its 60 s sleep
    init, run, postrun = by_id["init"], by_id["run"], by_id["postrun"]
    assert set(init.metadata["timings"]) == {"init_s", "postrun_s"} and init.metadata["timings"]["init_s"] >= TIMEOUT_S - 0.5
    assert run.metadata["timings"]["run_s"] >= TIMEOUT_S - 0.5
    assert postrun.metadata["timings"]["run_s"] < TIMEOUT_S - 0.5 and postrun.reward is None
    assert postrun.metadata["error"].startswith("evaluation not finished by the session's deadline")


def test_deadline_fires_while_waiting_in_ready(tmp_path: Path) -> None:
    tasks = [_task("hog", "sleep 20", timeout_s=60), _task("waiter", sandbox={"prepare": ["sleep 1"]})]
    by_id = _run(tmp_path, tasks, "sandbox:\n  backend: none\ngateway:\n  pools:\n    run: 1\n    ready: 1\n")
    assert by_id["hog"].status == "completed"
    waiter = by_id["waiter"]
    assert waiter.status == "timeout", waiter.metadata
    assert set(waiter.metadata["timings"]) == {"init_s", "ready_s", "postrun_s"}, waiter.metadata["timings"]
    assert waiter.t_end < by_id["hog"].t_end, "it must not wait for the RUN slot past its deadline"


def test_launch_failure_ends_at_once_and_a_huge_instruction_still_arrives(tmp_path: Path) -> None:
    huge = "x" * 300_000  # over the kernel's 128 KiB for one argument or environment string
    check = {"kind": "command", "command": 'test "$(cat n.txt)" = "300000 unset"'}
    tasks = [
        _task("e2big", "true", timeout_s=60, harness={"command": "true", "env": {"BIG": huge}}),
        _task("instruction", 'echo "$(wc -c < "$POLAR_INSTRUCTION_FILE") ${POLAR_INSTRUCTION-unset}" > n.txt',
              timeout_s=60, instruction=huge, evaluator=check),
    ]
    by_id = _run(tmp_path, tasks, "{}\n")
    e2big = by_id["e2big"]
    assert e2big.status == "error", e2big.metadata
    assert e2big.metadata["error"] == "cannot launch the command: Argument list too long"
    assert e2big.t_end - e2big.t_start < 15
    instruction = by_id["instruction"]
    assert (instruction.status, instruction.reward) == ("completed", 1.0), instruction.metadata


def test_nul_bytes_and_bad_env_names_are_refused_at_load(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(json.dumps({"id": "t", "instruction": "a\0b", "harness": {
        "command": "true", "env": {"A=B": "1", "OK": "x\0y"}}, "sandbox": {"prepare": ["echo \0"]}}, indent=1))
    run_dir = tmp_path / "run"
    result = polar("run", tasks, "--run-dir", run_dir)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for expected in (f"{tasks}:3: instruction: contains a NUL byte",
                     f"{tasks}:7: harness.env.A=B.[key]: 'A=B' is not an environment variable name",
                     f"{tasks}:8: harness.env.OK: contains a NUL byte",
                     f"{tasks}:13: sandbox.prepare.0: contains a NUL byte"):
        assert expected in result.stderr, result.stderr
    assert not run_dir.exists()
