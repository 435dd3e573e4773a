"""Sandbox start cost beside a bare bwrap start, and how busy RUN slots stay with and without the READY pool.

- cold_start_ms: a real sandbox (bwrap where usable, else none) from nothing to its first command
  done: `start()` (workspace, cgroup, a root gateway's uid lease, one uploaded file, limits) +
  `exec("true")`; median of --starts. cold_start_cpu_ms: the CPU time of this process and the
  children it reaps over the same span; what runs inside bwrap's PID namespace is reaped there and not counted, so
  launcher_cpu_ms gives the CPU time of the in-sandbox launcher with the sandbox's own options
  (on bwrap the compiled launcher, then `sh -c true`; with POLAR_SANDBOX_LAUNCHER=fallback the
  host's prlimit, setpriv for a root gateway, then the command's own `sh -c` that restores its
  variables and runs `true`) run alone outside bwrap, median of --starts;
  python_launcher_cpu_ms that of `python3 -I -S inside.py` doing the same (the launcher in an
  image or, on the fallback, on a host without those tools; there a harness command without
  network runs it, with `--relay` only, after the host's tools).
- relayed_exec_ms / plain_exec_ms: medians of `exec("true")` in one started sandbox without network,
  in turns, with the session's token (the launcher first hands a listener to a relay socket served
  here by the proxy's own `relay.Handoffs`, which keeps it) and without.
- Where a cold start's time goes (medians, same run): start_ms (`start()`), exec_ms (`exec("true")`:
  the cgroup join, bwrap, the launcher), our_bwrap_ms (the sandbox's own bwrap command
  line, its mounts and namespaces, running /bin/true itself: no cgroup join, no launcher);
  shown_dirs: how many host folders hold this interpreter and the PATH (`bwrap.shown_dirs`); those
  under a cover (/tmp, /root, /home, a checkout) that line binds back, a bind mount each.
- cold_start_fallback_ms, relayed_exec_fallback_ms: the same on the launcher a gateway without a
  compiler falls back to (POLAR_SANDBOX_LAUNCHER=fallback: the host's prlimit/setpriv, inside.py
  to relay), interleaved with the others.
- bare_bwrap_ms: in the same run, interleaved with the cold starts, `bwrap --ro-bind / / --dev /dev
  --proc /proc --unshare-all --die-with-parent --new-session true` started the same way as
  our_bwrap (asyncio, piped output); cold_to_bare_ratio = cold_start_ms / bare_bwrap_ms (goal <= 2).
- The staged run drives the gateway's real `Pipeline` (its stages, slots, credits and shard writer)
  with a synthetic sandbox: init (start) = run/2, harness (exec) = run, postrun (teardown) = run/4,
  16 sessions per RUN slot, credits answered at once as the orchestrator would.
  - with pool: the sandbox starts in INIT and waits started in READY (the pipeline as it runs).
  - without pool: the same work with the sandbox start paid inside the RUN slot (start is
    instant, exec sleeps init + run), i.e. a gateway that starts a sandbox only once it may run,
    with the same number of RUN slots. This is the serial ceiling, not a measurement of a rival:
    such a slot can be at most run/(init+run) = 2/3 busy by construction, and a gateway without
    a pool given more slots would start as many sandboxes at once as the pool does.
  run_slot_busy_* = harness (run) time / (RUN slots x span from first harness start to last end).
- pooled_acquire_ms: with the pool, mean time from a RUN slot coming free (a harness ending) to
  the next session's harness command being issued in its already-started sandbox.

    uv run python bench/sandbox.py [--run-s 0.2] [--slots 4] [--starts 10]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from asyncio.subprocess import DEVNULL, PIPE
from collections.abc import Iterator
from pathlib import Path

from polar_hpc import wire
from polar_hpc.config import PoolConfig, SandboxConfig, Task
from polar_hpc.gateway.pipeline import Pipeline, ProxyLink
from polar_hpc.proxy import relay
from polar_hpc.sandbox import ExecResult, Sandbox, backend, bwrap, launcher
from polar_hpc.sandbox.base import INSIDE, MARKER
from polar_hpc.shards.writer import ShardWriter


BARE = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent",
        "--new-session", "true"]


async def cold_starts(tmp: Path, n: int) -> dict[str, float]:
    """Medians of `n` cold starts and of their parts, with our bwrap alone and a bare one, in turns."""
    make, _ = backend(SandboxConfig(), tmp)
    (tmp / "agent.py").write_text("print('hi')\n")
    taken: dict[str, list[float]] = {k: [] for k in ("cold", "cpu", "start", "exec", "ours", "bare", "fallback")}
    for i in range(n):
        t0, c0 = time.perf_counter(), _cpu_s()
        sb = make(tmp / f"cold{i}", {"agent.py": str(tmp / "agent.py")}, [], "none")
        await sb.start()
        t1 = time.perf_counter()
        await sb.exec("true", {}, 30)
        t2 = time.perf_counter()
        taken["cpu"].append(_cpu_s() - c0)
        for key, span in (("cold", t2 - t0), ("start", t1 - t0), ("exec", t2 - t1)):
            taken[key].append(span)
        if sb.name == "bwrap":  # its command line with /bin/true in the launcher's place, not joined
            argv, env = sb._process("true", {MARKER: sb.marker})
            at = argv.index("bwrap")
            taken["ours"].append(await _spawned(argv[at:argv.index("--", at) + 1] + ["/bin/true"], env))
        await sb.stop()
        if shutil.which("bwrap"):
            taken["bare"].append(await _spawned(BARE, None))
        with _fallback():
            t0 = time.perf_counter()
            sb = make(tmp / f"fallback{i}", {"agent.py": str(tmp / "agent.py")}, [], "none")
            await sb.start()
            await sb.exec("true", {}, 30)
            taken["fallback"].append(time.perf_counter() - t0)
            await sb.stop()
    return {k: 1000 * statistics.median(v) if v else float("nan") for k, v in taken.items()}


async def _spawned(argv: list[str], env: dict[str, str] | None) -> float:
    """Seconds to start `argv` (asyncio, piped output) and see it exit 0."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=PIPE, stderr=PIPE, stdin=DEVNULL)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} exited {proc.returncode}: {err.decode(errors='replace')[-1000:]}")
    return time.perf_counter() - t0


