"""End-to-end overhead of polar-hpc on this machine: how much wall time is not harness or engine.

Runs `polar-hpc run` on N sessions of a trivial harness (one chat call with urllib, then exit) and,
in the same run of this script, the same harness N times directly against the engine with no
polar-hpc in between, as many at once as the gateway has RUN slots. Per session, the
infrastructure overhead is the session's span at the gateway (assigned to trajectory written) minus
the time its harness process ran (which holds the engine's time) and minus the time it waited for
a free slot (queueing, which is capacity, not overhead). Prints one JSON object as its last line.

    uv run python bench/e2e.py [--sessions 32]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import subprocess
import sys
import tempfile
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


def polar_run(tmp: Path, sessions: int) -> tuple[float, list]:
    task = {
        "id": "trivial",
        "instruction": "Say hello.",
        "num_samples": sessions,
        "harness": {"command": "python harness.py"},
        "sandbox": {"files": {"harness.py": str(tmp / "harness.py")}},
        "builder": "per_request",
    }
    (tmp / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "polar_hpc", "run", str(tmp / "tasks.jsonl"), "--run-dir",
                    str(tmp / "run")], check=True, capture_output=True)
    wall = time.perf_counter() - t0
    return wall, list(iter_trajectories(tmp / "run"))


def direct_runs(tmp: Path, sessions: int, concurrency: int) -> list[float]:
    """The same harness against the engine's own OpenAI route, with no proxy, sandbox or gateway."""
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

        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(once, range(sessions)))
    finally:
        procs.stop([engine])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "harness.py").write_text(HARNESS)
        wall, trajs = polar_run(tmp, args.sessions)
        direct = direct_runs(tmp, args.sessions, PoolConfig().run)
    completed = [t for t in trajs if t.status == "completed"]
    timings = [t.metadata["timings"] for t in completed]
    overhead = [(t.t_end - t.t_start) - x["run_s"] - x.get("ready_s", 0) - x.get("wait_s", 0)
                for t, x in zip(completed, timings)]
    harness = [x["run_s"] for x in timings]
    figures = {
        "sessions": len(trajs),
        "completed": len(completed),
        "wall_s": round(wall, 3),
        "infra_overhead_ms_per_session": round(1000 * statistics.mean(overhead), 2),
        "harness_in_sandbox_ms": round(1000 * statistics.mean(harness), 2),
        "harness_direct_ms": round(1000 * statistics.mean(direct), 2),
        "sandbox_and_proxy_ratio": round(statistics.mean(harness) / statistics.mean(direct), 3),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
