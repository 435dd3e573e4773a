"""Export round-trips token ids, masks and logprobs exactly; Parquet loads with HF `datasets`."""

from __future__ import annotations

import json

import pytest

from polar_hpc.config import ConfigError
from polar_hpc.shards import Filter, ShardWriter, iter_trajectories
from polar_hpc.shards.export import export
from polar_hpc.trajectory.model import Trace

from shards.helpers import attempt, journal, queued, result


@pytest.fixture
def run(tmp_path, make_traj):
    trajs = [make_traj("a", 0, n=300), make_traj("a", 1, status="timeout", reward=None), make_traj("b", 0, n=0)]
    trajs[0].traces.append(Trace([5], [6, 7], [1, 0], [float("-inf"), 0.0], [], [], "length", ["v2"], [4]))
    stray = attempt(make_traj("a", 1, reward=-5.0), 1)
    with ShardWriter(tmp_path / "shards", "gw0", 1 << 20, 60) as w:
        names = [w.append(t) for t in [*trajs, stray]]
    journal(tmp_path, *(queued(t.task_id, t.sample_index) for t in trajs),
            *(result(t, n) for t, n in zip(trajs, names)))
    return tmp_path


def _expected(run):
    return [(t, i, tr) for t in iter_trajectories(run) for i, tr in enumerate(t.traces)]


def test_parquet_round_trip_and_datasets(run, tmp_path):
    import datasets
    import pyarrow.parquet as pq

    out = tmp_path / "out" / "run.parquet"
    out.parent.mkdir()
    assert export(run, out, "parquet", rows_per_group=2) == 4
    assert [p.name for p in out.parent.iterdir()] == ["run.parquet"]
    table = pq.read_table(out).to_pylist()
    loaded = datasets.load_dataset("parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert len(loaded) == 4
    for row, hf, (traj, i, trace) in zip(table, loaded, _expected(run), strict=True):
        for got in (row, hf):
            assert got["session_id"] == traj.session_id and got["trace_index"] == i
            assert got["prompt_ids"] == trace.prompt_ids.tolist() and got["response_ids"] == trace.response_ids.tolist()
            assert got["loss_mask"] == trace.loss_mask.tolist() and got["logprobs"] == trace.logprobs.tolist()
            assert got["reward"] == traj.reward and json.loads(got["messages"]) == trace.messages
            assert json.loads(got["metadata"]) == traj.metadata


def test_jsonl_round_trip_with_filter(run, tmp_path):
    out = tmp_path / "run.jsonl"
    assert export(run, out, "jsonl", Filter(status="completed")) == 3
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    expected = [(t, i, tr) for t, i, tr in _expected(run) if t.status == "completed"]
    for got, (traj, i, trace) in zip(lines, expected, strict=True):
        assert (got["task_id"], got["sample_index"], got["trace_index"]) == (traj.task_id, traj.sample_index, i)
        assert got["response_ids"] == trace.response_ids.tolist() and got["loss_mask"] == trace.loss_mask.tolist()
        assert got["logprobs"] == trace.logprobs.tolist()  # float32 values print and parse back exactly


def test_unknown_format_is_refused(run, tmp_path):
    with pytest.raises(ConfigError, match="export format 'csv'"):
        export(run, tmp_path / "x.csv", "csv")
    assert not (tmp_path / "x.csv").exists()
