"""`polar-hpc submit` / `sbatch`: one Slurm heterogeneous job per run, through submitit.

Component 0 = `slurm.gpu` nodes (engine steps), component 1 = `slurm.cpu` nodes (gateway steps);
the driver (`launch/driver.py`) runs in component 0's batch step. `render` is the one renderer of
a polar-hpc sbatch script (`script`, the run's job; `launch/grow.py`, a grow job); template
`slurm/hetjob.sbatch.j2`: component 0's `#SBATCH` lines and
`slurm.extra_sbatch`, the `#SBATCH hetjob` block, the command, `exec`ed so the batch shell *is* the
driver and the `B:USR2@signal_s` signal reaches it). `HetSlurmExecutor` is a submitit
`SlurmExecutor` that submits that script with submitit's command (which unpickles and calls
`driver.job_main`); of the job submitit returns only its id is used. `render_sbatch` gives the
same script with the driver's own command line, for teams that submit by hand. `submit`
prepares the run directory (0700) with per-run CURVE keys, submits, records `<run>/job.json` and
an index entry so `status JOBID` finds the run. `resume` submits a new job for a run whose job has
ended before its sessions did (refused while a job of the run is still queued or running); it
continues from the journal. `job_state` is Slurm's word on a job: squeue while it is queued, else
sacct (state, exit code; a hetjob's is its `ID+0` row's).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
from submitit.core.utils import FailedJobError, JobPaths
from submitit.slurm.slurm import SlurmExecutor

from polar_hpc import assets, security
from polar_hpc.config import SlurmComponent, SlurmConfig, Topology, load_topology
from polar_hpc.errors import ConfigError, SubmissionError
from polar_hpc.launch.driver import job_main
from polar_hpc.launch.rundir import prepare, record_job, resolve
from polar_hpc.orchestrator.journal import progress

TEMPLATES = assets.folder("slurm")
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
          "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED")  # the job may still run


class HetSlurmExecutor(SlurmExecutor):
    """submitit's SlurmExecutor, submitting the run's own script (`script`) with submitit's command."""

    def __init__(self, folder: Path, topology: Topology) -> None:
        super().__init__(folder=folder)
        self.topology = topology

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        output = str(JobPaths(self.folder).stdout).replace("%t", "0")  # where submitit looks for it
        return script(self.topology, output, ["export SUBMITIT_EXECUTOR=slurm", f"exec {command}"])


def component_flags(comp: SlurmComponent, slurm: SlurmConfig, job_wide: bool) -> dict[str, str | bool]:
    flags: dict[str, str | bool] = {"nodes": str(comp.nodes), "ntasks_per_node": "1", "cpus_per_task": str(comp.cpus)}
    for key, value in (("partition", comp.partition), ("mem", comp.mem), ("gres", comp.gres),
                       ("constraint", comp.constraint), ("account", slurm.account), ("qos", slurm.qos)):
        if value:
            flags[key] = value
    if comp.gpus and not comp.gres:
        flags["gpus_per_node"] = str(comp.gpus)
    flags["time"] = slurm.time
    flags["job_name"] = slurm.job_name
    if job_wide:
        flags["signal"] = f"B:USR2@{slurm.signal_s}"
        flags["requeue" if slurm.requeue else "no_requeue"] = True
    return flags


