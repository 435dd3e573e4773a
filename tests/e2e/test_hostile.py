"""A run where some sessions attack while others work (issue 18 item 7).

One `polar-hpc run`, one gateway: benign calculator sessions beside sessions whose harness sends a
body over the proxy's limit and a big one under it, makes its reward file a FIFO or a symlink to a
host secret, scans loopback and sends garbage to every open port (ZeroMQ and the engine's HTTP
routes included, with network host: the widest mode), fork-bombs, spins 64 processes on the CPU,
and fills /dev/shm. Every benign session completes with its reward and token-exact trajectory;
every hostile one ends with a status of its own, no host secret reaches the shards, and no process
of a sandbox outlives the run (its cgroups are swept when the test ends, pass or fail).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest

from conftest import polar
from e2e.helpers import check_fidelity, engine_samples, live_processes_matching, trajectories, write_jsonl
from polar_hpc.sandbox import Cgroups
from polar_hpc.sandbox.cgroups import CGROUP_ROOT, PARENT, run_key

CALCULATOR = Path(__file__).resolve().parents[2] / "examples" / "calculator"

POST = """
import json, os, sys, urllib.request, urllib.error
def post(body, path='/chat/completions'):
    req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + path, data=body, headers={
        'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
"""

BIG_BODIES = POST + """
def chat(n):
    return json.dumps({'model': 'm', 'max_tokens': 8,
                       'messages': [{'role': 'user', 'content': 'x' * n}]}).encode()
over, under = post(chat(40 << 20)), post(chat(6 << 20))
print('over', over, 'under', under)
sys.exit(0 if over == 413 and under in (200, 400) else 1)
"""

SCAN = """
import socket, sys
opened = []
for port in range(32768, 61000):
    s = socket.socket(); s.settimeout(0.05)
    try:
        s.connect(('127.0.0.1', port)); opened.append(port)
    except OSError:
        pass
    finally:
        s.close()
answers = {}
for port in opened:
    for payload in (b'\\xff' + b'\\x00' * 8 + b'\\x7f\\x03\\x00NULL' + b'\\x00' * 48 + b'\\x01\\x03abc' * 3,
                    b'POST /pause_generation HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 2\\r\\n\\r\\n{}',
                    b'POST /generate HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 2\\r\\n\\r\\n{}'):
        s = socket.socket(); s.settimeout(1)
        try:
            s.connect(('127.0.0.1', port)); s.sendall(payload); answers[port] = s.recv(200)
        except OSError:
            pass
        finally:
            s.close()
generated = [p for p, a in answers.items() if a.startswith(b'HTTP/1.1 200')]
print('open', len(opened), 'http 200 from', generated, file=sys.stderr)
sys.exit(1 if generated else 0)
"""


BOMB = "import os\nwhile True:\n  try: os.fork()\n  except OSError: pass"
SPIN = "import os\nfor _ in range(6): os.fork()\nwhile True: pass"  # 64 spinners, within max_pids


def _task(task_id: str, command: str, files: dict | None = None, **extra) -> dict:
    return {"id": task_id, "instruction": "What is 17 * 23 + 4?", "timeout_s": 60,
            "harness": {"command": command}, "sandbox": {"files": files or {}, **extra.pop("sandbox", {})},
            **extra}


@pytest.mark.timeout(300)
def test_hostile_sessions_hurt_only_themselves(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET-7d1e")
    secret.chmod(0o600)
    for name, text in {"big.py": BIG_BODIES, "scan.py": SCAN}.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "agent.py").write_bytes((CALCULATOR / "agent.py").read_bytes())
    marker = f"bomb-{secrets.token_hex(4)}"
    reward_file = {"kind": "reward_file", "path": "reward.txt"}
    tasks = [
        _task("benign", "python agent.py", {"agent.py": "agent.py"}, num_samples=3,
              evaluator={"kind": "regex", "pattern": "\\b395\\b"}),
        _task("big-bodies", "python big.py", {"big.py": "big.py"}),
        _task("fifo-reward", "mkfifo reward.txt", evaluator=reward_file),
        _task("symlink-reward", f"ln -s {secret} reward.txt", evaluator=reward_file),
        _task("scan", "python scan.py", {"scan.py": "scan.py"}, sandbox={"network": "host"},
              timeout_s=150),  # 1 s per payload to each open port: a shared host has dozens open
        _task("fork-bomb", f"python -c '{BOMB}' {marker}", timeout_s=20),
        _task("spinners", f"python -c '{SPIN}' {marker}", timeout_s=20),
        _task("dev-shm", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=2048"),
        _task("huge-instruction", "test $(wc -c < \"$POLAR_INSTRUCTION_FILE\") -ge 204800",
              instruction="y" * (200 << 10)),
    ]
    run_dir, topology = tmp_path / "run", tmp_path / "topology.yaml"
    topology.write_text("engine:\n  sample_log: true\n")
    t0 = time.monotonic()
    try:
        result = polar("run", write_jsonl(tmp_path / "tasks.jsonl", tasks), "-c", topology, "--run-dir", run_dir,
                       timeout=280)
        survivors = live_processes_matching(marker)
        cgroups = [p for p in CGROUP_ROOT.glob(f"*/{PARENT}/{run_key(run_dir)}.*") if p.is_dir()]
    finally:
        Cgroups(run_key(run_dir)).sweep(live_too=True)
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out
    by_id = {(t.task_id, t.sample_index): t for t in trajectories(run_dir)}
    assert {k[0] for k in by_id} == {t["id"] for t in tasks}, out

    samples = engine_samples(run_dir)
    for i in range(3):
        benign = by_id[("benign", i)]
        assert benign.status == "completed" and benign.reward == 1.0, benign.metadata
        assert sum(check_fidelity(t, samples) for t in benign.traces) >= 2

    assert by_id[("big-bodies", 0)].status == "completed", by_id[("big-bodies", 0)].metadata
    assert by_id[("scan", 0)].status == "completed", by_id[("scan", 0)].metadata
    fifo = by_id[("fifo-reward", 0)]
    assert fifo.reward is None and fifo.metadata["evaluation"], fifo.metadata
    assert by_id[("symlink-reward", 0)].reward is None
    bomb = by_id[("fork-bomb", 0)]
    # the pids cgroup ends it at once (a bomb with no pids bound would run to its deadline: `timeout`)
    assert (bomb.status, bomb.metadata.get("error")) == ("error", "harness killed: process limit reached (max_pids=512)"), \
        bomb.metadata
    assert by_id[("spinners", 0)].status == "timeout", by_id[("spinners", 0)].metadata
    assert survivors == [] and cgroups == [], (survivors, cgroups)
    assert by_id[("dev-shm", 0)].status == "error"
    assert by_id[("huge-instruction", 0)].status == "completed", by_id[("huge-instruction", 0)].metadata
    for shard in (run_dir / "shards").rglob("*"):
        if shard.is_file():
            assert b"HOST-SECRET" not in shard.read_bytes(), shard
    assert not list((run_dir / "shards").rglob("*.tmp"))
    assert time.monotonic() - t0 < 240
