"""What a Slurm run cost, from Slurm's own accounting, beside what it produced: `<run>/accounting.json`.

- `lives(job_ids, since)`: every life of each job submitted since `since` (a requeued job has one
  per start: `sacct --duplicates`; a job id Slurm used before, on a cluster whose ids restarted,
  is not the run's)
  as `{"job", "life", "state", "start", "end", "elapsed_s", "gpu_s", "cpu_s"}`, the GPU- and
  CPU-seconds summed over the hetjob's components: each component's ElapsedRaw times its
  allocated `gres/gpu` and `cpu` (AllocTRES). A life still running counts up to now (End
  `Unknown`). One `sacct` call, bounded in time (`TIMEOUT_S`) and output (`MAX_BYTES`); where it
  fails (no accounting on the cluster) `AccountingUnavailable` says sacct's own words.
- `read(run_dir)`: the inputs of every cost figure, each read once (`Costs`: the topology, the
  journal's progress, the driver's and the grow jobs' journals, the run's lives from sacct or why
  not, the engines' idle figures from metrics.jsonl, the GPUs of one engine and of one session slot;
  `Costs.products`, the run's products as `RunReader` reads them, on first use). `status` and
  `account` share it.
  - `Costs.slot_gpu_s(session_s)`: GPU-seconds of session time a stop cut short (or a decided
    group's tail ran, or an engine aborted for an update), as the run's GPUs per session slot (the
    share of the engines each slot had) times those seconds. Where the run has grow jobs that share
    is over time, from their lives: every life's GPU-seconds over its session-slot-seconds
    (ElapsedRaw times the job's gateway nodes times `gateway.pools.run`: the main job's
    `slurm.cpu.nodes`, a grow job's from `journal/grow.jsonl`), summed over the run's jobs; else (no
    grow job, or sacct cannot tell) the main job's GPUs over its session slots.
  - `Costs.idle_gpu_s`: GPU-seconds the engines sat with no request running or waiting, from the
    orchestrator's engine readings in metrics.jsonl (`observe.idle`), as the GPUs of one engine
    (`gpus_per_engine`: a grow job's engines are shaped as the run's) times those engine-seconds.
- `account(costs)`: the jobs the run's driver journal names (its `start` events) and its grow
  jobs (`journal/grow.jsonl`, launch/grow.py), their lives since the run was made (its `topology.yaml`),
  and the run's products as `RunReader` reads them (accepted trajectories, trainable tokens),
  with GPU-hours and CPU-hours per accepted trajectory (AccountingUnavailable where sacct could not
  tell) and the GPU-seconds known wasted (`cut` by
  stops, `discarded_by_overprovisioning`, `idle_engines`, and `aborted_by_updates`: the seconds of
  the calls engines aborted for weight updates in accepted trajectories, times the GPUs per slot).
  `write(run_dir, figures)` saves it in one rename, never through a link; the dashboard shows it
  (`RunReader.accounting`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from polar_hpc import nofollow
from polar_hpc.config import Topology, load_topology
from polar_hpc.engines import kinds
from polar_hpc.errors import ToolFailed
from polar_hpc.launch import grow
from polar_hpc.observe.idle import EngineIdle, engine_idle
from polar_hpc.observe.run import ACCOUNTING, RunReader
from polar_hpc.orchestrator.journal import Progress, progress, read_jsonl

TIMEOUT_S = 30.0
MAX_BYTES = 4 << 20
_FIELDS = "JobID,State,Start,End,Submit,ElapsedRaw,AllocTRES"


class AccountingUnavailable(ToolFailed):
    """sacct could not tell (no accounting storage, no such job, sacct missing)."""


def lives(job_ids: list[str], since: float, sacct: str = "sacct") -> list[dict[str, Any]]:
    if not job_ids:
        return []
    after = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))  # sacct reads and writes local time
    try:
        out = subprocess.run([sacct, "-n", "-P", "-X", "--duplicates", "-S", after, "-j", ",".join(job_ids),
                              "-o", _FIELDS], capture_output=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AccountingUnavailable(f"sacct did not answer: {e}") from None
    if out.returncode != 0:
        raise AccountingUnavailable(f"sacct: {out.stderr[:500].decode(errors='replace').strip()}")
    found: dict[tuple[str, str], dict[str, Any]] = {}  # (job, submit) -> life: one per start of the job
    for line in out.stdout[:MAX_BYTES].decode(errors="replace").splitlines():
        row = line.split("|")
        if len(row) != 7:
            continue
        job_id, state, start, end, submit, elapsed, tres = row
        job = job_id.partition("+")[0]
        if job not in job_ids or not elapsed.isdigit() or submit < after:
            continue
        seconds = int(elapsed)
        alloc = _tres(tres)
        life = found.setdefault((job, submit), {"job": job, "state": state.split(" ")[0], "start": start,
                                                "end": end, "elapsed_s": 0, "gpu_s": 0, "cpu_s": 0})
        life["elapsed_s"] = max(life["elapsed_s"], seconds)
        life["gpu_s"] += seconds * alloc.get("gres/gpu", 0)
        life["cpu_s"] += seconds * alloc.get("cpu", 0)
    ordered = sorted(found.values(), key=lambda life: (job_ids.index(life["job"]), life["start"]))
    for n, life in enumerate(ordered):
        life["life"] = sum(1 for x in ordered[:n] if x["job"] == life["job"])
    return ordered


def _tres(text: str) -> dict[str, int]:
    """AllocTRES `billing=1,cpu=2,gres/gpu=2,node=1` as counts (memory and other units left out)."""
    counts = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if value.isdigit():
            counts[name] = int(value)
    return counts


def _gpus(topology: Topology) -> int:
    gpu = topology.slurm.gpu
    count = gpu.gres.rpartition(":")[2] if gpu.gres else ""  # --gres=gpu[:type]:N
    return gpu.nodes * (int(count) if count.isdigit() else gpu.gpus)


@dataclass
class Costs:
    run_dir: Path
    topology: Topology
    progress: Progress
    driver: list[dict[str, Any]]  # journal/driver.jsonl: the lives of the run's main job
    grow_events: list[dict[str, Any]]  # journal/grow.jsonl
    lives: list[dict[str, Any]] | None  # every life of the run's jobs (`run_lives`); None where sacct cannot tell
    unavailable: str  # why `lives` is None
    idle: EngineIdle
    per_engine: float  # GPUs of one engine server
    per_slot: float  # GPUs per session slot
    how: str  # how `per_slot` was found, in words

    def slot_gpu_s(self, session_s: float) -> float:
        return session_s * self.per_slot

    @property
    def idle_gpu_s(self) -> float:
        return self.idle.idle_s * self.per_engine

    @property
    def main_jobs(self) -> list[str]:
        return list(dict.fromkeys(str(e["job"]) for e in self.driver if e.get("event") == "start" and e.get("job")))

    @property
    def grow_jobs(self) -> list[str]:
        return grow.job_ids(self.grow_events)

    @property
    def jobs(self) -> list[str]:
        """The run's jobs: its main jobs', then its grow jobs'."""
        return list(dict.fromkeys(self.main_jobs + self.grow_jobs))

    @cached_property
    def products(self) -> dict[str, Any]:
        """The run's overview as `RunReader` reads it (accepted trajectories, tokens, aborted calls' seconds)."""
        reader = RunReader(self.run_dir)
        reader.poll()
        return reader.overview()


