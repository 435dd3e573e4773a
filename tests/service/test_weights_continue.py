"""update_weights(mode="continue") while calls are in flight (a real service run: orchestrator,
gateway, proxy, scripted engine; harnesses using the openai SDK, one streaming, one not): the calls
are not lost nor retried, they go on across the update, and every sampled token carries the
version that sampled it: exactly the tokens the engine sampled before the update are v0, the rest
v1. The calls are held in flight by the engine's script (a pause of an hour after "five"), not
by timing; tokens up to it are due at once, so the boundary is known from the engine's plan.
The shard readers, the staleness Filter, pad_batch and the export all see the per-token versions."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from polar_hpc.client import Client
from polar_hpc.shards import Filter, pad_batch
from polar_hpc.shards.export import export
from polar_hpc.shards.reader import iter_trajectories

from service.helpers import samples_begun, service_job

HARNESS = Path(__file__).parent / "data" / "sdk_count.py"
RULES = """
- when: Count to ten
  reply: one two three four five six seven eight nine ten
  pause_after: five
  pause_ms: 3600000
"""
HOUR = 3600


@pytest.mark.timeout(600)  # a real service run on a busy 2-core machine
def test_calls_go_on_across_an_update_with_per_token_versions(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    topology = f"""
service: {{enabled: true, weight_update_mode: wait}}
engine: {{script: {tmp_path / "rules.yaml"}, sample_log: true}}
sandbox: {{backend: none}}
gateway: {{shard_max_age_s: 0.2}}
"""
    tasks = [{"id": mode, "instruction": "x", "num_samples": 1, "timeout_s": 240,
              "harness": {"command": f"{sys.executable} sdk_count.py {mode}"},
              "sandbox": {"files": {"sdk_count.py": str(HARNESS)}}} for mode in ("stream", "whole")]
    with service_job(tmp_path, topology) as (job, run_dir), Client(run_dir) as client:
        batch = client.submit(tasks)
        deadline = time.monotonic() + 120
        while len(samples_begun(run_dir)) < 2:  # both generations began: each is held after "five"
            assert time.monotonic() < deadline, client.status(batch)
            time.sleep(0.02)
        update = client.update_weights(tmp_path / "weights-1", "v1", mode="continue")
        assert update.mode == "continue" and update.errors == [] and len(update.engines) == 1, update
        assert client.wait(batch, timeout_s=120).states == {"completed": 2}
        client.drain()
        assert job.wait(timeout=120) == 0
    samples = samples_begun(run_dir)
    assert len(samples) == 2  # one generation per call: none aborted, none retried
    trajectories = {t.task_id: t for t in iter_trajectories(run_dir)}
    assert set(trajectories) == {"stream", "whole"}
    for task, traj in trajectories.items():
        (trace,) = traj.traces
        sample = next(s for s in samples if s["input_ids"] == trace.prompt_ids.tolist())  # both alike
        assert sample["weight_version"] == "v0"  # the sample log: the version it began on
        before = sum(t < sample["t"][0] + HOUR / 2 for t in sample["t"])  # the tokens up to "five"
        n = len(sample["output_ids"])
        assert 0 < before < n
        assert trace.response_ids.tolist() == sample["output_ids"]  # token-exact, one generation
        assert trace.logprobs.tolist() == sample["output_logprobs"]
        assert trace.token_versions == ["v0"] * before + ["v1"] * (n - before), task
        assert trace.weight_versions == ["v1"] and "aborted_attempts" not in traj.metadata

    ordered = [trajectories["stream"], trajectories["whole"]]
    assert all(Filter(weight_versions=(0, None)).passes(t) for t in ordered)
    assert not any(Filter(weight_versions=(1, None)).passes(t) for t in ordered)  # its oldest token is v0
    batch_arrays = pad_batch(ordered)
    for row, traj in enumerate(ordered):
        trace = traj.traces[0]
        p, total = len(trace.prompt_ids), trace.n_tokens
        versions = batch_arrays["token_versions"][row]
        assert (versions[:p] == -1).all() and (versions[total:] == -1).all()
        assert versions[p:total].tolist() == [int(v[1:]) for v in trace.token_versions]
        assert np.diff(versions[p:total]).min() >= 0 and set(versions[p:total].tolist()) == {0, 1}
    assert export(run_dir, tmp_path / "out.jsonl", "jsonl") == 2
    rows = {r["task_id"]: r for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert {task: rows[task]["token_versions"] for task in rows} == {
        task: t.traces[0].token_versions for task, t in trajectories.items()}