@contextlib.contextmanager
def _fallback() -> Iterator[None]:
    """The launcher without a compiler's (POLAR_SANDBOX_LAUNCHER=fallback) for what runs inside."""
    os.environ[launcher.FORCE] = "fallback"
    try:
        yield
    finally:
        del os.environ[launcher.FORCE]


async def relayed_execs(tmp: Path, n: int) -> tuple[float, float, float]:
    """Medians (ms) of exec("true") with the session's token (a listener handed over), without,
    and with it on the fallback launcher."""
    kept: list = []
    handoffs = relay.Handoffs(tmp / "relay.sock", lambda token, sock: kept.append(sock))
    make, _ = backend(SandboxConfig(), tmp)
    sb = make(tmp / "relayed", {}, [], "none", proxy_socket=tmp / "relay.sock")
    await sb.start()
    taken: list[list[float]] = [[], [], []]
    try:
        for _ in range(n):
            for i, token in enumerate(("session-token", None, "session-token")):
                with _fallback() if i == 2 else contextlib.nullcontext():
                    t0 = time.perf_counter()
                    result = await sb.exec("true", {}, 30, token=token)
                taken[i].append(time.perf_counter() - t0)
                if result.returncode != 0:
                    sys.exit(f"exec failed: {result.stderr.decode(errors='replace')[-1000:]}")
    finally:
        await sb.stop()
        handoffs.close()
        for sock in kept:
            sock.close()
    relayed, plain, relayed_fallback = (1000 * statistics.median(t) for t in taken)
    return relayed, plain, relayed_fallback


async def launcher_cpu_ms(tmp: Path, n: int) -> tuple[float, float]:
    """CPU ms of the sandbox's own launcher and of the Python one, each run outside the sandbox."""
    make, _ = backend(SandboxConfig(), tmp)
    sb = make(tmp / "launcher", {}, [], "none")
    launchers = [sb._process("true", {MARKER: sb.marker}),
                 Sandbox._process(sb, "true", {MARKER: sb.marker})]  # inside.py for all of it
    cpu: list[list[float]] = [[], []]
    for _ in range(n):
        for i, (argv, env) in enumerate(launchers):
            chain = argv[argv.index("--") + 1:] if "--" in argv else argv  # what bwrap would start
            chain = [str(INSIDE) if a == sb.inside else str(launcher.path()) if a == bwrap.BwrapSandbox.compiled else a
                     for a in chain]  # where the sandbox binds them
            c0 = _cpu_s()
            proc = await asyncio.create_subprocess_exec(*chain, env=env, stdin=DEVNULL)
            await proc.wait()
            cpu[i].append(_cpu_s() - c0)
    return 1000 * statistics.median(cpu[0]), 1000 * statistics.median(cpu[1])