def read(run_dir: Path, sacct: str = "sacct") -> Costs:
    topology = load_topology(run_dir / "topology.yaml")
    costs = Costs(run_dir, topology, progress(run_dir), read_jsonl(run_dir / "journal" / "driver.jsonl"),
                  read_jsonl(run_dir / "journal" / grow.JOURNAL), None, "",
                  engine_idle(run_dir, topology.metrics.interval_s), gpus_per_engine(topology), 0.0, "")
    try:
        costs.lives = run_lives(costs, sacct)
    except AccountingUnavailable as e:
        costs.unavailable = str(e)
    costs.per_slot, costs.how = _share(costs)
    return costs


def _share(costs: Costs) -> tuple[float, str]:
    """(GPUs per session slot, how it was found): over the lives of the run's jobs where it has grow
    jobs, else the main job's shape."""
    topology, slots, grown = costs.topology, _slots(costs), costs.grow_jobs
    counted = [life for life in costs.lives or [] if life["job"] in slots] if grown else []
    gpu_s = sum(life["gpu_s"] for life in counted)
    slot_s = sum(life["elapsed_s"] * slots[life["job"]] for life in counted)
    if slot_s > 0 and any(life["job"] in grown for life in counted):
        return gpu_s / slot_s, f"{gpu_s:.0f} GPU-seconds / {slot_s:.0f} session-slot-seconds over {len(counted)} job lives"
    gpus, main = _gpus(topology), topology.slurm.cpu.nodes * topology.gateway.pools.run
    return gpus / max(1, main), f"{gpus} GPUs / {main} session slots"


