"""The escape suite: what a harness in a bwrap sandbox must not be able to do (docs/sandbox.md,
"Threat model", names the test for each line).

The first tests run real bwrap sandboxes directly (network `none`; the proxy is played by a small
HTTP server on a host loopback port that also serves the listener a sandbox hands it over its
relay socket, proxy/relay.py). The last runs `escape_probe.py` as the
harness through the real path (`polar-hpc run --service`, tasks submitted as a trainer would), once
per network mode, next to a /dev/shm flood, a fork bomb and ordinary sessions that must complete.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from aiohttp import web

from e2e.helpers import live_processes_matching
from bwrap_required import REQUIRED, needs_bwrap
from polar_hpc import wire
from polar_hpc.client import Client
from polar_hpc.config import UID_RANGE
from polar_hpc.proxy import relay
from polar_hpc.sandbox import Limits, SandboxError, bwrap
from polar_hpc.sandbox import launcher as compiled
from polar_hpc.sandbox.bwrap import BwrapSandbox
from polar_hpc.sandbox.inside import RELAY_TOKEN
from polar_hpc.shards.reader import iter_trajectories

pytestmark = needs_bwrap

PY = sys.executable


def _run(coro):
    return asyncio.run(coro)


class _Proxy:
    """An HTTP server on 127.0.0.1:PORT and on the listener handed over with TOKEN; GET / answers 'proxy-ok'."""

    TOKEN = "session-token"

    def __init__(self, folder: Path) -> None:
        self.socket = folder / "proxy.sock"
        self.listeners: list[relay.Listener] = []

    async def __aenter__(self):
        app = web.Application()
        async def hello(_request):
            return web.Response(text="proxy-ok")

        app.router.add_get("/", hello)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = self.runner.addresses[0][1]
        self.handoffs = relay.Handoffs(self.socket, self._take)
        return self

    def _take(self, token: str, sock) -> str | None:
        if token != self.TOKEN:
            return "unknown or closed session"
        loop = asyncio.get_running_loop()
        server = self.runner.server
        assert server is not None
        self.listeners.append(relay.Listener(sock, lambda conn: loop.create_task(loop.connect_accepted_socket(server, conn))))
        return None

    async def __aexit__(self, *exc):
        self.handoffs.close()
        for listener in self.listeners:
            listener.close()
        await self.runner.cleanup()


def _box(root: Path, proxy_socket: Path | None = None, hidden: tuple[Path, ...] = (), **limits) -> BwrapSandbox:
    return BwrapSandbox(root, {}, [], "none", proxy_socket=proxy_socket, limits=Limits(**limits), hidden=hidden)


@pytest.fixture(params=["compiled", "host-tools", "inside.py"])
def launcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every launcher a bwrap command on the host's root can have: the compiled one (launcher.c),
    and without it (no `cc`; POLAR_SANDBOX_LAUNCHER=fallback) the host's prlimit/setpriv/env
    (Python only to relay), or inside.py for all of it (a host whose tools are missing or too old)."""
    if request.param == "compiled":
        if compiled.path() is None and not REQUIRED:  # CI (.ci/run installs cc) fails instead
            pytest.skip("no `cc` here to build the compiled launcher")
        return request.param
    monkeypatch.setenv(compiled.FORCE, "fallback")
    if request.param == "inside.py":
        monkeypatch.setattr(bwrap, "host_tools", lambda: None)
    elif bwrap.host_tools() is None:
        pytest.skip("prlimit, setpriv or env is missing or too old here")
    return request.param


