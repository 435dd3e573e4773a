"""A fork bomb and a CPU spinner pool hurt only their own sessions, and a gateway's exit takes every
sandbox process with it (sandbox/cgroups.py, issue 18).

A real gateway (its real proxy, real bwrap sandboxes) driven by a scripted orchestrator in the test:
the gateway's heartbeats to it keep flowing and its proxy link is never lost (peer_timeout_s 5, half
the default) while a bomb and 64 spinners run beside benign sessions; a SIGTERM or a lost proxy
ends the gateway with no process of its sandboxes alive (by the cgroups' procs and by a marker on
the command lines), and so does an exception (with `setsid` daemons of the `none` backend, which only
the cgroup finds); a new gateway of the run removes a SIGKILLed one's cgroups. Each test sweeps
its run's cgroups when it ends, so a failure leaves no bomb behind.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from sandbox.bwrap_required import needs_bwrap
from e2e.helpers import live_processes_matching
from polar_hpc import wire
from polar_hpc.config import Task
from polar_hpc.sandbox import Cgroups, Limits
from polar_hpc.sandbox.cgroups import CGROUP_ROOT, PARENT, run_key

pytestmark = needs_bwrap

BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
SPIN = "import os\nfor _ in range(6):\n    os.fork()\nwhile True:\n    pass\n"  # 64 spinners, within max_pids
HEARTBEAT_S, PEER_TIMEOUT_S = 0.5, 5.0


class _Orchestrator:
    """The orchestrator's side of one gateway: assigns sessions, heartbeats it, records what comes back."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir()
        (run_dir / "topology.yaml").write_text(
            f"gateway:\n  heartbeat_s: {HEARTBEAT_S}\n  peer_timeout_s: {PEER_TIMEOUT_S}\n"
            "  pools:\n    run: 6\n    init: 6\nsandbox:\n  max_pids: 128\n")
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.gateway: bytes | None = None
        self.credits = 0
        self.beats: list[float] = []  # when each of the gateway's heartbeats arrived
        self.results: dict[str, wire.Result] = {}
        self.procs: list[subprocess.Popen] = []

    def start_gateway(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "polar_hpc", "gateway", "--run-dir", str(self.run_dir), "--orchestrator",
             f"tcp://127.0.0.1:{self.port}", "--engine-url", "http://127.0.0.1:9", "--gateway-id", "g0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.procs.append(proc)
        self.gateway, self.beats, self.credits = None, [], 0
        self.pump(lambda: self.credits > 0, 60)  # its proxy is up: sessions may come
        return proc

    def assign(self, task_id: str, command: str, timeout_s: float) -> None:
        task = Task(id=task_id, instruction="-", timeout_s=timeout_s, harness={"command": command})
        spec = wire.SessionSpec(session_id=task_id, task=task.model_dump(mode="json"), sample_index=0,
                                attempt=0, deadline=time.time() + timeout_s)
        self.send(wire.Assign(sessions=[spec]))

    def send(self, msg: wire.Message) -> None:
        self.router.send_multipart([self.gateway, wire.encode(msg)])

    def pump(self, done, timeout_s: float) -> None:
        """Serve the gateway (heartbeats) until `done()` or `timeout_s`."""
        deadline, beat = time.monotonic() + timeout_s, 0.0
        while not done():
            assert time.monotonic() < deadline, f"not done after {timeout_s} s; results {self.results}"
            if self.gateway is not None and time.monotonic() - beat > HEARTBEAT_S:
                self.send(wire.Heartbeat(sender="orchestrator", t=time.time()))
                beat = time.monotonic()
            if not self.router.poll(50):
                continue
            identity, payload = self.router.recv_multipart()
            msg = wire.decode(payload)
            if isinstance(msg, wire.Hello):
                self.gateway = identity
            elif isinstance(msg, wire.Heartbeat):
                self.beats.append(time.monotonic())
            for item in msg.items if isinstance(msg, wire.Report) else ():
                if isinstance(item, wire.Credit):
                    self.credits += item.n
                elif isinstance(item, wire.Result):
                    self.results[item.session_id] = item

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        Cgroups(run_key(self.run_dir)).sweep(live_too=True)
        self.ctx.destroy(linger=0)


@pytest.fixture
def orchestrator(tmp_path: Path):
    probe = Cgroups(f"t{secrets.token_hex(4)}")
    usable = probe.create("probe", Limits()) is not None
    probe.close()
    if not usable:
        pytest.skip("no pids cgroup can be made here (not root, no delegation)")
    orch = _Orchestrator(tmp_path / "run")
    yield orch
    orch.close()


def _run_folders(run_dir: Path) -> list[Path]:
    return [p for p in CGROUP_ROOT.glob(f"*/{PARENT}/{run_key(run_dir)}.*") if p.is_dir()]


def _procs_in(folders: list[Path]) -> set[int]:
    return {int(p) for f in folders for c in f.rglob("cgroup.procs") for p in c.read_text().split()}


@pytest.mark.timeout(300)
def test_bomb_and_spinners_hurt_only_their_own_sessions(orchestrator: _Orchestrator) -> None:
    marker = f"m{secrets.token_hex(4)}"
    gateway = orchestrator.start_gateway()
    orchestrator.assign("bomb", f"python3 -c '{BOMB}' {marker}", 60)
    orchestrator.assign("spin", f"python3 -c '{SPIN}' {marker}", 15)
    for i in range(3):
        orchestrator.assign(f"benign-{i}", f"python3 -c 'print(sum(range(10**6)))' && sleep {2 + 2 * i}", 60)
    orchestrator.pump(lambda: len(orchestrator.results) == 5, 120)
    results = orchestrator.results
    for i in range(3):
        assert results[f"benign-{i}"].status == "completed", (results, gateway.kill(), gateway.stdout.read()[-5000:])
    assert (results["bomb"].status, results["bomb"].error) == (
        "error", "harness killed: process limit reached (max_pids=128)"), results["bomb"]
    assert results["spin"].status == "timeout", results["spin"]
    gaps = [b - a for a, b in zip(orchestrator.beats, orchestrator.beats[1:])]
    assert len(gaps) > 20 and max(gaps) < PEER_TIMEOUT_S, max(gaps)  # never silent long enough to be lost
    assert gateway.poll() is None, "the gateway must not have stopped"
    assert not live_processes_matching(marker)
    orchestrator.send(wire.Shutdown(reason="test over"))
    assert gateway.wait(30) == 0
    out = gateway.stdout.read()
    assert "lost contact" not in out, out
    assert not _run_folders(orchestrator.run_dir)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["sigterm", "proxy-lost"])
