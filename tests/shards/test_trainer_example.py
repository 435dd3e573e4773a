"""examples/trainer_grpo.py follows a real `polar-hpc run` from before it starts until it completes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

from conftest import ROOT, polar


def test_trainer_example_follows_a_running_job(tmp_path):
    shutil.copy(ROOT / "examples" / "calculator" / "agent.py", tmp_path)  # files come from the task's folder
    base = {"instruction": "What is 17 * 23 + 4?", "num_samples": 3, "timeout_s": 60,
            "harness": {"command": "python agent.py"},
            "sandbox": {"files": {"agent.py": "agent.py"}, "network": "host"},
            "evaluator": {"kind": "regex", "pattern": "\\b395\\b"}}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": i, **base}) + "\n" for i in ("calc-a", "calc-b")))
    (tmp_path / "topology.yaml").write_text("gateway:\n  shard_max_age_s: 0.5\n")
    run_dir = tmp_path / "run"
    trainer = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "trainer_grpo.py"), str(run_dir), "--cursor",
         str(tmp_path / "cursor.json"), "--idle-timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        job = polar("run", tasks, "-c", tmp_path / "topology.yaml", "--run-dir", run_dir, timeout=300)
        assert job.returncode == 0, job.stdout + job.stderr
        out, _ = trainer.communicate(timeout=120)
    finally:
        trainer.kill()
    assert trainer.returncode == 0, out
    groups = re.findall(r"^task (calc-[ab]): samples \[0, 1, 2\], rewards \[1.0, 1.0, 1.0\], "
                        r"advantages \[0.0, 0.0, 0.0\]$", out, flags=re.M)
    assert sorted(groups) == ["calc-a", "calc-b"], out
    step = re.search(r"^step 1: 2 tasks, 6 trajectories -> (numpy|torch) batch: input_ids \(6, (\d+)\), "
                     r"attention_mask \(6, \2\), loss_mask \(6, \2\), logprobs \(6, \2\), rewards \(6,\)", out, re.M)
    assert step, out
    assert "run complete: 2 groups, 0 strays skipped" in out
    checked = polar("shards", "verify", run_dir)
    assert checked.returncode == 0 and "ok: " in checked.stderr and " 6 records, 0 problems" in checked.stderr
    listed = [json.loads(line) for line in polar("shards", "ls", run_dir, "--json").stdout.splitlines()]
    assert listed and all(row["indexed"] for row in listed) and sum(row["records"] for row in listed) == 6
