"""`polar-hpc grow` and `shrink`: more gateway and engine nodes for a running run, as Slurm jobs of their own.

`grow(target, spec)` submits one sbatch job (`slurm.render`, the one renderer) of one component
per role it grows, in this order: `spec.engines` nodes shaped like `slurm.gpu` (engine steps), then
`spec.nodes` nodes shaped like `slurm.cpu` unless the spec says otherwise (gateway steps); both: a
hetjob. Any partition, its own `--time` and extra flags. Its batch step runs the member driver
(`launch/member.py --roles engine,gateway`, the roles in het-group order): one step per node, joined
to the run through its `rendezvous.json` and per-role keys. Its output goes to
`<run>/logs/grow-<job>.out`. The run must have a job that is queued or running (ConfigError
otherwise: there is nothing to join); `dry_run` prints the script and submits nothing. Each grow
job is journaled in `<run>/journal/grow.jsonl` (`submitted` {job, main, nodes, engines} here;
`start` and `end` per life by the member driver), never in `driver.jsonl`, which tells the main
job's story. `jobs(run_dir)` lists the run's grow job ids in submission order (status,
accounting); `shrink(target, job)` scancels the run's grow jobs still queued or running (or the
one named): their gateways drain within the stop budget and their sessions are requeued, their
engines deregister; the main job is untouched.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from polar_hpc.config import load_topology
from polar_hpc.errors import ConfigError, SubmissionError
from polar_hpc.launch.rundir import append_event, resolve
from polar_hpc.launch.slurm import ACTIVE, component_flags, job_state, render
from polar_hpc.orchestrator.journal import read_jsonl

JOURNAL = "grow.jsonl"


@dataclass
class GrowSpec:
    nodes: int = 1  # gateway nodes
    partition: str | None = None  # of every component; default: slurm.cpu's and slurm.gpu's
    time: str | None = None  # default: slurm.time
    cpus: int | None = None  # per node; default: slurm.cpu's
    sbatch: tuple[str, ...] = ()  # more flags, e.g. --qos=preemptible
    dry_run: bool = False
    engines: int = 0  # engine nodes, shaped like slurm.gpu


def grow(target: str, spec: GrowSpec) -> tuple[str, Path]:
    """(the grow job's id, or its script with `dry_run`; the run directory)."""
    run_dir, main = resolve(target)
    if spec.nodes < 0 or spec.engines < 0 or spec.nodes + spec.engines < 1 or (spec.cpus is not None and spec.cpus < 1):
        raise ConfigError(f"grow {target}: --nodes and --engines must not be negative nor both 0, --cpus at least 1")
    text = script(run_dir, spec)
    if spec.dry_run:
        return text, run_dir
    state = job_state(main)[0] if main else ""
    if state not in ACTIVE:
        raise ConfigError(f"grow {target}: the run has no job queued or running (job {main or 'none'}"
                          f"{': ' + state if state else ''}); `polar-hpc resume` it first")
    if shutil.which("sbatch") is None:
        raise SubmissionError("grow: no `sbatch` here; run it on a Slurm login node")
    out = subprocess.run(["sbatch", "--parsable"], input=text, capture_output=True, text=True)
    job = out.stdout.strip().partition(";")[0]
    if out.returncode != 0 or not job.isdigit():
        lines = (out.stderr or out.stdout).strip().splitlines() or ["no job id"]
        raise SubmissionError(f"grow {target}: sbatch refused the job: {lines[-1]}")
    append_event(run_dir / "journal" / JOURNAL, "submitted", job=job, main=main, nodes=spec.nodes,
                 engines=spec.engines, partition=spec.partition)
    return job, run_dir


def script(run_dir: Path, spec: GrowSpec) -> str:
    slurm = load_topology(run_dir / "topology.yaml").slurm
    where = {"partition": spec.partition} if spec.partition else {}
    roles = {"engine": slurm.gpu.model_copy(update={"nodes": spec.engines} | where),
             "gateway": slurm.cpu.model_copy(update={"nodes": spec.nodes} | where | ({"cpus": spec.cpus} if spec.cpus else {}))}
    roles = {role: comp for role, comp in roles.items() if comp.nodes}
    slurm = slurm.model_copy(update={"time": spec.time or slurm.time, "job_name": f"{slurm.job_name}-grow"})
    flags = [component_flags(comp, slurm, not n) for n, comp in enumerate(roles.values())]
    flags[0] |= {"output": str(run_dir / "logs" / "grow-%j.out"), "open_mode": "append"}
    member = (f"exec {shlex.quote(sys.executable)} -m polar_hpc member --run-dir {shlex.quote(str(run_dir))} "
              f"--roles {','.join(roles)}")
    return render(flags, list(spec.sbatch), [member])


def jobs(run_dir: Path) -> list[str]:
    """The run's grow jobs, in the order they were submitted (or first started)."""
    return job_ids(read_jsonl(run_dir / "journal" / JOURNAL))


def job_ids(events: list[dict]) -> list[str]:
    """The grow jobs a `journal/grow.jsonl` names, in the order they were submitted (or first started)."""
    return list(dict.fromkeys(str(e["job"]) for e in events if e.get("event") in ("submitted", "start") and e.get("job")))


def shrink(target: str, job: str | None) -> list[str]:
    """scancel the run's grow jobs still queued or running (or only `job`); the ones cancelled."""
    run_dir, _ = resolve(target)
    known = jobs(run_dir)
    if job is not None and job not in known:
        raise ConfigError(f"shrink {target}: job {job} is not a grow job of this run "
                          f"(its grow jobs: {', '.join(known) or 'none'})")
    active = [j for j in ([job] if job else known) if job_state(j)[0] in ACTIVE]
    if active:
        subprocess.run(["scancel", *active], check=False)
    return active