def test_gateway_exit_kills_every_sandbox_process(how: str, orchestrator: _Orchestrator) -> None:
    marker = f"m{secrets.token_hex(4)}"
    gateway = orchestrator.start_gateway()
    orchestrator.assign("spin", f"python3 -c '{SPIN}' {marker}", 120)
    orchestrator.pump(lambda: len(_procs_in(_run_folders(orchestrator.run_dir))) >= 64, 60)
    assert len(live_processes_matching(marker)) >= 64
    if how == "sigterm":
        gateway.send_signal(signal.SIGTERM)
    else:  # what a proxy starved of CPU looked like to its gateway
        [proxy] = [int(p) for p in subprocess.run(["pgrep", "-P", str(gateway.pid), "-f", "polar_hpc proxy"],
                                                  capture_output=True, text=True).stdout.split()]
        os.kill(proxy, signal.SIGKILL)
    code = gateway.wait(60)
    out = gateway.stdout.read()
    assert code == (0 if how == "sigterm" else 1), out
    assert not live_processes_matching(marker), out
    assert not _run_folders(orchestrator.run_dir), out


@pytest.mark.timeout(300)
def test_a_new_gateway_of_the_run_removes_a_killed_ones_cgroups(orchestrator: _Orchestrator) -> None:
    first = orchestrator.start_gateway()
    orchestrator.assign("sleep", "sleep 100", 120)
    orchestrator.pump(lambda: _procs_in(_run_folders(orchestrator.run_dir)), 60)
    stale = _run_folders(orchestrator.run_dir)
    [owner] = {f.name for f in stale}
    first.kill()  # SIGKILL: no cleanup of its own
    first.wait()
    assert all(f.is_dir() for f in stale)
    second = orchestrator.start_gateway()
    assert not any(f.is_dir() for f in stale)
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0
    assert f"removed the sandbox cgroups of a dead gateway of this run ({owner})" in second.stdout.read()


RAISES = """
import asyncio, sys
from pathlib import Path
from polar_hpc.gateway import server
from polar_hpc.sandbox.none import NoneSandbox

async def run_then_fail(self):  # a gateway whose run raises while a sandbox has daemons
    sb = NoneSandbox(Path(sys.argv[2]), {}, [], "host", cgroups=self.cgroups)
    await sb.start()
    # each daemon reports once it has left the command's process group, which exec kills at the end
    await sb.exec("mkdir up; for i in 1 2 3 4; do setsid sh -c 'touch up/$0; exec sleep %s' $i & done;"
                  " while [ $(ls up | wc -l) -lt 4 ]; do sleep 0.05; done" % sys.argv[3], {}, 10)
    raise RuntimeError("internal error with a sandbox alive")

server._Gateway.run = run_then_fail
server.serve(server.GatewayOptions(Path(sys.argv[1]), "tcp://127.0.0.1:9", None, "g0"))
"""


@pytest.mark.timeout(300)
def test_an_exception_in_the_gateway_still_kills_its_sandboxes(orchestrator: _Orchestrator, tmp_path: Path) -> None:
    marker = f"4{secrets.randbelow(10**8) + 1000:08d}"  # setsid daemons: out of the command's group
    proc = subprocess.run([sys.executable, "-c", RAISES, str(orchestrator.run_dir), str(tmp_path / "sb"), marker],
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode != 0 and "RuntimeError: internal error with a sandbox alive" in proc.stderr, proc.stderr
    assert re.search(r"killed [1-9]\d* sandbox processes left at exit", proc.stderr), proc.stderr
    assert not live_processes_matching(marker)
    assert not _run_folders(orchestrator.run_dir)