def _cpu_s() -> float:
    """CPU seconds of this process and its waited-for children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class _Proxy(ProxyLink):
    url = "http://127.0.0.1:1"

    async def open(self, session_id: str, token: str, task_id: str) -> None:
        return None

    async def close(self, session_id: str) -> list[wire.CallRecord]:
        return []


class _Staged(Sandbox):
    """Sleeps instead of work; records when each harness ran."""

    init_s = run_s = post_s = 0.0
    runs: list[tuple[float, float]] = []

    async def start(self) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)
        await asyncio.sleep(self.init_s)

    async def exec(self, command, env, timeout_s, max_output=None, *, cwd=None, user=None, token=None) -> ExecResult:
        t0 = time.perf_counter()
        await asyncio.sleep(self.run_s)
        self.runs.append((t0, time.perf_counter()))
        return ExecResult(0, b"", b"", False)

    async def cancel(self, timeout_s: float = 2.0) -> bool:
        return True

    async def stop(self) -> bool:
        await asyncio.sleep(self.post_s)
        return True


async def staged(tmp: Path, run_s: float, slots: int, pooled: bool) -> tuple[float, float]:
    """(RUN slot busy fraction, mean pooled acquire ms) of one staged run."""
    init_s = run_s / 2

    class Box(_Staged):
        runs = []

    Box.init_s, Box.run_s, Box.post_s = (init_s, run_s, run_s / 4) if pooled else (0.0, init_s + run_s, run_s / 4)
    task = Task.model_validate({"id": "staged", "instruction": "-", "harness": {"command": "work"}})
    n = 16 * slots
    specs = [wire.SessionSpec(f"s{i}", task.model_dump(), i, 0, time.time() + 3600) for i in range(n)]
    done = asyncio.Event()
    results = 0

    def send(msg: wire.Message) -> None:
        nonlocal results
        if isinstance(msg, wire.Credit):
            for _ in range(msg.n):
                if specs:
                    pipeline.assign(specs.pop(0))
        elif isinstance(msg, wire.Result):
            results += 1
            if results == n:
                done.set()

    pools = PoolConfig(init=slots, ready=slots, run=slots, postrun=slots)
    writer = ShardWriter(tmp / f"shards-{pooled}", "bench", 64 << 20, 3600)
    pipeline = Pipeline(pools, Box, tmp / f"boxes-{pooled}", _Proxy(), writer, send)
    send(wire.Credit(n=pools.init))
    await done.wait()
    writer.close()
    starts = sorted(s for s, _ in Box.runs)
    ends = sorted(e for _, e in Box.runs)
    busy = len(Box.runs) * run_s / (slots * (ends[-1] - starts[0]))
    gaps = [s - e for s, e in zip(starts[slots:], ends)]
    return busy, 1000 * statistics.mean(gaps)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-s", type=float, default=0.2, help="synthetic harness time per session")
    ap.add_argument("--slots", type=int, default=4, help="RUN slots")
    ap.add_argument("--starts", type=int, default=10, help="cold starts to take the median of")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="polar-bench-") as d:
        tmp = Path(d)
        cold = await cold_starts(tmp, args.starts)
        launcher, python_launcher = await launcher_cpu_ms(tmp, args.starts)
        relayed, plain, relayed_fallback = await relayed_execs(tmp, args.starts)
        busy_pool, acquire = await staged(tmp, args.run_s, args.slots, pooled=True)
        busy_nopool, _ = await staged(tmp, args.run_s, args.slots, pooled=False)
    print(f"{args.slots} RUN slots x 16 sessions, run {args.run_s}s, init run/2, postrun run/4")
    print(json.dumps({
        "cold_start_ms": round(cold["cold"], 2),
        "cold_start_cpu_ms": round(cold["cpu"], 2),
        "start_ms": round(cold["start"], 2),
        "exec_ms": round(cold["exec"], 2),
        "our_bwrap_ms": round(cold["ours"], 2),
        "shown_dirs": len(bwrap.shown_dirs()),
        "launcher_cpu_ms": round(launcher, 2),
        "python_launcher_cpu_ms": round(python_launcher, 2),
        "relayed_exec_ms": round(relayed, 2),
        "plain_exec_ms": round(plain, 2),
        "relayed_exec_fallback_ms": round(relayed_fallback, 2),
        "bare_bwrap_ms": round(cold["bare"], 2),
        "cold_to_bare_ratio": round(cold["cold"] / cold["bare"], 2),
        "cold_start_fallback_ms": round(cold["fallback"], 2),
        "pooled_acquire_ms": round(acquire, 3),
        "run_slot_busy_with_pool": round(busy_pool, 3),
        "run_slot_busy_without_pool": round(busy_nopool, 3),
    }))


if __name__ == "__main__":
    asyncio.run(main())
