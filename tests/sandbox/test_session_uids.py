"""Sessions cannot read each other's secrets, nor can other host processes (issue 33, item 5).

The audit's attack: with every harness of a root gateway on host uid 65534, a process of that uid
read a live session's /proc/PID/environ and took its proxy token. Here a real `polar-hpc run` (root
gateway, real bwrap) runs two sessions of `token_thief.py` at once; while both are up, the test
plays the attack from the host as 65534, as the other session's uid and as a free uid of
`sandbox.uid_range` against every process of each session (and, as the control that shows the
attack still works where it should, as the session's own uid); then each harness scans /proc for
the other's token. After the run both uids are free again (their locks can be taken, no process
runs as them).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bwrap_required import needs_bwrap
from polar_hpc.config import UID_RANGE
from polar_hpc.sandbox.uids import LOCK_DIR
from polar_hpc.shards.reader import iter_trajectories

HERE = Path(__file__).parent
pytestmark = needs_bwrap
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the gateway must run as root")


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)


def _uid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _harnesses() -> dict[str, int]:
    """token -> pid of each running thief that said it is up (its `ready` file)."""
    found = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        env = _environ(int(name))
        if env.get("OPENAI_API_KEY") and (Path(env.get("HOME", "/nonexistent")) / "ready").exists() \
                and b"token_thief.py" in Path(f"/proc/{name}/cmdline").read_bytes():
            found[env["OPENAI_API_KEY"]] = int(name)
    return found


def _read_as(uid: int, pids: list[int]) -> str:
    """What a host process of `uid` (no groups, no capability) reads of these processes' environments."""
    script = " ".join(f"cat /proc/{p}/environ;" for p in pids)
    r = subprocess.run(["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "--inh-caps", "-all",
                        "--", "/bin/sh", "-c", script + " true"], capture_output=True, text=True)
    return r.stdout


@as_root
def test_no_session_nor_host_uid_reads_a_live_sessions_token(tmp_path: Path) -> None:
    task = {"id": "thief", "instruction": "-", "num_samples": 2, "timeout_s": 300,
            "sandbox": {"network": "proxy-only", "files": {"token_thief.py": "token_thief.py"}},
            "harness": {"command": "python3 token_thief.py"}}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    shutil.copy(HERE / "token_thief.py", tmp_path)
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "polar_hpc", "run", str(tmp_path / "tasks.jsonl"), "--run-dir",
                                 str(run_dir)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while len(live := _harnesses()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        uids = {token: _uid(pid) for token, pid in live.items()}
        first, last = UID_RANGE
        assert len(set(uids.values())) == 2 and all(u is not None and first <= u <= last for u in uids.values()), uids
        free = next(u for u in range(first, last + 1) if u not in uids.values())
        for token, pid in live.items():
            own = uids[token]
            assert own is not None
            other = next(u for t, u in uids.items() if t != token)
            assert other is not None
            pids = [int(p) for p in filter(str.isdigit, os.listdir("/proc")) if _uid(int(p)) == own]
            assert pid in pids
            assert token in _read_as(own, pids)  # the control: its own uid reads it, so the attack below can succeed
            for attacker in (65534, other, free):
                assert token not in _read_as(attacker, pids), f"uid {attacker} read the token of a session of uid {own}"
        for pid in live.values():
            (Path(_environ(pid)["HOME"]) / "go").touch()
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:]
    reports = [json.loads(t.metadata["stderr_tail"].strip().splitlines()[-1]) for t in iter_trajectories(run_dir)]
    assert sorted(r["uid"] for r in reports) == sorted(uids.values()), reports
    for r in reports:  # its own PID namespace: it sees (and reads) its own processes only, none of the other's
        assert r["foreign"] == [] and 0 < r["readable"] <= r["seen"] < 10, r
    for uid in uids.values():  # free again: no process of it, its lock can be taken
        assert uid is not None and not any(_uid(int(p)) == uid for p in filter(str.isdigit, os.listdir("/proc")))
        fd = os.open(LOCK_DIR / str(uid), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


@pytest.mark.parametrize("user", ["root-gateway", "user-gateway"])
def test_a_sandbox_sees_no_process_of_another(tmp_path: Path, user: str) -> None:
    """Whoever the gateway is (one that is not root runs every session as its own uid), a command's
    /proc lists only its own processes: another live sandbox's token is out of its reach. The
    user gateway is a real unprivileged user (uid 4242 here), whose sandboxes are user namespaces
    (measured: without the PID namespace the thief lists every host process, yet still reads none
    of the victim's environment, which lives in a sibling user namespace)."""
    if user == "user-gateway" and os.geteuid() != 0:
        pytest.skip("played as another user by a root test")
    token = f"victim-{os.getpid()}-{time.monotonic_ns()}"
    folder = Path(tempfile.mkdtemp(prefix="polar-beside-", dir="/var/tmp"))
    python, env = [sys.executable], os.environ | {"HOME": str(folder)}
    if user == "user-gateway":  # the user's own interpreter and PATH (ours may be under /root), our modules
        system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
        if not os.access(system, os.X_OK):
            pytest.skip(f"{system} (this Python's version, for another user) is missing")
        python = ["setpriv", "--reuid", "4242", "--regid", "4242", "--clear-groups", "--", system]
        env |= {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(p for p in sys.path if os.path.isdir(p))}
        os.chown(folder, 4242, 4242)
    try:
        r = subprocess.run([*python, str(HERE / "beside_probe.py"), str(folder), token],
                           capture_output=True, text=True, timeout=300, env=env, cwd=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(r.stdout)
    assert f"OPENAI_API_KEY={token}" in found["on_host"]  # the control: its gateway's user reads it from the host
    assert "OPENAI_API_KEY=thief-own" in found["stolen"], found  # the thief's scan works: it reads its own
    assert token not in found["stolen"] and found["stopped"], found
