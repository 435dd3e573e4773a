"""What the hidden-tests evaluator costs per session, beside the harness: examples/swe with the oracle.

Runs `polar-hpc run` (bubblewrap) on every examples/swe task N times with `harness: oracle` and
reads each trajectory's timings: `harness_ms` (RUN: the solution's run in its sandbox),
`capture_ms` (git diff in the harness's sandbox), `apply_ms` (tests copied in; with
`--verifier-sandbox fresh`, the diff applied in the fresh sandbox first) and `tests_ms` (test.sh),
`postrun_ms` (the whole POSTRUN stage: capture, apply, tests, teardown, shard append), and with
`fresh`, `fresh_start_ms` (the evaluator's fresh sandbox: start, task files, base snapshot; it
overlaps the harness). Medians over sessions; one JSON line last.

    uv run python bench/swe.py [--samples 4] [--verifier-sandbox session|fresh]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from polar_hpc.shards.reader import iter_trajectories

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "swe"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=4, help="sessions per task")
    parser.add_argument("--verifier-sandbox", choices=("session", "fresh"), default="session",
                        help="where the tests run (docs/tasks.md)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ref, topology = Path(tmp) / "suite.yaml", Path(tmp) / "topology.yaml"
        ref.write_text(f"suite: {EXAMPLES}\nharness: {{kind: oracle}}\nnum_samples: {args.samples}\ndockerfile: host\n"
                       f"verifier_sandbox: {args.verifier_sandbox}\n")
        topology.write_text("sandbox: {backend: bwrap}\n")
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "polar_hpc", "run", str(ref), "-c", str(topology),
                        "--run-dir", f"{tmp}/run"], check=True, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - t0
        trajs = list(iter_trajectories(Path(tmp) / "run"))
    rewards = [t.reward for t in trajs]

    def median_ms(key: str, where: str) -> float:
        return round(1000 * statistics.median(t.metadata[where][key] for t in trajs), 1)

    figures = {"verifier_sandbox": args.verifier_sandbox,
               "sessions": len(trajs), "mean_reward": round(statistics.mean(rewards), 3), "wall_s": round(wall, 2),
               "harness_ms": median_ms("run_s", "timings")}
    for key in ("fresh_start_s",) * (args.verifier_sandbox == "fresh") + ("capture_s", "apply_s", "tests_s"):
        figures[key[:-2] + "_ms"] = median_ms(key, "evaluation_timings")
    figures["postrun_ms"] = median_ms("postrun_s", "timings")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
