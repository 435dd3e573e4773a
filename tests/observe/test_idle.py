"""Engine idle time from the orchestrator's lines of metrics.jsonl, against hand-computed figures:
an engine up with nothing running or waiting is idle until the next line, a gap longer than twice
the interval (the job between two lives) counts nothing, engines down or not answering count
nothing, and other writers' lines, torn lines and a linked log are never counted. `polar-hpc
status` of a Slurm run states the idle engine-seconds and their GPU-seconds."""

from __future__ import annotations

import json
from pathlib import Path

from polar_hpc.launch import accounting
from polar_hpc.launch.status import story
from polar_hpc.observe.idle import engine_idle


def _line(t: float, **engines: tuple[int, int, int]) -> str:
    return json.dumps({"t": t, "source": "orchestrator", "run": {}, "processes": {},
                       "engines": {url: {"up": up, "running": r, "waiting": w, "weight_version": 0}
                                   for url, (up, r, w) in engines.items()}}) + "\n"


def _metrics(run: Path) -> None:
    (run / "metrics.jsonl").write_text(
        _line(100, a=(1, 0, 0), b=(1, 2, 0))        # a idle 5 s, b busy 5 s
        + json.dumps({"t": 102, "state": "running"}) + "\n"  # the dashboard's own line: not the orchestrator's
        + _line(105, a=(1, 0, 1), b=(1, 0, 0))      # a busy 5 s (waiting), b idle 5 s
        + '{"t": 107, "source": "orchestr'          # torn by a crash
        + "\n" + _line(110, a=(1, 0, 0), b=(0, 0, 0))  # a idle until the gap; b down
        + _line(500, a=(1, 0, 0), b=(1, 0, 0))      # 390 s later (between two lives): nothing counted for 110;
        + _line(503, a=(1, 1, 0), b=(1, 0, 0)))     # both idle 3 s; the last line counts nothing


def test_idle_engine_seconds_are_counted_between_lines(tmp_path: Path) -> None:
    _metrics(tmp_path)
    idle = engine_idle(tmp_path, interval_s=5.0)
    assert (idle.idle_s, idle.busy_s, idle.most_up, idle.partial) == (5 + 5 + 3 + 3, 5 + 5, 2, False)
    (tmp_path / "topology.yaml").write_text("slurm:\n  gpu:\n    nodes: 2\n    gpus: 4\n")
    assert accounting.read(tmp_path).idle_gpu_s == 16 * 4  # a scripted engine per node of 4 GPUs
    (tmp_path / "topology.yaml").write_text("engine:\n  kind: vllm\n  tp_size: 2\nslurm:\n  gpu:\n    nodes: 2\n    gpus: 4\n")
    assert accounting.read(tmp_path).idle_gpu_s == 16 * 2  # 2 servers of tp_size 2 per node, as many on a grow job's node


def test_a_linked_metrics_log_is_not_read(tmp_path: Path) -> None:
    away = tmp_path / "away"
    away.mkdir()
    _metrics(away)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(away / "metrics.jsonl")
    idle = engine_idle(run, interval_s=5.0)
    assert (idle.idle_s, idle.partial) == (0.0, True)


def test_status_of_a_slurm_run_states_the_idle_gpu_seconds(tmp_path: Path) -> None:
    _metrics(tmp_path)
    (tmp_path / "topology.yaml").write_text("engine:\n  kind: sglang\nslurm:\n  gpu:\n    nodes: 1\n    gpus: 2\n")
    (tmp_path / "journal").mkdir()
    (tmp_path / "tasks.jsonl").write_text("")
    local = [line for line in story(None, "", accounting.read(tmp_path)) if line.startswith("idle engines")]
    assert local == ["idle engines: 16 engine-seconds with no request running or waiting (62% of their time)"]
    (tmp_path / "journal" / "driver.jsonl").write_text(json.dumps({"event": "start", "job": "7"}) + "\n")
    costs = accounting.read(tmp_path, sacct="/nonexistent/sacct")  # no accounting: the idle figures stand alone
    (line,) = [line for line in story("7", "", costs) if line.startswith("idle engines")]
    assert line.endswith("(62% of their time), wasted 16 GPU-seconds (1 GPUs per engine)"), line  # 2 servers of 1 GPU
