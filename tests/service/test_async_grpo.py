"""The async GRPO example end to end on `polar-hpc run --service`: 3 policy versions, each
trajectory recording the version it was sampled from; a batch re-submitted by a trainer that was
killed after submitting is not run twice."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from polar_hpc.client import Client
from polar_hpc.shards.reader import iter_trajectories
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "async_grpo"
_spec = importlib.util.spec_from_file_location("async_grpo_train", EXAMPLE / "train.py")
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)

KILLED_TRAINER = """
import sys, time
sys.path.insert(0, {example!r})
from train import tasks_for
from polar_hpc.client import Client
print(Client({run!r}).submit(tasks_for(99, 2, 3)), flush=True)
time.sleep(600)
"""


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.1)


@pytest.mark.timeout(900)  # three policy versions of a real run, on a busy machine
def test_three_policy_versions_and_a_resubmitted_batch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        [sys.executable, "-m", "polar_hpc", "run", "--service", "-c", str(EXAMPLE / "topology.yaml"),
         "--run-dir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        _wait_for(run_dir / "rendezvous.json", job)
        trainer = subprocess.Popen([sys.executable, "-c", KILLED_TRAINER.format(example=str(EXAMPLE), run=str(run_dir))],
                                   stdout=subprocess.PIPE, text=True)
        first_batch = trainer.stdout.readline().strip()
        trainer.kill()  # the trainer dies after submitting; its successor submits the same batch again
        trainer.wait()
        with Client(run_dir) as client:
            assert client.submit(train.tasks_for(99, 2, 3)) == first_batch
            assert client.wait(first_batch, timeout_s=300).total == 6

        example = subprocess.run(
            [sys.executable, str(EXAMPLE / "train.py"), str(run_dir), "--work", str(tmp_path / "work"), "--steps", "3"],
            capture_output=True, text=True, timeout=600,
        )
        assert example.returncode == 0, example.stdout + example.stderr
        assert "0 group(s) missing or with the wrong policy version" in example.stdout
        assert job.wait(timeout=120) == 0  # drained: the job ends by itself
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()

    every = list(iter_trajectories(run_dir, unique=False))
    keys = Counter((t.task_id, t.sample_index) for t in every)
    assert set(keys.values()) == {1}  # no trajectory twice, strays included
    assert len(keys) == 6 + 3 * 2 * 4
    for traj in every:
        step = int(traj.task_id.split("-s")[1].split("-")[0])
        versions = {v for trace in traj.traces for v in trace.weight_versions}
        assert traj.status == "completed" and versions == {f"v{0 if step == 99 else step}"}, (traj.task_id, versions)
    weights = [json.loads(line) for line in (run_dir / "journal" / "orchestrator.jsonl").read_text().splitlines()]
    assert [e["weight_version"] for e in weights if e["event"] == "weights"] == ["v1", "v2", "v3"]
    assert (tmp_path / "work" / "weights" / "step-2" / "weights.json").exists()
