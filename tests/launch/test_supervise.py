"""The one supervisor (launch/supervise.py) of `polar-hpc run` and the Slurm driver, on real
processes: restarts with backoff then gives up, no restart where none is allowed (a local run),
stop waits for the members that end by themselves and ends the rest; and neither caller starts or
watches a process around it."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

import polar_hpc.launch
from polar_hpc import procs
from polar_hpc.errors import ChildFailed
from polar_hpc.launch.supervise import Supervisor


def _sh(name: str, script: str, log: Path):
    return lambda: procs.spawn_command(name, ["sh", "-c", script], log)


def _until(sup: Supervisor, what: str, timeout_s: float = 60.0) -> None:
    """Poll the supervisor until `what` has given up (each poll reaps and restarts what is due)."""
    deadline = time.monotonic() + timeout_s
    while not sup.given_up(what):
        assert time.monotonic() < deadline, f"{what} not given up after {timeout_s}s"
        sup.poll()
        time.sleep(0.02)


def test_a_member_is_restarted_with_backoff_then_given_up(tmp_path: Path) -> None:
    said: list[str] = []
    sup = Supervisor(said.append)
    starts = tmp_path / "starts"
    sup.add("gateway-n1", _sh("gateway-n1", f"echo start >> {starts}; echo 'no sandbox' >&2; exit 3",
                              tmp_path / "gw.log"), restarts=2)
    sup.add("engine-n0", _sh("engine-n0", "exec sleep 600", tmp_path / "engine.log"), restarts=2)
    _until(sup, "gateway")
    assert said == ["gateway-n1 exited with code 3; restart 1 in 1s", "gateway-n1 exited with code 3; restart 2 in 2s",
                    "gateway-n1 exited with code 3; not restarted (2 restarts used)"]
    assert starts.read_text().split() == ["start"] * 3
    assert not sup.given_up("engine")  # still running
    with pytest.raises(ChildFailed, match=r"gateway-n1 exited with code 3 \(log .*gw.log\):\n(no sandbox\n){2}no sandbox"):
        sup.check()
    sup.stop(grace_s=5)
    assert sup.members[1].child is not None and sup.members[1].child.proc.returncode == -15


def test_no_restart_where_none_is_allowed(tmp_path: Path) -> None:
    """A local run's policy: the first exit ends the run, with the child's log."""
    said: list[str] = []
    sup = Supervisor(said.append)
    sup.add("gateway", _sh("gateway", "echo 'apptainer is not on PATH' >&2; exit 2", tmp_path / "gw.log"))
    _until(sup, "gateway")
    assert said == ["gateway exited with code 2"]
    with pytest.raises(ChildFailed, match="gateway exited with code 2 .*\napptainer is not on PATH"):
        sup.check()


def test_stop_waits_for_what_ends_by_itself_and_ends_the_rest(tmp_path: Path) -> None:
    go = tmp_path / "go"
    sup = Supervisor(print)
    # the orchestrator ends by itself (here once the engine has started); the engine never does
    sup.add("orchestrator", _sh("orchestrator", f"while [ ! -e {go} ]; do sleep 0.2; done; exit 7", tmp_path / "o.log"))
    sup.add("engine", _sh("engine", f"touch {go}; exec sleep 600", tmp_path / "e.log"), ends_itself=False)
    sup.stop(grace_s=5, wait_s=60)
    codes = [m.child.proc.returncode for m in sup.members if m.child is not None]
    assert codes == [7, -15]


def test_a_member_done_on_success_is_not_restarted_after_exit_0(tmp_path: Path) -> None:
    """A grow job's gateway let go by its orchestrator (exit 0) stays down; a failure is still restarted."""
    said: list[str] = []
    sup = Supervisor(said.append)
    sup.add("gateway-a", _sh("gateway-a", "exit 0", tmp_path / "a.log"), restarts=2, done_on_success=True)
    sup.add("gateway-b", _sh("gateway-b", "exit 4", tmp_path / "b.log"), restarts=1, done_on_success=True)
    _until(sup, "gateway-b")
    assert said.count("gateway-a exited with code 0: done") == 1
    assert "gateway-b exited with code 4; restart 1 in 1s" in said
    assert sup.finished("gateway") and not sup.finished("gateway-b") and not sup.given_up("gateway-a")
    with pytest.raises(ChildFailed, match="gateway-b exited with code 4"):
        sup.check()
    sup.stop(grace_s=5)


def _calls_outside_add(module: Path) -> list[str]:
    """Process starts (procs.spawn*) and exit checks (.poll(), .check()) not made through the supervisor."""
    tree = ast.parse(module.read_text())
    inside_add = {id(n) for call in ast.walk(tree) if isinstance(call, ast.Call)
                  and isinstance(call.func, ast.Attribute) and call.func.attr == "add"
                  for arg in call.args for n in ast.walk(arg)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inside_add and (
                node.attr in ("spawn", "spawn_command") or node.attr == "poll" and ast.unparse(node.value).endswith("proc")
                or node.attr == "check" and ast.unparse(node.value) != "sup"):
            found.append(f"{module.name}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("name", ["local.py", "driver.py", "member.py"])
def test_both_launchers_start_and_watch_processes_only_through_the_supervisor(name: str) -> None:
    assert _calls_outside_add(Path(polar_hpc.launch.__file__).parent / name) == []
