"""`polar-hpc status` and `polar-hpc cancel` for a Slurm run, named by run directory or job id.

A job id is looked up in `~/.polar-hpc/jobs/` (written by submit, and by the driver when a job
starts). Status shows the Slurm state and exit code (squeue, else sacct) of the run's job and of
each of its grow jobs (`polar-hpc grow`, launch/grow.py), then asks the
orchestrator (over CURVE with the run's keys) for the engines and gateways (up, load), sessions
by state, throughput and ETA, and where its Prometheus /metrics is. When it cannot be reached it
tells the run's story from the files: sessions ended (by status) and never ended, from the
journal; why the last life of the job stopped, from `<run>/journal/driver.jsonl` (a start with no
end: the driver was killed; an end still marked `stopping`: it was killed while its processes
stopped), with Slurm's word on who stopped it (scancel, preemption, time limit; a requeued job is
queued again); and, for a run whose job has ended with sessions left, the command that resumes it.
Cancel of a job not started yet (pending, requeued) is `scancel` at once; of a running job it asks
the orchestrator to shut the run down cleanly (gateways write what they hold, the driver exits) and
falls back to `scancel`; a job that has already ended is said to be so at once.
`status --watch` is a live terminal view read from the run dir (polar_hpc.observe.RunReader):
progress and ETA, sessions by stage, rewards per task, tokens, the commonest errors; it refreshes
every `every_s` until the run has finished or stopped (or Ctrl-C), then prints the last view.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import zmq
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table

from polar_hpc import nofollow, security, wire
from polar_hpc.launch import accounting
from polar_hpc.launch.rundir import resolve
from polar_hpc.launch.slurm import ACTIVE, job_state
from polar_hpc.observe.run import RunReader


def ask(run_dir: Path, msg: wire.Message, timeout_s: float = 3.0) -> wire.AnyMessage | None:
    """Send one message to the run's orchestrator; its reply, or None when nobody answered."""
    rendezvous = run_dir / "rendezvous.json"
    try:
        endpoint = json.loads(nofollow.read_text(rendezvous))["endpoint"]
    except FileNotFoundError:
        return None
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        security.secure_client(sock, run_dir, security.ADMIN)
        sock.setsockopt(zmq.LINGER, 500)
        sock.connect(endpoint)
        sock.send(wire.encode(msg))
        if isinstance(msg, wire.Shutdown):
            return None
        return wire.decode(sock.recv()) if sock.poll(int(timeout_s * 1000)) else None
    finally:
        sock.close()


def show(target: str, console: Console) -> None:
    run_dir, job_id = resolve(target)
    state, code = job_state(job_id) if job_id else ("", "")
    console.print(f"run {run_dir}")
    if job_id is None:
        console.print("slurm job: none has started for this run yet (a job submitted by hand with the "
                      "`polar-hpc sbatch` script is recorded when its driver starts)", soft_wrap=True)
    else:
        console.print(f"slurm job {job_id}: {state}" + (f" (exit code {code})" if code else ""))
    costs = accounting.read(run_dir)
    for job in costs.grow_jobs:
        grown, grown_code = job_state(job)
        console.print(f"grow job {job}: {grown}" + (f" (exit code {grown_code})" if grown_code else ""))
    reply = ask(run_dir, wire.StatusRequest())
    if not isinstance(reply, wire.StatusReply):
        for line in story(job_id, state, costs):
            console.print(escape(line), soft_wrap=True)
        console.print(escape(cost(costs)), soft_wrap=True)
        return
    table = Table("kind", "name", "host", "up", "load", "detail")
    for m in reply.members:
        table.add_row(m.kind, m.name, m.host, "up" if m.up else "down", str(m.load), m.detail)
    console.print(table)
    eta = f"{reply.eta_s:.0f}s" if reply.eta_s is not None else "-"
    console.print(f"sessions {reply.total}: {_states(reply.states)}")
    if reply.versions_in_flight:
        console.print(f"weight versions in flight: {_states(reply.versions_in_flight)}")
    console.print(f"throughput {reply.sessions_per_s * 60:.1f} sessions/min, ETA {eta}, tokens {reply.tokens}")
    for line in waste(costs):
        console.print(escape(line), soft_wrap=True)
    url = json.loads(nofollow.read_text(run_dir / "rendezvous.json")).get("metrics_url")
    if url:
        console.print(f"Prometheus: {url} (its bearer token: metrics_token in {run_dir / 'rendezvous.json'})")
    console.print(escape(cost(costs)), soft_wrap=True)