def _slots(costs: Costs) -> dict[str, int]:
    """Session slots of each of the run's jobs: its gateway nodes times `gateway.pools.run`."""
    per_node = costs.topology.gateway.pools.run
    slots = {job: costs.topology.slurm.cpu.nodes * per_node for job in costs.main_jobs}
    for e in costs.grow_events:  # a start's nodes are what the job got
        if e.get("job") and (e.get("event") == "start" and isinstance(e.get("nodes"), list)
                             or e.get("event") == "submitted" and str(e["job"]) not in slots):
            nodes = e["nodes"]
            slots[str(e["job"])] = (len(nodes) if isinstance(nodes, list) else int(nodes or 0)) * per_node
    return slots


def run_lives(costs: Costs, sacct: str = "sacct") -> list[dict[str, Any]]:
    """Every life of the run's jobs, its main jobs' then its grow jobs' (`lives`); AccountingUnavailable
    where no job has started or sacct cannot tell."""
    if not costs.jobs:
        raise AccountingUnavailable("no Slurm job has started for this run")
    return lives(costs.jobs, (costs.run_dir / "topology.yaml").stat().st_mtime - 1, sacct)


def gpus_per_engine(topology: Topology) -> float:
    """The GPUs of one engine server, the run's own or a grow job's (both shaped like `slurm.gpu`):
    a GPU node's GPUs over its servers (one scripted engine; `gpus / tp_size` SGLang or vLLM
    servers, `engines.step`)."""
    per_node = _gpus(topology) / max(1, topology.slurm.gpu.nodes)
    scripted = kinds.get(topology.engine.kind).launch is None
    return per_node / (1 if scripted else max(1, int(per_node) // topology.engine.tp_size))


def account(costs: Costs) -> dict[str, Any]:
    if costs.lives is None:
        raise AccountingUnavailable(costs.unavailable)
    found, o, p = costs.lives, costs.products, costs.progress
    jobs = list(dict.fromkeys([life["job"] for life in found] + costs.jobs))
    gpu_h = sum(life["gpu_s"] for life in found) / 3600
    cpu_h = sum(life["cpu_s"] for life in found) / 3600
    accepted = o["trajectories"]
    return {
        "t": time.time(), "jobs": jobs, "lives": found,
        "gpu_hours": gpu_h, "cpu_hours": cpu_h,
        "accepted_trajectories": accepted, "trainable_tokens": o["trainable_tokens"], "tokens": o["tokens"],
        "gpu_hours_per_accepted": gpu_h / accepted if accepted else None,
        "cpu_hours_per_accepted": cpu_h / accepted if accepted else None,
        "wasted_gpu_s": {"cut_by_stops": costs.slot_gpu_s(p.cut_s) if p.cut else 0.0,
                         "discarded_by_overprovisioning": costs.slot_gpu_s(p.discarded_s) if p.discarded else 0.0,
                         "aborted_by_updates": costs.slot_gpu_s(o["aborted_call_s"]),
                         "idle_engines": costs.idle_gpu_s},
    }


def write(run_dir: Path, figures: dict[str, Any]) -> Path:
    temp = run_dir / f".{ACCOUNTING}.tmp"
    with nofollow.fopen(temp, "w") as f:
        json.dump(figures, f, indent=1)
    os.replace(temp, run_dir / ACCOUNTING)
    return run_dir / ACCOUNTING