@pytest.mark.parametrize("privileged", [True, False], ids=["root-gateway", "user-namespace"])
def test_a_command_line_holds_no_value_and_python_only_where_needed(tmp_path: Path, privileged: bool, launcher: str) -> None:
    """Values travel in the environment (its owner's alone), never in a command line (anyone's);
    Python runs for no command under the compiled launcher, only to relay under the host's tools,
    for all under inside.py; the relay's handoff comes after the drop."""
    (tmp_path / "proxy.sock").touch()
    plain, relayed = _box(tmp_path / "a"), _box(tmp_path / "b", proxy_socket=tmp_path / "proxy.sock")
    for sb in (plain, relayed):
        sb.privileged = privileged and os.geteuid() == 0
    secret = {"LD_PRELOAD": "/x.so", "OPENAI_API_KEY": "session-token", "POLAR_SANDBOX_ID": "m"}
    argv, env = plain._process("true", secret)
    chain = argv[argv.index("--", argv.index("bwrap")) + 1:]
    assert (PY in chain) == (launcher == "inside.py"), chain
    assert bool({"--reuid", "--user"} & set(chain)) == plain.privileged, chain
    assert "LD_PRELOAD" not in env and env["POLAR_ENV_OPENAI_API_KEY"] == "session-token"
    assert not any("/x.so" in a or "session-token" in a for a in argv), argv
    argv, _ = relayed._process("true", {"POLAR_SANDBOX_ID": "m"})
    assert "--relay" not in argv, argv  # a command without the session's token hands nothing over
    argv, env = relayed._process("true", {"POLAR_SANDBOX_ID": "m", RELAY_TOKEN: "session-token"})
    assert env[RELAY_TOKEN] == "session-token" and not any("session-token" in a for a in argv), argv
    assert not any(k.startswith("POLAR_ENV_") and "RELAY" in k for k in env), env  # the launcher's, not the command's
    chain = argv[argv.index("--", argv.index("bwrap")) + 1:]
    assert (PY in chain) == (launcher != "compiled"), chain
    start = chain.index("--relay")
    assert chain[start + 1] == f"47111={relayed.proxy_socket_inside}", chain
    assert start > max((chain.index(a) for a in ("--reuid", "--user") if a in chain), default=-1), chain  # after the drop


def test_every_variable_name_reaches_the_command(tmp_path: Path, launcher: str) -> None:
    """Names a shell can restore and names it cannot (the host tools' launcher then sends the
    command through inside.py) reach the command with their values; a name with `=` is refused."""
    sb = _box(tmp_path / "sb")
    restorable = {"A": "it's \"$HOME\"\n`x`", "EMPTY": "", "PATH": "/usr/bin:/bin:/nowhere"}
    unusual = restorable | {"BASH_ENV": "/nope", "POLAR_ENV_D": "kept"}

    async def names_and_values():
        await sb.start()
        with pytest.raises(SandboxError, match="cannot launch the command"):
            await sb.exec("true", {"A=B": "1"}, 5)
        shown = [await sb.exec("env", env, 5) for env in (restorable, unusual)]
        assert await sb.stop()
        return shown

    for env, out in zip((restorable, unusual), _run(names_and_values())):
        lines = set(out.stdout.decode().split("\n"))
        assert all(f"{k}={v}".split("\n")[0] in lines for k, v in env.items()), out
        assert {line.split("=")[0] for line in lines if line.startswith("POLAR_ENV_")} <= {"POLAR_ENV_D"}, out


def test_the_command_sees_the_same_shell_under_either_launcher(tmp_path: Path, launcher: str) -> None:
    """The host tools' launcher runs the command's text in the shell that restores its variables,
    on the same line: $0, the arguments, the variables and the line numbers are those of
    `/bin/sh -c TEXT`, as under inside.py, and the file size bound is a hard one."""

    async def go():
        sb = _box(tmp_path / "sb", max_file_bytes=1 << 20)
        await sb.start()
        try:
            return [await sb.exec('echo "$0|$#|${POLAR_ENV_A-none}|$A|$(ulimit -H -f)"', {"A": "it's"}, 10),
                    await sb.exec("true\nno_such_command_x", {}, 10)]
        finally:
            assert await sb.stop()

    shell, broken = _run(go())
    assert shell.stdout == b"/bin/sh|0|none|it's|2048\n", shell  # 512-byte blocks
    assert broken.returncode == 127 and b"/bin/sh: 2: no_such_command_x: not found" in broken.stderr, broken


CONNECT = """
import socket, sys
for host, port in [(a.split(':')[0], int(a.split(':')[1])) for a in sys.argv[1:]]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print(host, port, 'connected')
    except OSError as e:
        print(host, port, 'failed', type(e).__name__)
"""


