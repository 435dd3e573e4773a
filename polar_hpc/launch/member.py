"""The member driver of a grow job (`polar-hpc grow`, launch/grow.py): the job's batch step.

`serve(run_dir)` starts one gateway step per node of the job (`srun`, gateway id
`gw-g<job>-<node>`, `driver.gateway_step`, watched by the run's one supervisor with
`slurm.step_restarts` restarts) against the endpoint in `<run>/rendezvous.json`, with the run's
gateway key, as the run's own gateways are. It waits while there is no endpoint (the main job
pending, or between two lives); when the endpoint changes or goes (a new life, a new orchestrator)
it stops its gateways (SIGTERM: they drain within the stop budget) and starts them again with the
new one. A gateway that exits 0 was let go by its orchestrator (Shutdown): it is not restarted
until the endpoint changes. The orchestrator treats them as any gateway: a leaving one's cancelled
sessions are journaled `interrupted` and run again, a silent one's are requeued, each once.

It ends when the run's main job (`<run>/job.json`) is no longer queued or running and no endpoint
is up: exit 0 when the driver journal's last word is `end` with outcome `finished`, else 1
(`run_stopped`); or when every gateway step used its restarts (`gave_up`, 1); or on a signal
(scancel, preemption, the time limit, the job's `--signal`): the gateways get SIGTERM at once and
SIGKILL after the stop budget B (a third of KillWait, or `slurm.stop_budget_s`), outcome
`signal` (1; `left` and 0 for SIGUSR2, the job's own signal before its time limit).

Each life of the grow job appends to `<run>/journal/grow.jsonl` (never `driver.jsonl`, the main
job's story): `start` {job, restart, nodes, stop_budget_s}, `joined` {job, endpoint} per
orchestrator it joins, and `end` {job, outcome, why, code, stopped_in_s}.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from pathlib import Path

from polar_hpc import nofollow, procs
from polar_hpc.config import load_topology
from polar_hpc.launch.driver import gateway_step, kill_wait_s, nodes
from polar_hpc.launch.grow import JOURNAL
from polar_hpc.launch.rundir import append_event, resolve
from polar_hpc.launch.slurm import ACTIVE, job_state
from polar_hpc.launch.supervise import Supervisor
from polar_hpc.orchestrator.journal import read_jsonl

MAIN_CHECK_S = 5.0  # how often squeue is asked about the main job while no endpoint is up


def serve(run_dir: Path) -> int:
    run_dir = Path(run_dir).resolve()
    topology = load_topology(run_dir / "topology.yaml")
    signals: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: signals.append(signum))
    job = os.environ.get("SLURM_JOB_ID", "local")
    budget = topology.slurm.stop_budget_s or kill_wait_s() / 3
    os.environ[procs.STOP_BUDGET_ENV] = f"{budget:g}"
    hosts = nodes(0)
    journal = run_dir / "journal" / JOURNAL
    append_event(journal, "start", job=job, restart=os.environ.get("SLURM_RESTART_COUNT", "0"), nodes=hosts,
                 stop_budget_s=round(budget, 3))
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK") or topology.slurm.cpu.cpus)
    outcome, why, stopped_in = "error", "the member driver failed (its traceback: the job's output)", None
    joined: dict | None = None  # the rendezvous whose orchestrator the gateways were started for
    sup: Supervisor | None = None
    checked = 0.0
    try:
        while not signals:
            current = _rendezvous(run_dir)
            if sup is not None and current != joined:  # that orchestrator has gone: leave it
                sup.stop(grace_s=budget)
                sup = None
            if sup is None and current is not None and current != joined:
                joined, sup = current, Supervisor(say=lambda line: print(line, flush=True))
                for node in hosts:
                    name, argv, env, log = gateway_step(run_dir, node, f"g{job}-{node}", current["endpoint"], cpus, [])
                    sup.add(name, functools.partial(procs.spawn_command, name, argv, log, env),
                            restarts=topology.slurm.step_restarts, done_on_success=True)
                append_event(journal, "joined", job=job, endpoint=current["endpoint"])
                print(f"joined the orchestrator at {current['endpoint']} with {len(hosts)} gateways", flush=True)
            if sup is not None:
                sup.poll()
                if sup.given_up("gateway"):
                    outcome, why = "gave_up", f"every gateway step failed {topology.slurm.step_restarts + 1} times"
                    break
            if current is None and time.monotonic() - checked >= MAIN_CHECK_S:
                checked = time.monotonic()
                ended = _main_ended(run_dir)
                if ended is not None:
                    outcome, why = ended
                    break
            time.sleep(0.5)
        if signals:
            name = signal.Signals(signals[0]).name
            outcome = "left" if signals[0] == signal.SIGUSR2 else "signal"
            why = f"stopped by Slurm: {name}" if signals[0] != signal.SIGINT else f"stopped: {name}"
            print(f"got signal {signals[0]} ({name}): leaving the run within {budget:g}s", flush=True)
    finally:
        started = time.monotonic()
        if sup is not None:
            sup.stop(grace_s=budget)
        if signals:
            stopped_in = round(time.monotonic() - started, 3)
        code = 0 if outcome in ("finished", "left") else 1
        append_event(journal, "end", job=job, outcome=outcome, why=why, code=code, stopped_in_s=stopped_in)
    return code


def _rendezvous(run_dir: Path) -> dict | None:
    """The orchestrator's rendezvous (endpoint, pid: a new life writes a new one), or None."""
    try:
        info = json.loads(nofollow.read_text(run_dir / "rendezvous.json"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("endpoint"), str) else None


def _main_ended(run_dir: Path) -> tuple[str, str] | None:
    """(outcome, why) once the run's main job is neither queued nor running; None while it is."""
    _, main = resolve(str(run_dir))
    state = job_state(main)[0] if main else "UNKNOWN"
    if state in ACTIVE:
        return None
    ends = [e for e in read_jsonl(run_dir / "journal" / "driver.jsonl") if e.get("event") == "end"]
    if ends and ends[-1].get("outcome") == "finished":
        return "finished", "the run finished: all sessions ended"
    last = f"{ends[-1].get('outcome')}: {ends[-1].get('why')}" if ends else "no end journaled"
    return "run_stopped", f"the run's job {main} is {state} ({last}); nothing to join"