def sbatch_lines(flags: dict[str, str | bool]) -> list[str]:
    """`#SBATCH --key=value` lines, sorted, keys with dashes (as submitit writes them)."""
    lines = []
    for key, value in sorted(flags.items()):
        key = key.replace("_", "-")
        lines.append(f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={value}")
    return lines


def script(topology: Topology, output: str, command: list[str]) -> str:
    """The job's sbatch script: both components' `#SBATCH` lines, `slurm.extra_sbatch` with
    component 0's, then `command`."""
    slurm = topology.slurm
    first = component_flags(slurm.gpu, slurm, True) | {"output": output, "open_mode": "append"}
    return render([first, component_flags(slurm.cpu, slurm, False)], slurm.extra_sbatch, command)


def render(components: list[dict[str, str | bool]], extra: list[str], command: list[str]) -> str:
    """The one renderer of a polar-hpc sbatch script (template `slurm/hetjob.sbatch.j2`): each
    component's flags (several: a hetjob; one: a plain job, as `polar-hpc grow` submits), `extra`
    flags with the first component's, then `command`."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    return env.get_template("hetjob.sbatch.j2").render(
        components=[sbatch_lines(c) for c in components], extra=extra, command=command)


def dry_run(topology: Topology, run_dir: Path) -> str:
    """The sbatch script `submit` would hand to Slurm (nothing is written)."""
    ex = HetSlurmExecutor(run_dir / "slurm", topology)
    return ex._make_submission_file_text(ex._submitit_command_str, "dry-run")


def render_sbatch(topology: Topology, run_dir: Path) -> str:
    """The same script for submitting by hand: its command runs the driver, its output goes to logs/."""
    driver = f"exec {shlex.quote(sys.executable)} -m polar_hpc driver --run-dir {shlex.quote(str(run_dir))}"
    return script(topology, str(run_dir / "logs" / "slurm-%j.out"), [driver])


def prepare_run(tasks_path: Path | None, topology_path: Path | None, run_dir: Path | None) -> tuple[Path, Topology]:
    run_dir, _, topology = prepare(tasks_path, topology_path, run_dir)
    security.create_keys(run_dir)
    return run_dir, topology


def submit(tasks_path: Path | None, topology_path: Path | None, run_dir: Path | None) -> tuple[str, Path]:
    """Submit the run; a job Slurm refuses leaves no run directory behind (SubmissionError)."""
    _need_sbatch("submit")
    run_dir, topology = prepare_run(tasks_path, topology_path, run_dir)
    try:
        return _submit_job(run_dir, topology, topology_path), run_dir
    except (ConfigError, SubmissionError):  # nothing was submitted: the new folder goes too
        shutil.rmtree(run_dir, ignore_errors=True)
        raise


def resume(target: str) -> tuple[str, Path]:
    """A new job for an existing run (a run directory or a job id); it resumes from the journal."""
    _need_sbatch("resume")
    run_dir, job_id = resolve(target)
    state = job_state(job_id)[0] if job_id else ""
    if state in ACTIVE:
        raise SubmissionError(f"{target}: job {job_id} of this run is {state}; one job per run "
                          f"(`polar-hpc cancel {job_id}` first)")
    topology = load_topology(run_dir / "topology.yaml")
    p = progress(run_dir)
    if p.total and not p.left and not topology.service.enabled:
        raise SubmissionError(f"{target}: nothing to resume: all {p.total} sessions of the run have ended")
    return _submit_job(run_dir, topology, run_dir / "topology.yaml"), run_dir


def _need_sbatch(command: str) -> None:
    if shutil.which("sbatch") is None:
        raise SubmissionError(f"{command}: no `sbatch` here; run it on a Slurm login node (or --dry-run, or polar-hpc run)")


def _submit_job(run_dir: Path, topology: Topology, source: Path | None) -> str:
    try:
        job = HetSlurmExecutor(run_dir / "slurm", topology).submit(job_main, run_dir)
    except (FailedJobError, OSError) as e:
        raise SubmissionError(f"{source}: sbatch refused the job: {_last_line(str(e))}") from None
    record_job(job.job_id, run_dir)
    return job.job_id


def _last_line(message: str) -> str:
    lines = [x.strip() for x in message.splitlines() if x.strip()]
    return next((x for x in reversed(lines) if "error" in x.lower()), lines[-1] if lines else message)


def job_state(job_id: str) -> tuple[str, str]:
    """Slurm's (state, exit code) of the job (its leader's, for a hetjob), e.g. ("RUNNING", ""),
    ("FAILED", "1:0"): squeue while it is queued, else sacct; ("UNKNOWN", "") when neither knows it."""
    queued = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    if queued.returncode == 0 and queued.stdout.split():
        return queued.stdout.split()[0], ""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode"],
                         capture_output=True, text=True)
    rows = {r[0]: r[1:] for r in (x.split("|") for x in out.stdout.splitlines()) if len(r) == 3}
    state, code = rows.get(job_id) or rows.get(f"{job_id}+0") or ("UNKNOWN", "")
    return (state.split() or ["UNKNOWN"])[0], code  # "CANCELLED by 0" -> CANCELLED
