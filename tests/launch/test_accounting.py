"""A run's cost with grow jobs, against hand-computed figures: every life of the main job and of each
grow job counts its GPU- and CPU-seconds (sacct's ElapsedRaw times AllocTRES), and the GPU share of a
session slot is over time, over every job's slots (a gateway grow job adds slots and no GPUs, an
engine grow job GPUs and no slots). sacct is a stand-in script printing sacct's own `-P` rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar_hpc.launch import accounting

ROWS = [  # JobID|State|Start|End|Submit|ElapsedRaw|AllocTRES, as `sacct -n -P -X --duplicates -o ...` prints them
    "7+0|COMPLETED|2099-01-01T00:00:01|2099-01-01T00:01:41|2099-01-01T00:00:00|100|billing=1,cpu=1,gres/gpu=2,node=1",
    "7+1|COMPLETED|2099-01-01T00:00:01|2099-01-01T00:01:41|2099-01-01T00:00:00|100|billing=2,cpu=2,mem=1G,node=1",
    "9|CANCELLED by 0|2099-01-01T00:00:20|2099-01-01T00:01:10|2099-01-01T00:00:10|50|billing=2,cpu=2,node=1",
    "10|CANCELLED by 0|2099-01-01T00:00:30|2099-01-01T00:01:10|2099-01-01T00:00:20|40|billing=1,cpu=1,gres/gpu=1,node=1",
]


def _run(tmp_path: Path, grown: bool) -> tuple[Path, str]:
    run = tmp_path / "run"
    (run / "journal").mkdir(parents=True)
    (run / "tasks.jsonl").write_text("")
    (run / "topology.yaml").write_text("gateway:\n  pools: {run: 4}\nslurm:\n  gpu: {nodes: 1, gpus: 2}\n  cpu: {nodes: 1}\n")
    (run / "journal" / "driver.jsonl").write_text(json.dumps({"event": "start", "job": "7"}) + "\n")
    if grown:  # 9: one gateway node; 10: one engine node; 11: two gateway nodes, never started
        events = [{"event": "submitted", "job": "9", "nodes": 1, "engines": 0},
                  {"event": "submitted", "job": "10", "nodes": 0, "engines": 1},
                  {"event": "start", "job": "9", "nodes": ["n1"], "engine_nodes": []},
                  {"event": "start", "job": "10", "nodes": [], "engine_nodes": ["n0"]},
                  {"event": "submitted", "job": "11", "nodes": 2, "engines": 0}]
        (run / "journal" / "grow.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    sacct = tmp_path / "sacct"
    rows = [r for r in ROWS if grown or r.startswith("7+")]
    sacct.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'asked'}\nprintf '%s\\n' " + " ".join(f"'{r}'" for r in rows) + "\n")
    sacct.chmod(0o755)
    return run, str(sacct)


def test_grow_jobs_lives_count_and_share_the_gpus_per_session_slot(tmp_path: Path) -> None:
    run, sacct = _run(tmp_path, grown=True)
    costs = accounting.read(run, sacct)
    asked = (tmp_path / "asked").read_text().splitlines()
    assert len(asked) == 1 and "-j 7,9,10,11 " in asked[0]  # sacct asked once: the main job, then each grow job
    assert [(x["job"], x["elapsed_s"], x["gpu_s"], x["cpu_s"]) for x in costs.lives or []] == [
        ("7", 100, 200, 300), ("9", 50, 0, 100), ("10", 40, 40, 40)]
    # GPU-seconds 200 + 0 + 40 = 240 over session-slot-seconds 100 * 4 + 50 * 4 + 40 * 0 = 600: 0.4 GPUs per slot
    assert costs.slot_gpu_s(30.0) == pytest.approx(30 * 0.4)
    assert costs.how == "240 GPU-seconds / 600 session-slot-seconds over 3 job lives"
    figures = accounting.account(costs)
    assert figures["jobs"] == ["7", "9", "10", "11"] and len(figures["lives"]) == 3
    assert (figures["gpu_hours"], figures["cpu_hours"]) == (pytest.approx(240 / 3600), pytest.approx(440 / 3600))


def test_without_grow_jobs_the_share_is_the_main_jobs_shape(tmp_path: Path) -> None:
    run, sacct = _run(tmp_path, grown=False)
    costs = accounting.read(run, sacct)
    assert (costs.slot_gpu_s(30.0), costs.how) == (30 * 2 / 4, "2 GPUs / 4 session slots")  # the lives are not the share
    figures = accounting.account(costs)
    assert (figures["gpu_hours"], figures["cpu_hours"]) == (pytest.approx(200 / 3600), pytest.approx(300 / 3600))
