"""The driver of a Slurm run: the job's main process, in component 0's batch step.

`drive(run_dir)` (the last line of the `polar-hpc sbatch` script; `job_main`, its submitit entry,
exits with its code) records the job (`rundir.record_job`), starts the orchestrator on this node,
then one `srun --het-group=0 --overlap` engine step per GPU node and one `srun --het-group=1`
gateway step per CPU node (CUDA_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL removed from their
environment), all watched by the run's supervisor (`launch/supervise.py`, as `polar-hpc run`'s
processes are). A step that exits is restarted after a backoff (1, 2, 4… s, at most
`slurm.step_restarts` times); meanwhile the orchestrator requeues its sessions on the other
gateways. When every session has ended it shuts the run down and returns 0. Every other end
returns 1, so Slurm records the job FAILED, never COMPLETED: every engine step (or every gateway
step) used its restarts, the orchestrator exited with sessions left (killed, or stopped by a
client's Shutdown: `polar-hpc cancel`), or a signal stopped it.

Stopping: the stop budget B is a third of the cluster's KillWait (`scontrol show config`), or
`slurm.stop_budget_s`; it is handed to every child (`procs.STOP_BUDGET_ENV`). On a signal the
handler at once journals `end` (marked `stopping`) and removes `rendezvous.json`; then the
orchestrator and every step get SIGTERM together, whatever is left after B gets SIGKILL, and the
final `end` is journaled (`left`, `stopped_in_s`). SIGUSR2 (the job's `--signal`: time limit or
preemption) ends the life `requeued` and asks Slurm to requeue the job (then returns 0); SIGTERM
(scancel, `scontrol requeue`, preemption, the time limit) ends it `signal`, "stopped by Slurm:
SIGTERM". The next life of the job resumes from the journal.

Walltime admission (`admission`): the orchestrator is told (POLAR_ADMIT_UNTIL, POLAR_LIFE_S) by
when a session must end (the allocation's end less `signal_s` and B) and how long a fresh life
lasts; when only sessions it held are left, the life ends at once: `requeued` if a fresh life fits
them and the job may be requeued, else `held`.

Each life appends to `<run>/journal/driver.jsonl`: `{"event": "start", "job", "restart",
"kill_wait_s", "stop_budget_s", "t"}` and, unless the driver is killed (a start with no end),
`{"event": "end", "job", "outcome", "why", "left", "code", "stopped_in_s", "t"}` with outcome
finished, gave_up, orchestrator_exited, cancelled, requeued, held or signal; `polar-hpc status`
reads it to say what happened. The stale `rendezvous.json` is removed.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import zmq

from polar_hpc import procs, security, wire
from polar_hpc.config import load_topology
from polar_hpc.launch.rundir import append_event, record_job
from polar_hpc.launch.supervise import Supervisor
from polar_hpc.orchestrator.journal import progress
from polar_hpc.orchestrator.sessions import ADMIT_UNTIL_ENV, FINAL, HELD, LIFE_ENV

KILL_WAIT_DEFAULT_S = 30.0  # Slurm's default KillWait
_POLAR = [sys.executable, "-m", "polar_hpc"]
_ONE = ["--nodes=1", "--ntasks=1"]
_GPU_ENV = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def nodes(group: int) -> list[str]:
    """Host names of het group `group` of this job."""
    nodelist = os.environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{group}") or os.environ["SLURM_JOB_NODELIST"]
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def job_main(run_dir: Path) -> None:
    """submitit's entry: exit with the driver's code (submitit would record a return value as success)."""
    code = drive(run_dir)
    if code:
        raise SystemExit(code)


def drive(run_dir: Path) -> int:
    run_dir = Path(run_dir)
    topology = load_topology(run_dir / "topology.yaml")
    signals: list[int] = []
    life: _Life | None = None

    def on_signal(signum: int, _frame) -> None:
        signals.append(signum)
        if life is not None:
            life.signalled()  # its first word at once, whatever the main loop is waiting on

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, on_signal)
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        try:
            record_job(job, run_dir)
        except OSError as e:  # e.g. a read-only home on the compute node: status RUN_DIR still works
            print(f"cannot record job {job}: {e}", flush=True)
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    kill_wait = kill_wait_s()
    budget = topology.slurm.stop_budget_s or kill_wait / 3
    os.environ[procs.STOP_BUDGET_ENV] = f"{budget:g}"  # handed down to the orchestrator and every step
    os.environ.update(admission(job, topology.slurm.signal_s + budget))
    _record(run_dir, "start", job=job, restart=restart, kill_wait_s=kill_wait, stop_budget_s=round(budget, 3))
    life = _Life(run_dir, topology, signals, budget, job)
    try:
        life.run(restart)
    except BaseException as e:
        life.why = f"the driver failed: {e!r} (its traceback: the job's output)"
        raise
    finally:
        code = 0 if life.outcome in ("finished", "requeued") else 1
        _record(run_dir, "end", job=job, outcome=life.outcome, why=life.why, left=progress(run_dir).left,
                code=code, stopped_in_s=life.stopped_in_s())
    if life.outcome == "requeued" and job:  # requeued: only a Slurm job is
        subprocess.run(["scontrol", "requeue", job], check=False)
    return code


def kill_wait_s() -> float:
    """The cluster's KillWait (seconds between Slurm's SIGTERM and its SIGKILL); Slurm's default, 30,
    where `scontrol show config` does not say."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return KILL_WAIT_DEFAULT_S
    found = re.search(r"^KillWait\s*=\s*(\d+)", out, re.MULTILINE)
    return float(found.group(1)) if found else KILL_WAIT_DEFAULT_S


