"""End-to-end overhead of polar-hpc on this machine: how much wall and CPU time is not harness or engine.

Runs `polar-hpc run` on N sessions of a trivial harness (one chat call with urllib, then exit) and,
in the same run of this script, the same harness N times directly against the engine with no
polar-hpc in between, as many at once as the gateway has RUN slots. Figures (last line, one JSON
object):
- infra_overhead_ms_per_session (mean) and infra_overhead_p50_ms: a session's span at the gateway
  (assigned to trajectory written) minus the time its harness process ran (which holds the
  engine's time) and minus the time it waited for a free slot (queueing, which is capacity, not
  overhead); init_p50_ms and postrun_p50_ms split it (INIT: sandbox start, session open at the
  proxy; POSTRUN: collect records, build, kill the sandbox's processes and check that none
  survives, append to the shard; the sandbox's files and cgroup are removed after the result is
  sent, still in the POSTRUN slot: in the gateway's CPU below, not in the span). The mean holds the
  first sessions, whose INIT waits for the proxy to load its tokenizer; the median does not.
- gateway_cpu_ms_per_session: the gateway process's own CPU time while it served (from its proxy's
  start, after its imports, to its proxy's end), per session; children_cpu_ms_per_session: that of
  the children it reaped meanwhile (each command's cgroup-joining shell and bwrap), per session.
  What runs inside bwrap's PID namespace (the in-sandbox launcher and the harness) is reaped there,
  never by the gateway, and is in neither: bench/sandbox.py measures the launcher's CPU time alone.
  harness_direct_cpu_ms: the CPU time of one direct harness run, for scale.
- harness_in_sandbox_ms / harness_direct_ms (means) and their ratio: the harness's run time with
  and without the sandbox and the proxy in between.
With `--serial` the gateway has one slot per stage (INIT 1, READY 0, RUN 1, POSTRUN 1) and the
direct runs go one at a time: each stage's time without other sessions competing for the CPUs.

    uv run python bench/e2e.py [--sessions 32] [--serial]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from polar_hpc import procs
from polar_hpc.config import PoolConfig
from polar_hpc.shards.reader import iter_trajectories

HARNESS = (
    "import json, os, urllib.request\n"
    "body = json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': os.environ['POLAR_INSTRUCTION']}]})\n"
    "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=body.encode(),\n"
    "    headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'})\n"
    "print(json.load(urllib.request.urlopen(req))['choices'][0]['message']['content'])\n"
)


def polar_run(tmp: Path, sessions: int, pools: PoolConfig) -> tuple[float, list, tuple[float, float]]:
    """(wall s, trajectories, (gateway own CPU s, its reaped children's CPU s))."""
    task = {
        "id": "trivial",
        "instruction": "Say hello.",
        "num_samples": sessions,
        "harness": {"command": "python harness.py"},
        "sandbox": {"files": {"harness.py": str(tmp / "harness.py")}},
        "builder": "per_request",
    }
    (tmp / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    (tmp / "config.yaml").write_text(json.dumps({"gateway": {"pools": pools.model_dump()}}))
    t0 = time.perf_counter()
    run = subprocess.Popen([sys.executable, "-m", "polar_hpc", "run", str(tmp / "tasks.jsonl"), "-c", str(tmp / "config.yaml"),
                            "--run-dir", str(tmp / "run")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cpu = [0.0, 0.0]
    sampler = threading.Thread(target=_sample_gateway, args=(run, cpu), daemon=True)
    sampler.start()
    _, err = run.communicate()
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        sys.exit(f"polar-hpc run failed ({run.returncode}): {err.decode(errors='replace')[-2000:]}")
    sampler.join()
    return wall, list(iter_trajectories(tmp / "run")), (cpu[0], cpu[1])


def _sample_gateway(run: subprocess.Popen, cpu: list[float]) -> None:
    """Set `cpu` to the gateway's (own, reaped children's) CPU seconds from the first to the last
    moment its proxy was seen alive (before the proxy is reaped its time is not in the gateway's)."""
    tick, first = os.sysconf("SC_CLK_TCK"), None
    while run.poll() is None:
        gateway = _child(run.pid, "gateway")
        stat = _stat(gateway) if gateway and _child(gateway, "proxy") else None
        if stat:
            now = (int(stat[11]) + int(stat[12])) / tick, (int(stat[13]) + int(stat[14])) / tick
            first = first or now
            cpu[0], cpu[1] = now[0] - first[0], now[1] - first[1]
        time.sleep(0.02)


def _child(ppid: int, word: str) -> int | None:
    """A child of `ppid` whose command line holds `word` (a polar-hpc subcommand)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) and int(stat[1]) == ppid:
            try:
                argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if word.encode() in argv:
                return int(entry.name)
    return None


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first; utime is [11])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def direct_runs(tmp: Path, sessions: int, concurrency: int) -> tuple[list[float], float]:
    """The same harness against the engine's own OpenAI route, with no proxy, sandbox or gateway:
    (each run's seconds, CPU seconds of one run)."""
    ready = tmp / "engine.ready"
    engine = procs.spawn("engine", ["engine", "--port", "0", "--ready-file", str(ready)], tmp / "engine.log")
    try:
        url = procs.wait_ready(engine, ready)["url"]
        env = {"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "x", "POLAR_INSTRUCTION": "Say hello.",
               "PATH": str(Path(sys.executable).parent)}

        def once(_: int) -> float:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, str(tmp / "harness.py")], env=env, check=True, capture_output=True)
            return time.perf_counter() - t0

        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            spans = list(pool.map(once, range(sessions)))
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the engine is not reaped yet: harnesses only
        return spans, (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) / sessions
    finally:
        procs.stop([engine])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--serial", action="store_true", help="one session per stage at a time")
    args = parser.parse_args()
    pools = PoolConfig(init=1, ready=0, run=1, postrun=1) if args.serial else PoolConfig()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "harness.py").write_text(HARNESS)
        wall, trajs, (gateway_cpu, children_cpu) = polar_run(tmp, args.sessions, pools)
        direct, direct_cpu = direct_runs(tmp, args.sessions, pools.run)
    completed = [t for t in trajs if t.status == "completed"]
    timings = [t.metadata["timings"] for t in completed]
    overhead = [(t.t_end - t.t_start) - x["run_s"] - x.get("ready_s", 0) - x.get("wait_s", 0)
                for t, x in zip(completed, timings)]
    harness = [x["run_s"] for x in timings]
    n = max(1, len(trajs))
    figures = {
        "sessions": len(trajs),
        "serial": args.serial,
        "completed": len(completed),
        "wall_s": round(wall, 3),
        "infra_overhead_ms_per_session": round(1000 * statistics.mean(overhead), 2),
        "infra_overhead_p50_ms": round(1000 * statistics.median(overhead), 2),
        "init_p50_ms": _p50_ms(timings, "init_s"),
        "postrun_p50_ms": _p50_ms(timings, "postrun_s"),
        "gateway_cpu_ms_per_session": round(1000 * gateway_cpu / n, 2),
        "children_cpu_ms_per_session": round(1000 * children_cpu / n, 2),
        "harness_direct_cpu_ms": round(1000 * direct_cpu, 2),
        "harness_in_sandbox_ms": round(1000 * statistics.mean(harness), 2),
        "harness_direct_ms": round(1000 * statistics.mean(direct), 2),
        "sandbox_and_proxy_ratio": round(statistics.mean(harness) / statistics.mean(direct), 3),
    }
    print(json.dumps(figures))


def _p50_ms(timings: list[dict], key: str) -> float:
    return round(1000 * statistics.median(x.get(key, 0.0) for x in timings), 2)


if __name__ == "__main__":
    main()
