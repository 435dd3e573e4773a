"""update_weights while 64 sessions of a service run are mid-call: no session is lost, each call
records the version that produced it (v0 for the calls in flight, v1 for calls after), and
`polar-hpc status` shows the versions in flight. Cancelling a running batch ends its sessions
`cancelled`, their trajectories written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from polar_hpc.client import Client
from polar_hpc.shards.reader import iter_trajectories
from tests.conftest import polar

from service.helpers import samples_begun, service_job

HARNESS = Path(__file__).parent / "data" / "one_call.py"
TOPOLOGY = """
service: {enabled: true}
engine: {token_delay_ms: 1500, sample_log: true}  # the log gets a line as each generation begins
sandbox: {backend: none}
gateway:
  pools: {init: 64, ready: 0, run: 64, postrun: 16}
  shard_max_age_s: 0.2
"""


def _task(tid: str, samples: int) -> dict:
    return {"id": tid, "instruction": "x", "num_samples": samples, "timeout_s": 300,
            "harness": {"command": "python3 one_call.py"}, "sandbox": {"files": {"one_call.py": str(HARNESS)}}}


@pytest.mark.timeout(600)  # 64 real sessions on a busy 2-core machine
def test_update_weights_while_64_sessions_are_mid_call(tmp_path: Path) -> None:
    with service_job(tmp_path, TOPOLOGY) as (job, run_dir), Client(run_dir) as client:
        busy = client.submit([_task("busy", 64)])
        deadline = time.monotonic() + 120
        # every harness's call is decoding: 24 tokens x 1.5 s holds the first in flight for 36 s, while the
        # other 63 begin and status answers (on a loaded 2-core machine they took over 10 s)
        while len(samples_begun(run_dir)) < 64:
            assert time.monotonic() < deadline, client.status(busy)
            time.sleep(0.05)
        assert client.run_status().versions_in_flight == {"v0": 64}
        shown = polar("status", run_dir)
        assert shown.returncode == 0 and "weight versions in flight: v0 64" in shown.stdout, shown.stdout
        update = client.update_weights(tmp_path / "weights-1", "v1")
        assert update.errors == [] and len(update.engines) == 1, update
        after = client.submit([_task("after", 2)])
        assert client.wait(busy, timeout_s=240).states == {"completed": 64}
        assert client.wait(after, timeout_s=120).states == {"completed": 2}
        assert client.run_status().versions_in_flight == {}
        doomed = client.submit([_task("doomed", 2)])
        while client.status(doomed)[doomed].states.get("RUN", 0) < 2:
            assert time.monotonic() < deadline + 120, client.status(doomed)
            time.sleep(0.05)
        assert client.cancel(batch_id=doomed) == 2  # running: cancelled through the gateway
        assert client.wait(doomed, timeout_s=120).states == {"cancelled": 2}
        client.drain()
        assert job.wait(timeout=120) == 0
    versions: dict[str, list[str]] = {"busy": [], "after": []}
    every = list(iter_trajectories(run_dir))
    assert sorted(t.status for t in every if t.task_id == "doomed") == ["cancelled", "cancelled"]
    for traj in (t for t in every if t.task_id != "doomed"):
        assert traj.status == "completed" and len(traj.traces) == 1 and len(traj.traces[0].weight_versions) == 1
        versions[traj.task_id] += traj.traces[0].weight_versions
    assert len(versions["busy"]) == 64 and versions["after"] == ["v1", "v1"]
    assert versions["busy"] == ["v0"] * 64  # the calls in flight ended on the weights they began with