def admission(job: str | None, margin_s: float) -> dict[str, str]:
    """The orchestrator's walltime admission: sessions must end `margin_s` (the job's --signal lead
    and the stop budget) before the allocation does, and how long a fresh life offers; from
    SLURM_JOB_END_TIME, else squeue's end time and time limit. Nothing where Slurm does not say."""
    if not job:
        return {}
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e|%l"], capture_output=True, text=True,
                             timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        out = []
    end_text, _, limit_text = (out[0] if out else "").partition("|")
    env = {}
    end = os.environ.get("SLURM_JOB_END_TIME") or _epoch(end_text)
    if end:
        env[ADMIT_UNTIL_ENV] = f"{float(end) - margin_s:.3f}"
    limit = slurm_seconds(limit_text)
    if limit is not None:
        env[LIFE_ENV] = f"{limit - margin_s:.3f}"
    return env


def _epoch(text: str) -> str | None:
    """squeue's local ISO time as unix time; None for N/A, Unknown and the like."""
    try:
        return str(datetime.fromisoformat(text).timestamp())
    except ValueError:
        return None


def slurm_seconds(text: str) -> float | None:
    """A Slurm duration (minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]])
    in seconds; None for UNLIMITED or anything else."""
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "0", text
    parts = rest.split(":")
    if not (days.isdigit() and 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
        return None
    n = [int(p) for p in parts]
    if dash:
        n += [0] * (3 - len(n))
    elif len(n) < 3:
        n = [0, n[0], 0] if len(n) == 1 else [0, *n]
    return float(int(days) * 86400 + n[0] * 3600 + n[1] * 60 + n[2])


class _Life:
    """One life of the job, until the run ends or a signal comes; `outcome` and `why` say how it ended."""

    def __init__(self, run_dir: Path, topology, signals: list[int], budget_s: float, job: str | None) -> None:
        self.run_dir, self.topology, self.signals, self.budget_s = run_dir, topology, signals, budget_s
        self.job, self.requeue = job, topology.slurm.requeue and bool(job)
        self.outcome, self.why = "error", "the driver failed"
        self.ended = False  # the run ended by itself: a later signal changes nothing
        self.stopping_since: float | None = None  # monotonic time a signal was first seen

    def stopped_in_s(self) -> float | None:
        return None if self.stopping_since is None else round(time.monotonic() - self.stopping_since, 3)

    def run(self, restart: str) -> None:
        run_dir, topology, signals = self.run_dir, self.topology, self.signals
        started = time.time()
        (run_dir / "rendezvous.json").unlink(missing_ok=True)  # a previous life's endpoint
        host = socket.gethostname()
        args = ["orchestrator", "--run-dir", str(run_dir), "--host", "0.0.0.0", "--advertise", host]
        args += ["--port", str(topology.slurm.port)]
        sup = Supervisor(say=lambda line: print(line, flush=True))
        orchestrator = sup.add("orchestrator", lambda: procs.spawn("orchestrator", args,
                                                                   run_dir / "logs" / "orchestrator.log"))
        sock = zmq.Context.instance().socket(zmq.DEALER)
        outcome, why, shut_down = "", "", False
        try:
            endpoint = procs.wait_ready(orchestrator, run_dir / "rendezvous.json")["endpoint"]
            print(f"orchestrator at {endpoint}; restart {restart}; stop budget {self.budget_s:g}s", flush=True)
            _start_steps(sup, run_dir, topology, endpoint)
            security.secure_client(sock, run_dir, security.ADMIN)
            sock.connect(endpoint)
            while not signals:
                sup.poll()
                if sup.given_up("orchestrator"):
                    outcome, why = _orchestrator_exit(run_dir, orchestrator.proc.returncode, started)
                    break
                for kind in ("engine", "gateway"):
                    if sup.given_up(kind):
                        outcome, why = "gave_up", f"every {kind} step failed {topology.slurm.step_restarts + 1} times"
                if outcome:
                    break
                reply = _status(sock)
                if reply is not None and reply.done:
                    sock.send(wire.encode(wire.Shutdown(reason="all sessions ended")))
                    orchestrator.wait_exit(30)
                    outcome, why, shut_down = "finished", "all sessions ended", True
                    break
                held = {} if topology.service.enabled else _only_held(reply)  # a service run may get more
                if held:  # nothing runs and nothing else will: no idling until the time limit
                    sock.send(wire.encode(wire.Shutdown(reason="only held sessions left")))
                    orchestrator.wait_exit(30)
                    (outcome, why), shut_down = self._held(held), True
                    break
                time.sleep(0.5)
            if not outcome:  # a signal
                return
            self.ended = True
            self.outcome, self.why = outcome, why
            if outcome != "finished":
                print(f"{why}: {'giving up' if outcome == 'gave_up' else 'stopping'} ({outcome}); "
                      "a next life of the job resumes from the journal", flush=True)
        finally:
            if signals:  # everyone at once, within the budget: nobody waits for another to go first
                self.signalled()
                sup.stop(grace_s=self.budget_s)
            else:  # after a Shutdown the steps exit on their own
                sup.stop(grace_s=20, wait_s=15 if shut_down else 0)
            sock.close(linger=0)
            (run_dir / "rendezvous.json").unlink(missing_ok=True)

    def _held(self, held: dict[str, int]) -> tuple[str, str]:
        """How a life with only held sessions left ends: requeued when a fresh life fits them all."""
        n = sum(held.values())
        if "held_too_long" in held:
            return "held", (f"{n} sessions held: {held['held_too_long']} have a timeout_s longer than the job's "
                            "time limit allows (resume with a longer slurm.time)")
        if self.requeue:
            return "requeued", f"{n} sessions held: they cannot end before this allocation does; the next life runs them"
        return "held", f"{n} sessions held: they cannot end before this allocation does (polar-hpc resume runs them)"

    def signalled(self) -> None:
        """The first word on a signal, before anything is stopped: `end` journaled (updated once the
        processes are down) and the endpoint withdrawn. Called from the signal handler."""
        if self.stopping_since is not None or self.ended or not self.signals:
            return
        self.stopping_since = time.monotonic()
        first = self.signals[0]
        name = signal.Signals(first).name
        if self.requeue and first == signal.SIGUSR2:
            self.outcome, self.why = "requeued", f"stopped by Slurm: {name} (the job's --signal: time limit or preemption)"
        else:
            self.outcome = "signal"
            self.why = f"stopped by Slurm: {name}" if first != signal.SIGINT else f"stopped: {name}"
        print(f"got signal {first} ({name}): stopping within {self.budget_s:g}s ({self.outcome}); "
              "a next life of the job resumes from the journal", flush=True)
        (self.run_dir / "rendezvous.json").unlink(missing_ok=True)
        code = 0 if self.outcome == "requeued" else 1
        _record(self.run_dir, "end", job=self.job, outcome=self.outcome, why=self.why, left=None, code=code,
                stopping=True)


def _orchestrator_exit(run_dir: Path, returncode: int, started: float) -> tuple[str, str]:
    """Why the orchestrator exited on its own: the run is done, a client stopped it, or it died."""
    p = progress(run_dir)
    if p.left == 0:
        return "finished", "all sessions ended"
    if p.shutdown is not None and p.shutdown.get("t", 0) >= started:
        return "cancelled", f"stopped by a client: {p.shutdown.get('reason', '')}"
    return "orchestrator_exited", f"the orchestrator exited with code {returncode}"


def _record(run_dir: Path, event: str, **fields) -> None:
    append_event(run_dir / "journal" / "driver.jsonl", event, **fields)


def _start_steps(sup: Supervisor, run_dir: Path, topology, endpoint: str) -> None:
    """One engine step per GPU node, one gateway step per CPU node, each restarted up to
    `slurm.step_restarts` times."""
    steps = [engine_step(run_dir, node, node, topology.engine.kind, topology.slurm.gpu.cpus, ["--het-group=0"])
             for node in nodes(0)]
    for node in nodes(1):
        steps.append(gateway_step(run_dir, node, node, endpoint, topology.slurm.cpu.cpus, ["--het-group=1"]))
    for name, argv, env, log in steps:
        sup.add(name, functools.partial(procs.spawn_command, name, argv, log, env), restarts=topology.slurm.step_restarts)


def engine_step(run_dir: Path, node: str, tag: str, kind: str, cpus: int,
                srun_flags: list[str]) -> tuple[str, list[str], dict[str, str], Path]:
    """(name, argv, environment, log) of an engine step on `node`, the run's (`tag` = the node) or a
    grow job's (launch/member.py, `tag` = g<job>-<node>): named `engine-<tag>`, its engines
    `<tag>-<i>`, log `logs/step-engine-<tag>.log`; `--overlap`, as it shares its node with the batch step."""
    argv = ["srun", *srun_flags, "--overlap", *_ONE, f"--nodelist={node}", f"--cpus-per-task={cpus}"]
    argv += _POLAR + ["engine", "--kind", kind, "--run-dir", str(run_dir), "--tag", tag]
    return f"engine-{tag}", argv, dict(os.environ), run_dir / "logs" / f"step-engine-{tag}.log"


def gateway_step(run_dir: Path, node: str, tag: str, endpoint: str, cpus: int,
                 srun_flags: list[str]) -> tuple[str, list[str], dict[str, str], Path]:
    """(name, argv, environment, log) of a gateway step on `node`, the run's (`tag` = the node) or a
    grow job's (launch/member.py, `tag` = g<job>-<node>): named `gateway-<tag>`, gateway id
    `gw-<tag>`, log `logs/step-gateway-<tag>.log`; the GPU variables removed from its environment."""
    argv = ["srun", *srun_flags, *_ONE, f"--nodelist={node}", f"--cpus-per-task={cpus}"]
    argv += _POLAR + ["gateway", "--run-dir", str(run_dir), "--orchestrator", endpoint, "--gateway-id", f"gw-{tag}"]
    env = {k: v for k, v in os.environ.items() if k not in _GPU_ENV}
    return f"gateway-{tag}", argv, env, run_dir / "logs" / f"step-gateway-{tag}.log"


def _status(sock: zmq.Socket) -> wire.StatusReply | None:
    sock.send(wire.encode(wire.StatusRequest()))
    if not sock.poll(1000):
        return None
    reply = wire.decode(sock.recv())
    return reply if isinstance(reply, wire.StatusReply) else None


def _only_held(reply: wire.StatusReply | None) -> dict[str, int]:
    """The held sessions by state when nothing else is left to run; empty otherwise."""
    if reply is None:
        return {}
    left = {state: n for state, n in reply.states.items() if n and state not in FINAL}
    return left if left and set(left) <= set(HELD) else {}

