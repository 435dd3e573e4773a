"""update_weights(mode="abort") while the sessions of a real service run are mid-call (harnesses
using the official openai SDK, with its retries, through the proxy): no session is lost; each
aborted call is retried by the SDK and completes on the new version; every generation the engine
began under the old weights either became a record or is counted as an aborted attempt in the
trajectory of its session; recorded tokens are exactly what the engine sampled (both turns of a
session in one token-exact trace)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from polar_hpc.client import Client
from polar_hpc.launch import accounting
from polar_hpc.launch.status import waste
from polar_hpc.observe.run import RunReader
from polar_hpc.shards.reader import iter_trajectories

from e2e.helpers import sampled_runs
from service.helpers import samples_begun, service_job

HARNESS = Path(__file__).parent / "data" / "sdk_two_calls.py"
SESSIONS = 16
TOPOLOGY = f"""
service: {{enabled: true, weight_update_mode: wait}}
engine: {{token_delay_ms: 100, sample_log: true}}  # the log gets a line as each generation begins
sandbox: {{backend: none}}
gateway:
  pools: {{init: {SESSIONS}, ready: 0, run: {SESSIONS}, postrun: 4}}
  shard_max_age_s: 0.2
"""


@pytest.mark.timeout(600)  # 64 real sessions on a busy 2-core machine
def test_abort_mode_update_loses_no_session(tmp_path: Path) -> None:
    task = {"id": "t", "instruction": "x", "num_samples": SESSIONS, "timeout_s": 300,
            "harness": {"command": f"{sys.executable} sdk_two_calls.py"},
            "sandbox": {"files": {"sdk_two_calls.py": str(HARNESS)}}}
    with service_job(tmp_path, TOPOLOGY) as (job, run_dir), Client(run_dir) as client:
        batch = client.submit([task])
        deadline = time.monotonic() + 120
        while len(samples_begun(run_dir)) < SESSIONS:  # every session's first call has reached the engine
            assert time.monotonic() < deadline, client.status(batch)
            time.sleep(0.02)
        update = client.update_weights(tmp_path / "weights-1", "v1", mode="abort")  # not the topology's wait
        assert update.mode == "abort" and update.errors == [] and len(update.engines) == 1, update
        assert client.wait(batch, timeout_s=240).states == {"completed": SESSIONS}
        client.drain()
        assert job.wait(timeout=120) == 0
    samples = samples_begun(run_dir)
    trajectories = list(iter_trajectories(run_dir))
    assert len(trajectories) == SESSIONS and all(t.status == "completed" for t in trajectories)
    aborted: list[str] = []
    aborted_s = 0.0
    recorded_v0 = 0
    for traj in trajectories:
        assert len(traj.traces) == 1 and traj.traces[0].call_indices == [0, 1]  # both turns, one chain
        trace = traj.traces[0]
        notes = {int(k): v for k, v in traj.metadata.get("aborted_attempts", {}).items()}
        for index, version in zip(trace.call_indices, trace.weight_versions):
            if index in notes:  # a retried call ran on the new weights
                assert version == "v1" and notes[index]["count"] == len(notes[index]["versions"])
                aborted += notes[index]["versions"]
                assert notes[index]["seconds"] > 0  # each began before the update: engine time lost
                aborted_s += notes[index]["seconds"]
            recorded_v0 += version == "v0"
        for call, (start, end) in zip(trace.call_indices, sampled_runs(trace.loss_mask.tolist())):
            # token-exact: each sampled span is the whole sample of the surviving attempt
            prompt = (trace.prompt_ids + trace.response_ids[:start]).tolist()
            assert {"input_ids": prompt, "output_ids": trace.response_ids[start:end].tolist(),
                    "output_logprobs": trace.logprobs[start:end].tolist(),
                    "weight_version": trace.weight_versions[call]} in [
                {k: s[k] for k in ("input_ids", "output_ids", "output_logprobs", "weight_version")}
                for s in samples], (traj.session_id, call)
    v0_begun = sum(s["weight_version"] == "v0" for s in samples)
    assert aborted and set(aborted) == {"v0"}  # the update aborted calls in flight, begun on v0
    assert v0_begun == recorded_v0 + len(aborted)  # every v0 generation: recorded, or aborted and retried
    reader = RunReader(run_dir)
    reader.poll()
    assert reader.overview()["aborted_call_s"] == pytest.approx(aborted_s)  # accounting's aborted_by_updates
    said = [line for line in waste(accounting.read(run_dir)) if line.startswith("aborted by weight updates")]
    assert said == [f"aborted by weight updates: {aborted_s:.0f} call-seconds in accepted trajectories"]  # status says it
    journal = [json.loads(line) for line in (run_dir / "journal" / "orchestrator.jsonl").read_text().splitlines()]
    assert [(e["weight_version"], e["mode"]) for e in journal if e["event"] == "weights_update"] == [("v1", "abort")]
