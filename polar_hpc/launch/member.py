"""The member driver of a grow job (`polar-hpc grow`, launch/grow.py): the job's batch step.

`serve(run_dir, roles)` starts one step per node of each of the job's components (`roles`, in
het-group order: `engine`, `gateway`), with the builders the run's own driver uses: an engine step
(`driver.engine_step`, engines `g<job>-<node>-<i>`) or a gateway step (`driver.gateway_step`,
gateway id `gw-g<job>-<node>`), each watched by the run's one supervisor with `slurm.step_restarts`
restarts. They join the orchestrator in `<run>/rendezvous.json` with the run's engine or gateway
key, as the run's own steps do. It waits while there is no endpoint (the main job pending, or
between two lives); when the endpoint changes or goes (a new life, a new orchestrator) it stops its
steps (SIGTERM: gateways drain within the stop budget, engines deregister) and starts them again
for the new one. A step that exits 0 was let go by its orchestrator (Shutdown): it is not restarted
until the endpoint changes. The orchestrator treats them as any of its own: a leaving gateway's
cancelled sessions are journaled `interrupted` and run again, a silent one's are requeued, each
once; a leaving engine is dropped from every proxy's routing (EngineBye), and a call it can no
longer answer is retried on another engine.

It ends when the run's main job (`<run>/job.json`) is no longer queued or running and no endpoint
is up: exit 0 when the driver journal's last word is `end` with outcome `finished`, else 1
(`run_stopped`); or when every gateway (or every engine) step used its restarts (`gave_up`, 1); or
on a signal (scancel, preemption, the time limit, the job's `--signal`): the steps get SIGTERM at once and
SIGKILL after the stop budget B (a third of KillWait, or `slurm.stop_budget_s`), outcome
`signal` (1; `left` and 0 for SIGUSR2, the job's own signal before its time limit).

Each life of the grow job appends to `<run>/journal/grow.jsonl` (never `driver.jsonl`, the main
job's story): `start` {job, restart, nodes (the gateway nodes), engine_nodes, stop_budget_s}, `joined` {job, endpoint} per
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
from polar_hpc.launch.driver import engine_step, gateway_step, kill_wait_s, nodes
from polar_hpc.launch.grow import JOURNAL
from polar_hpc.launch.rundir import append_event, resolve
from polar_hpc.launch.slurm import ACTIVE, job_state
from polar_hpc.launch.supervise import Supervisor
from polar_hpc.orchestrator.journal import read_jsonl

MAIN_CHECK_S = 5.0  # how often squeue is asked about the main job while no endpoint is up


ROLES = ("engine", "gateway")


def serve(run_dir: Path, roles: tuple[str, ...] = ("gateway",)) -> int:
    run_dir = Path(run_dir).resolve()
    topology = load_topology(run_dir / "topology.yaml")
    signals: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: signals.append(signum))
    job = os.environ.get("SLURM_JOB_ID", "local")
    budget = topology.slurm.stop_budget_s or kill_wait_s() / 3
    os.environ[procs.STOP_BUDGET_ENV] = f"{budget:g}"
    hosts = {role: nodes(group) for group, role in enumerate(roles)}
    journal = run_dir / "journal" / JOURNAL
    append_event(journal, "start", job=job, restart=os.environ.get("SLURM_RESTART_COUNT", "0"),
                 nodes=hosts.get("gateway", []), engine_nodes=hosts.get("engine", []), stop_budget_s=round(budget, 3))
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
                for name, argv, env, log in _steps(run_dir, topology, roles, hosts, job, current["endpoint"]):
                    sup.add(name, functools.partial(procs.spawn_command, name, argv, log, env),
                            restarts=topology.slurm.step_restarts, done_on_success=True)
                append_event(journal, "joined", job=job, endpoint=current["endpoint"])
                print(f"joined the orchestrator at {current['endpoint']} with "
                      + ", ".join(f"{len(h)} {role}s" for role, h in hosts.items()), flush=True)
            if sup is not None:
                sup.poll()
                failed = next((role for role in roles if sup.given_up(role)), None)
                if failed:
                    outcome, why = "gave_up", f"every {failed} step failed {topology.slurm.step_restarts + 1} times"
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


def _steps(run_dir: Path, topology, roles: tuple[str, ...], hosts: dict[str, list[str]], job: str,
           endpoint: str) -> list[tuple[str, list[str], dict[str, str], Path]]:
    """The job's steps, one per node of each component (`--het-group` where the job has several)."""
    steps = []
    for group, role in enumerate(roles):
        het = [f"--het-group={group}"] if len(roles) > 1 else []
        given = os.environ.get(f"SLURM_CPUS_PER_TASK_HET_GROUP_{group}" if len(roles) > 1 else "SLURM_CPUS_PER_TASK")
        cpus = int(given or (topology.slurm.gpu if role == "engine" else topology.slurm.cpu).cpus)
        for node in hosts[role]:
            if role == "engine":
                steps.append(engine_step(run_dir, node, f"g{job}-{node}", topology.engine.kind, cpus, het))
            else:
                steps.append(gateway_step(run_dir, node, f"g{job}-{node}", endpoint, cpus, het))
    return steps


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