def watch_run(target: str, console: Console, every_s: float = 2.0) -> None:
    run_dir, job_id = resolve(target)
    reader = RunReader(run_dir)
    reader.poll()
    console.print(f"watching {escape(str(run_dir))} (Ctrl-C to stop)", soft_wrap=True)
    try:
        with Live(_view(reader, job_id), console=console, refresh_per_second=1 / every_s, transient=False) as live:
            while reader.overview()["state"] == "running" and (job_id is None or job_state(job_id)[0] in ACTIVE):
                time.sleep(every_s)
                reader.poll()
                live.update(_view(reader, job_id))
    except KeyboardInterrupt:
        pass


def _view(reader: RunReader, job_id: str | None) -> Group:
    o = reader.overview()
    eta = "-" if o["eta_s"] is None else f"{o['eta_s']:.0f}s"
    head = (f"run {escape(o['run_dir'])}" + (f"  job {job_id}" if job_id else "") + f"  [bold]{o['state']}[/]  "
            f"{o['done']}/{o['total']} sessions ended ({_states(o['by_status'])})  "
            f"{o['sessions_per_s'] * 60:.1f}/min  ETA {eta}")
    stages = Table(*o["stages"], title="sessions by stage")
    stages.add_row(*(str(n) for n in o["stages"].values()))
    tasks = Table("task", "ended", "mean reward", title="rewards per task")
    for t in o["tasks"][:15]:
        mean = t["reward"]["mean"]
        tasks.add_row(escape(t["task_id"]), _states(t["by_status"]), "-" if mean is None else f"{mean:.3f}")
    errors = Table("count", "error kind", title=f"errors ({o['errors_total']})")
    for e in reader.errors.view(5):
        errors.add_row(str(e["count"]), escape(e["kind"]))
    figures = (f"tokens {o['tokens']} ({o['trainable_tokens']} trainable, {o['tokens_per_s']:.0f}/s)  calls {o['calls']}"
               f"  chain breaks {o['chain_breaks']}  requeues {o['requeues']}  weight versions "
               f"{_states(o['weight_versions'])}")
    return Group(head, ProgressBar(total=max(1, o["total"]), completed=o["done"]), stages, figures, tasks, errors)


def story(job_id: str | None, state: str, costs: accounting.Costs) -> list[str]:
    """What happened to a run whose orchestrator does not answer, from its files."""
    p = costs.progress
    lines = [f"orchestrator not reachable; from the journal: {sum(p.ended.values())} of {p.total} sessions "
             f"ended ({_states(dict(p.ended))}), {p.left} never ended"] + waste(costs)
    last = costs.driver[-1] if costs.driver else None
    if state in ACTIVE:
        lines.append(f"the job is {state}: its orchestrator is not up (yet); it continues from the journal")
        if last is not None and last.get("event") == "end" and last.get("job") == job_id and state != "RUNNING":
            lines.append(f"requeued: its last life {_ended(last)}")
        return lines
    if last is None:
        lines.append("no driver has started for this run")
    elif last.get("event") != "end":
        lines.append(f"stopped: the driver of job {last.get('job')} ended without saying why: it was killed "
                     "(kill -9, out of memory, node failure); Slurm's state above")
    elif last.get("outcome") == "finished":
        lines.append(f"finished: {last.get('why')}")
    else:
        lines.append(_ended(last) + (f" ({_BY_SLURM[state]})" if state in _BY_SLURM else ""))
    if p.left and job_id is not None:
        lines.append(f"resume: polar-hpc resume {job_id}   (a new job; what ended is not redone; "
                     f"or `scontrol requeue {job_id}` while Slurm still lists the job)")
    return lines