def test_network_none_reaches_the_proxy_and_nothing_else(tmp_path: Path, launcher: str) -> None:
    (tmp_path / "connect.py").write_text(CONNECT)

    async def go():
        async with _Proxy(tmp_path) as proxy:
            sb = _box(tmp_path / "sb", proxy.socket)
            await sb.start()
            await sb.upload(tmp_path / "connect.py", "connect.py")
            url = sb.proxy_url(f"http://127.0.0.1:{proxy.port}")
            get = f"{PY} -c \"import urllib.request; print(urllib.request.urlopen('{url}/').read().decode())\""
            via_proxy = await sb.exec(get + "; echo ${POLAR_RELAY_TOKEN-not-shown}", {}, 30, token=proxy.TOKEN)
            refused = await sb.exec(get, {}, 30, token="another-token")
            probes = await sb.exec(f"{PY} connect.py 127.0.0.1:{proxy.port} 127.0.0.1:47111 1.1.1.1:80 "
                                   "151.101.0.223:443", {}, 30)  # no token: no listener either
            assert await sb.stop()
            return url, via_proxy, refused, probes

    url, via_proxy, refused, probes = _run(go())
    assert url == "http://127.0.0.1:47111"
    assert via_proxy.stdout == b"proxy-ok\nnot-shown\n", via_proxy.stderr
    assert refused.returncode == 126 and refused.stdout == b"", refused
    said = b"launcher" if launcher == "compiled" else b"inside.py"
    assert refused.stderr == said + b": the proxy did not take this sandbox's listener: refused: unknown or closed session\n"
    lines = probes.stdout.decode().splitlines()
    assert len(lines) == 4 and all(" failed " in line for line in lines), probes.stdout + probes.stderr


@pytest.mark.parametrize("base", ["/tmp", "/var/tmp"])
def test_other_sessions_and_host_paths(base: str) -> None:
    parent = Path(tempfile.mkdtemp(prefix="polar-escape-", dir=base))
    other = parent / "other"
    (other / "work").mkdir(parents=True)
    (other / "work" / "secret.txt").write_text("secret")
    run_dir = Path(tempfile.mkdtemp(prefix="polar-run-", dir=base))
    (run_dir / "rendezvous.json").write_text("keys")
    host_tmp = Path("/tmp") / f"polar-host-{os.getpid()}"
    host_tmp.write_text("host")

    async def go():
        sb = _box(parent / "mine", hidden=(run_dir,))
        await sb.start()
        (sb.tmp / "own.txt").write_text("own")
        peek = await sb.exec(f"cat {other}/work/secret.txt {run_dir}/rendezvous.json; ls {parent}", {}, 10)
        writes = await sb.exec(
            f"for p in /usr/polar-x /etc/polar-x {Path.home()}/polar-x; do"
            f" touch $p 2>/dev/null && echo WROTE $p; done; touch {parent}/polar-x; true", {}, 10)
        wipe = await sb.exec("rm -rf /tmp/* /tmp/.[!.]* 2>/dev/null; ls -A /tmp | grep -v polar", {}, 10)
        # what stays: the read-only folders holding the interpreter or PATH, when they live under /tmp
        assert await sb.stop()
        return peek, writes, wipe

    try:
        peek, writes, wipe = _run(go())
        assert b"secret" not in peek.stdout and b"other" not in peek.stdout and b"keys" not in peek.stdout, peek
        assert writes.stdout == b""
        assert not any(Path(p).exists() for p in ["/usr/polar-x", "/etc/polar-x", parent / "polar-x"])
        assert not (Path.home() / "polar-x").exists()
        left = {Path(p).parts[2] for p in bwrap.shown_dirs() if Path(p).is_relative_to("/tmp")}
        assert set(wipe.stdout.decode().split()) <= left  # its own /tmp is empty...
        assert host_tmp.read_text() == "host"  # ...the host's is untouched
        assert (other / "work" / "secret.txt").read_text() == "secret"
    finally:
        host_tmp.unlink()
        shutil.rmtree(parent)
        shutil.rmtree(run_dir)