def waste(costs: accounting.Costs) -> list[str]:
    """Sessions held by walltime admission, the GPU time lost to attempts a stop cut short or a
    decided group's tail ran (their seconds since dispatch times the run's GPUs per session slot, the
    share of the engines each had) and to calls engines aborted for weight updates (their seconds in
    accepted trajectories, the same way), and the GPU time engines sat idle (`Costs.idle_gpu_s`)."""
    p, lines = costs.progress, []
    if p.held:
        lines.append(f"held: {p.held} sessions not started, their timeout_s cannot end before the allocation does")
    for what, n, seconds in (("cut by stops", p.cut, p.cut_s), ("discarded by over-provisioning", p.discarded,
                                                                 p.discarded_s)):
        if n:
            lines.append(f"{what}: {n} sessions, {seconds:.0f} session-seconds, wasted "
                         f"{costs.slot_gpu_s(seconds):.0f} GPU-seconds ({costs.how})")
    on_slurm = bool(costs.driver)  # a local run's engines hold no GPUs
    aborted_s = costs.products["aborted_call_s"]
    if aborted_s:
        lines.append(f"aborted by weight updates: {aborted_s:.0f} call-seconds in accepted trajectories"
                     + (f", wasted {costs.slot_gpu_s(aborted_s):.0f} GPU-seconds ({costs.how})" if on_slurm else ""))
    idle = costs.idle
    if idle.idle_s:
        share = idle.idle_s / (idle.idle_s + idle.busy_s)
        lines.append(f"idle engines: {idle.idle_s:.0f} engine-seconds with no request running or waiting "
                     f"({share:.0%} of their time)" + (f", wasted {costs.idle_gpu_s:.0f} GPU-seconds "
                                                       f"({costs.per_engine:g} GPUs per engine)" if on_slurm else ""))
    return lines


def cost(costs: accounting.Costs) -> str:
    """The run's cost from Slurm's accounting, in a line, also saved as `<run>/accounting.json`."""
    try:
        figures = accounting.account(costs)
    except accounting.AccountingUnavailable as e:
        return f"cost: not known ({e})"
    try:
        saved = f"in {accounting.write(costs.run_dir, figures)}"
    except OSError as e:  # a run directory this user may read but not write
        saved = f"not saved: {e}"
    each = figures["gpu_hours_per_accepted"]
    return (f"cost: {figures['gpu_hours']:.3f} GPU-hours, {figures['cpu_hours']:.3f} CPU-hours over "
            f"{len(figures['lives'])} job lives; {figures['accepted_trajectories']} accepted trajectories"
            + (f", {each:.4f} GPU-hours each" if each is not None else "")
            + f"; {figures['trainable_tokens']} trainable tokens ({saved})")


_NOT_STARTED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING")  # no driver runs
_BY_SLURM = {"CANCELLED": "scancel", "PREEMPTED": "preempted", "TIMEOUT": "time limit", "NODE_FAIL": "node failure"}


def _ended(end: dict) -> str:
    """A life's `end` record in words; one written as the stop began (`stopping`) and never updated
    means the driver was killed while its processes stopped."""
    words = f"stopped ({end.get('outcome')}): {end.get('why')}"
    if end.get("stopping"):
        words += "; killed before every process was down (more than KillWait)"
    elif end.get("stopped_in_s") is not None:
        words += f"; every process down in {end['stopped_in_s']:.1f}s"
    return words


def _states(states: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(states.items())) or "none"


def cancel(target: str, console: Console, wait_s: float = 60.0) -> None:
    run_dir, job_id = resolve(target)
    if job_id is not None:
        state, code = job_state(job_id)
        if state == "UNKNOWN":
            console.print(f"Slurm no longer knows job {job_id} (it ended long ago); nothing to cancel")
            return
        if state not in ACTIVE:
            console.print(f"job {job_id} has already ended ({state}{f', exit code {code}' if code else ''}); "
                          "nothing to cancel")
            return
        if state in _NOT_STARTED:  # no orchestrator to ask: it must not start
            subprocess.run(["scancel", job_id], check=False)
            console.print(f"job {job_id} was {state}: scancel sent, it will not start")
            return
    ask(run_dir, wire.Shutdown(reason="polar-hpc cancel"))
    console.print(f"asked the orchestrator of {run_dir} to stop")
    if job_id is None:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if job_state(job_id)[0] not in ACTIVE:
            console.print(f"job {job_id} ended")
            return
        time.sleep(1)
    subprocess.run(["scancel", job_id], check=False)
    console.print(f"job {job_id} did not stop within {wait_s:.0f}s: scancel sent")