def test_a_hidden_folder_made_after_a_command_is_covered_at_the_next() -> None:
    """bwrap's view of the host is worked out once per state of the folders it covers: a run dir
    that did not exist at a sandbox's first command is still covered once it does."""
    parent = Path(tempfile.mkdtemp(prefix="polar-escape-", dir="/var/tmp"))
    run_dir = Path("/var/tmp") / f"polar-late-run-{os.getpid()}"

    async def go():
        sb = _box(parent / "mine", hidden=(run_dir,))
        await sb.start()
        first = await sb.exec(f"ls -d {run_dir} 2>/dev/null; true", {}, 10)
        run_dir.mkdir()
        (run_dir / "rendezvous.json").write_text("keys")
        peek = await sb.exec(f"cat {run_dir}/rendezvous.json", {}, 10)
        assert await sb.stop()
        return first, peek

    try:
        first, peek = _run(go())
        assert first.returncode == 0 and first.stdout == b""  # not there yet
        assert peek.returncode != 0 and b"keys" not in peek.stdout, peek
    finally:
        shutil.rmtree(parent)
        shutil.rmtree(run_dir, ignore_errors=True)


def test_fork_bomb_is_bounded_and_ends_the_command(tmp_path: Path) -> None:
    async def go():
        sb = _box(tmp_path / "sb", max_pids=64)
        await sb.start()
        bomb = await sb.exec("f() { f | f & }; f; sleep 60", {}, 30)
        after = await sb.exec("echo still-works", {}, 60)
        return bomb, after, await sb.stop(), sb

    bomb, after, clean, sb = _run(go())
    if sb._cgroup is None:
        pytest.skip("no pids cgroup here (the RLIMIT_NPROC path is tested in test_limits.py)")
    assert bomb.limit == "process limit reached (max_pids=64)" and not bomb.timed_out  # ended by the limit
    assert after.stdout == b"still-works\n"
    assert clean


def test_disk_and_output_floods_are_bounded(tmp_path: Path, launcher: str) -> None:
    async def go():
        sb = _box(tmp_path / "sb", max_file_bytes=1 << 20, max_disk_bytes=8 << 20, max_output=4096)
        await sb.start()
        one_file = await sb.exec("yes > big", {}, 30)
        size = (sb.workspace / "big").stat().st_size
        many = await sb.exec("i=0; while :; do i=$((i+1)); head -c 1000000 /dev/zero > f$i; done", {}, 60)
        for f in sb.workspace.glob("f*"):
            f.unlink()
        stdout = await sb.exec("yes", {}, 2)
        assert await sb.stop()
        return one_file, size, many, stdout

    one_file, size, many, stdout = _run(go())
    assert size == 1 << 20 and one_file.returncode != 0 and b"File too large" in one_file.stderr
    assert many.limit == f"disk limit exceeded (max_disk_bytes={8 << 20})" and not many.timed_out
    assert stdout.timed_out and len(stdout.stdout) == 4096


@pytest.mark.parametrize("privileged", [True, False], ids=["root-gateway", "user-namespace"])
def test_ram_filesystems_are_read_only_or_bounded(tmp_path: Path, privileged: bool, launcher: str) -> None:
    """/dev is read-only, /dev/shm is the sandbox's folder on disk, /run and the covers hold 1 MiB at
    most, whoever the command runs as (writable covers are what a gateway that is not root gets)."""
    async def go():
        sb = _box(tmp_path / "sb")
        sb.privileged = privileged and os.geteuid() == 0
        await sb.start()
        r = await sb.exec("for d in /run /root /dev; do head -c 4000000 /dev/zero > $d/big 2>/dev/null;"
                          " echo $d $(stat -c %s $d/big 2>/dev/null || echo none); done;"
                          " head -c 5000000 /dev/zero > /dev/shm/big && echo shm ok", {}, 30)
        shm = (sb.shm / "big").stat().st_size
        assert await sb.stop()
        return r, shm

    r, shm = _run(go())
    sizes = dict(line.split() for line in r.stdout.decode().splitlines())
    assert sizes["/dev"] == "none" and sizes["shm"] == "ok", r
    assert all(sizes[d] == "none" or int(sizes[d]) <= 1 << 20 for d in ("/run", "/root")), r
    assert shm == 5000000  # on disk, in the sandbox's folder: the disk limit counts it


EVIL_SO = """
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
    FILE *f = fopen(getenv("EVIL_OUT"), "a");
    if (f) { fprintf(f, "%d\\n", (int)getuid()); fclose(f); }
}
"""


def test_task_environment_runs_no_code_before_the_drop(tmp_path: Path, launcher: str) -> None:
    """A task's LD_PRELOAD, PYTHONPATH and PATH reach the command, never bwrap on the host nor
    inside.py while it is root: each hook records the uid it ran as, on the host if it can."""
    host_out = Path(f"/var/tmp/polar-evil-{os.getpid()}")
    files = {"site/sitecustomize.py": tmp_path / "sitecustomize.py", "bin/bwrap": tmp_path / "bwrap"}
    (tmp_path / "sitecustomize.py").write_text("import os\nopen(os.environ['EVIL_OUT'], 'a').write('%d\\n' % os.getuid())\n")
    (tmp_path / "bwrap").write_text(f"#!/bin/sh\necho host-bwrap >> {host_out}\nexec /usr/bin/bwrap \"$@\"\n")
    (tmp_path / "bwrap").chmod(0o755)
    if shutil.which("cc"):
        (tmp_path / "evil.c").write_text(EVIL_SO)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", tmp_path / "evil.so", tmp_path / "evil.c"], check=True)
        files["evil.so"] = tmp_path / "evil.so"

    async def go():
        sb = BwrapSandbox(tmp_path / "sb", {k: str(v) for k, v in files.items()}, [], "none")
        await sb.start()
        ws = sb.workspace
        env = {"PYTHONPATH": f"{ws}/site", "PATH": f"{ws}/bin:/usr/bin:/bin", "EVIL_OUT": str(host_out)}
        if "evil.so" in files:
            env["LD_PRELOAD"] = f"{ws}/evil.so"
        first = await sb.exec(f"{PY} -c pass", env, 30)  # every hook tries the host first...
        inside = await sb.exec(f"{PY} -c pass; cat who", env | {"EVIL_OUT": f"{ws}/who"}, 30)  # ...then its workspace
        uid = sb.run_as[0] if os.geteuid() == 0 else os.getuid()
        assert await sb.stop()
        return first, inside, uid

    try:
        first, inside, uid = _run(go())
        assert not host_out.exists(), host_out.read_text()
    finally:
        host_out.unlink(missing_ok=True)
    assert first.returncode == 0, first.stderr
    uids = inside.stdout.split()
    assert uids and set(uids) == {str(uid).encode()} and uid not in (0, 65534), inside


def test_sigterm_ignorer_is_killed_at_the_deadline_and_nothing_survives_stop(tmp_path: Path) -> None:
    marker = f"7{os.getpid() % 100000:05d}3"

    async def go():
        sb = _box(tmp_path / "sb")
        await sb.start()
        t0 = time.monotonic()
        r = await sb.exec(f"trap '' TERM; (setsid env -i sleep {marker} &); sleep {marker}", {}, 1.5)
        return r, time.monotonic() - t0, await sb.stop()

    r, elapsed, clean = _run(go())
    assert r.timed_out and elapsed > 1.4  # its own sleep would last for days
    assert clean
    assert not live_processes_matching(marker)


# --- through the real gateway path: `polar-hpc run --service`, tasks submitted as a trainer would ----

PROBE = Path(__file__).with_name("escape_probe.py")
MODES = ("none", "proxy-only", "host")


def _wait_for(path: Path, job: subprocess.Popen, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert job.poll() is None, job.stdout.read()
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.1)
    return json.loads(path.read_text())


def _plant() -> tuple[dict[Path, str], Path]:
    """Files a harness must not see: in /root, /home and the host's /tmp, and another run's 0600 key."""
    tag = f"polar-escape-{os.getpid()}"
    planted = {Path(top) / tag: f"planted in {top}" for top in ("/root", "/home", "/tmp")}
    for path, text in planted.items():
        path.write_text(text)
    other = Path(tempfile.mkdtemp(prefix="polar-other-run-", dir="/var/tmp"))
    other.chmod(0o755)  # only the keys folder (0700) and the key (0600) protect it, as in a real run
    (other / "keys").mkdir(mode=0o700)
    key = other / "keys" / "server.json"
    key.write_text("OTHER-RUN-SECRET")
    key.chmod(0o600)
    planted[key] = "OTHER-RUN-SECRET"
    return planted, other


def _probe_task(mode: str, spec: dict) -> dict:
    return {"id": f"probe-{mode}", "instruction": "-", "timeout_s": 90, "sandbox": {"network": mode, "files": {
        "probe.py": str(PROBE)}}, "harness": {"command": f"python probe.py {shlex.quote(json.dumps(spec))}"}}


def test_escapes_through_the_gateway_in_every_network_mode(tmp_path: Path, calculator_dir: Path) -> None:
    planted, other = _plant()
    run_dir = Path(tempfile.mkdtemp(prefix="polar-escape-run-", dir="/var/tmp")) / "run"  # not behind the private /tmp
    run_dir.parent.chmod(0o755)  # so that what hides the run directory is the sandbox, not its parent's mode
    (tmp_path / "topology.yaml").write_text(f"sandbox:\n  max_pids: 64\n  max_disk_bytes: {256 << 20}\n")
    job = subprocess.Popen([sys.executable, "-m", "polar_hpc", "run", "--service", "-c", str(tmp_path / "topology.yaml"),
                            "--run-dir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        endpoint = _wait_for(run_dir / "rendezvous.json", job)["endpoint"]
        engine = _wait_for(run_dir / ".engine.ready", job)["url"]
        orch_at, engine_at = endpoint.removeprefix("tcp://"), engine.removeprefix("http://")
        spec = {
            "read": ["/etc/shadow", str(run_dir / "rendezvous.json"), str(run_dir / "tasks.jsonl"), *map(str, planted)],
            "list": ["/root", "/home", str(run_dir), str(other / "keys")],
            "write": ["/usr/polar-x", "/etc/polar-x", f"/var/tmp/polar-x-{os.getpid()}", "/polar-x", "/dev/polar-x",
                      "/run/polar-x", "/root/polar-x", "/home/polar-x", str(other / "polar-x"), str(run_dir / "x")],
            "unmount": ["/root"],
        }
        tasks = [_probe_task("host", spec | {"tcp": [engine_at, orch_at], "post": [engine + "/generate"],
                                             "zmq": [endpoint],
                                             "zmq_message": wire.encode(wire.StatusRequest()).hex()})]
        tasks += [_probe_task(mode, spec | {"tcp": [engine_at, orch_at, "1.1.1.1:80"], "post": [engine + "/generate"]})
                  for mode in ("none", "proxy-only")]
        tasks += [
            {"id": "shm", "instruction": "-", "timeout_s": 90, "harness": {"command":  # 32 x 64 MiB = 2 GiB
             "for i in $(seq 32); do head -c 67108864 /dev/zero >> /dev/shm/flood || exit 3; echo $i >&2; done"}},
            {"id": "bomb", "instruction": "-", "timeout_s": 60, "harness": {"command": "f() { f | f & }; f; sleep 100"}},
            {"id": "calc", "instruction": "What is 6 * 7?", "num_samples": 2, "harness": {"command": "python agent.py"},
             "sandbox": {"files": {"agent.py": str(calculator_dir / "agent.py")}},
             "evaluator": {"kind": "regex", "pattern": "\\b42\\b"}},
        ]
        with Client(run_dir) as client:
            client.wait(client.submit(tasks), timeout_s=240)
            client.drain()
        assert job.wait(60) == 0
        by_task = {}
        for t in iter_trajectories(run_dir):
            by_task.setdefault(t.task_id, []).append(t)
        untouched = {path: path.read_text() for path in planted}
        written = [p for p in spec["write"] if Path(p).exists()]
    finally:
        job.kill()
        job.wait()
        shutil.rmtree(other)
        shutil.rmtree(run_dir.parent)
        for path in planted:
            path.unlink(missing_ok=True)
    reports = {}
    for mode in MODES:
        [t] = by_task[f"probe-{mode}"]
        assert t.status == "completed", t.metadata
        reports[mode] = json.loads(t.metadata["stderr_tail"].strip().splitlines()[-1])
        _assert_contained(reports[mode], planted, run_dir, other)
        _assert_network(reports[mode], mode, engine, engine_at, orch_at)
    [shm] = by_task["shm"]
    assert shm.metadata.get("error") == f"harness killed: disk limit exceeded (max_disk_bytes={256 << 20})", shm.metadata
    assert int(shm.metadata["stderr_tail"].split()[-1]) < 32  # killed well before 2 GiB
    [bomb] = by_task["bomb"]
    # the pids cgroup ends it at once (a bomb with no pids bound would run to its deadline: `timeout`)
    assert (bomb.status, bomb.metadata.get("error")) == ("error", "harness killed: process limit reached (max_pids=64)"), \
        bomb.metadata
    assert [(t.status, t.reward) for t in by_task["calc"]] == [("completed", 1.0)] * 2  # other sessions still run
    assert untouched == planted
    assert written == []


def _assert_contained(report: dict, planted: dict, run_dir: Path, other: Path) -> None:
    """What every network mode must hold: an unprivileged user seeing only its own environment."""
    status = report["status"]
    uid = status["Uid"][0]  # a root gateway's: the session's own uid of sandbox.uid_range, else the user's
    first, last = UID_RANGE
    assert (first <= int(uid) <= last) if os.geteuid() == 0 else uid == str(os.getuid()), status
    assert status["Uid"] == [uid] * 4 and "0" not in status["Uid"], status  # not root on the host
    assert all(int(status[k][0], 16) == 0 for k in ("CapPrm", "CapEff")), status
    assert status["NoNewPrivs"] == ["1"], status  # a setuid binary cannot give root back
    if os.geteuid() == 0:
        assert int(status["CapBnd"][0], 16) == 0, status
    assert not any(v.startswith("ok:") for v in report["read"].values()), report["read"]
    listed = report["list"]
    assert all(p.name not in listed[top] for p in planted for top in ("/root", "/home")), listed
    assert listed[str(run_dir)] == "ok:[]", listed  # hidden behind an empty cover
    assert listed[str(other / "keys")] == "PermissionError", listed
    sessions = listed[report["sessions"]]
    assert sessions.startswith("ok:[") and sessions.count(",") == 0, sessions  # only its own session
    writes = report["write"]
    assert [p for p, v in writes.items() if v.startswith("ok:")] == [p for p in writes if p.endswith("/mine.txt")]
    assert all(p.name not in v for p in planted for v in report["unmount"].values()), report["unmount"]


def _assert_network(report: dict, mode: str, engine: str, engine_at: str, orch_at: str) -> None:
    assert report["proxy"] == "ok:200", report  # the proxy, and only it, in every mode
    tcp = report["tcp"]
    if mode != "host":
        assert tcp[engine_at] == tcp[orch_at] == "ConnectionRefusedError", tcp  # a loopback of its own
        assert tcp["1.1.1.1:80"] == "OSError", tcp  # Network is unreachable
        assert report["post"][engine + "/generate"] == "URLError", report["post"]
        return
    assert tcp[engine_at] == tcp[orch_at] == "ok:connected", tcp  # `host` shares the host's network
    # with the run's keys: the engine refuses a caller without its key, the control port a peer without CURVE
    assert report["post"][engine + "/generate"] == "ok:401", report["post"]
    assert report["zmq"][f"tcp://{orch_at}"] == "ok:no answer", report["zmq"]


def test_a_daemon_that_tries_to_leave_its_cgroup_stays_in_it_and_dies_at_stop(tmp_path: Path) -> None:
    """The bwrap teardown trusts the sandbox's cgroup to list every process (`cgroup_sealed`, no
    /proc scan): a setsid daemon that writes itself into every cgroup.procs it can see must fail,
    stay in the sandbox's cgroup and die with it."""
    marker = f"5{os.getpid() % 100000:05d}7"
    leave = ('for f in /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs; do '
             'echo $$ 2>/dev/null > "$f" && echo "left via $f"; done')

    async def go():
        sb = _box(tmp_path / "sb")
        await sb.start()
        assert sb.cgroup_sealed and sb._cgroup is not None
        r = await sb.exec(f"setsid sh -c '{leave}; exec sleep {marker}' & sleep 1; sleep {marker}", {}, 3)
        return r, await sb.stop()

    r, clean = _run(go())
    assert r.timed_out and b"left via" not in r.stdout, r
    assert clean and not live_processes_matching(marker)
