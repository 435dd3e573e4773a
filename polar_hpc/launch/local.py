"""`polar-hpc run`: the whole job on this machine, as the same processes a cluster runs.

Validates the task file and topology first (nothing is started on bad input), lays out the run
directory with the run's keys (as a Slurm run: CURVE on every TCP link, the engine's API key, so
other users of the machine can neither connect nor call the engine), starts the engine, the
orchestrator and one gateway (which starts its proxy). The scripted engine is given to the
orchestrator and gateway by URL; any other kind (`engine.kind: vllm` on a CPU machine) runs as the
engine step of a Slurm run does (`polar-hpc engine --kind KIND --run-dir RUN`, engines.step): it
registers its server with the orchestrator, which relays it to the gateway. Every
process is watched by the supervisor the Slurm driver uses (`launch/supervise.py`), with no
restarts: one that exits ends the run with its log's tail. The run shows sessions moving through
the pipeline, and when every session has ended shuts the processes
down and prints a summary read back from the shards. With `--service` (or `service.enabled`) the run
starts with no tasks (or the file's) and goes on until a trainer drains it (docs/service.md).
Ctrl-C stops every process; sessions that were running are written as `cancelled`, so nothing
captured is lost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import zmq
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from polar_hpc import procs, security, wire
from polar_hpc.config import Topology
from polar_hpc.engines import command as engine_command
from polar_hpc.engines import kinds
from polar_hpc.launch.rundir import prepare
from polar_hpc.launch.summary import print_summary
from polar_hpc.launch.supervise import Supervisor

STAGES = ("queued", "INIT", "READY", "RUN", "POSTRUN")


@dataclass
class LocalRun:
    tasks_path: Path | None  # None: a service run fed by trainers
    topology_path: Path | None
    run_dir: Path | None
    service: bool = False  # trainers feed the run (polar_hpc.client); it ends when one drains it


def run_local(spec: LocalRun, console: Console) -> int:
    run_dir, tasks, topology = prepare(spec.tasks_path, spec.topology_path, spec.run_dir, spec.service)
    security.create_keys(run_dir)
    t0 = time.monotonic()
    sup = Supervisor(say=console.print)  # no restarts here: any exit ends the run
    interrupted = shut_down = False
    try:
        if kinds.get(topology.engine.kind).launch is None:  # the scripted engine, by URL
            engine_url = _start_engine(run_dir, topology, sup)
            endpoint = _start_orchestrator(run_dir, sup, [engine_url])
            engine_args = ["--engine-url", engine_url]
        else:  # registered by its engine step
            endpoint = _start_orchestrator(run_dir, sup, [])
            step = ["engine", "--kind", topology.engine.kind, "--run-dir", str(run_dir)]
            sup.add("engine", lambda: procs.spawn("engine", step, run_dir / "logs" / "step-engine-local.log"),
                    ends_itself=False)
            engine_args = []
        args = ["gateway", "--run-dir", str(run_dir), "--orchestrator", endpoint, *engine_args, "--gateway-id", "local0"]
        sup.add("gateway", lambda: procs.spawn("gateway", args, run_dir / "logs" / "gateway-local.log"))
        if topology.service.enabled:
            console.print(f"service run in {run_dir}: trainers connect with polar_hpc.client.Client(run_dir)")
        shut_down = _follow(run_dir, endpoint, sup, sum(t.num_samples for t in tasks), console)
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: stopping every process[/yellow]")
    finally:  # after the Shutdown the orchestrator and gateway exit on their own; the engine is stopped
        sup.stop(grace_s=15.0, wait_s=30.0 if shut_down else 0.0)
    print_summary(run_dir, time.monotonic() - t0, console)
    return 130 if interrupted else 0


def _start_engine(run_dir: Path, topology: Topology, sup: Supervisor) -> str:
    ready = run_dir / ".engine.ready"
    args = engine_command.scripted(topology.engine, run_dir, port=0, ready_file=ready)
    log, env = run_dir / "logs" / "engine-local.log", security.engine_env(run_dir)
    child = sup.add("engine", lambda: procs.spawn("engine", args, log, env), ends_itself=False)
    return procs.wait_ready(child, ready)["url"]


def _start_orchestrator(run_dir: Path, sup: Supervisor, engine_urls: list[str]) -> str:
    log = run_dir / "logs" / "orchestrator.log"
    args = ["orchestrator", "--run-dir", str(run_dir)] + [a for url in engine_urls for a in ("--engine-url", url)]
    child = sup.add("orchestrator", lambda: procs.spawn("orchestrator", args, log))
    return procs.wait_ready(child, run_dir / "rendezvous.json")["endpoint"]


def _follow(run_dir: Path, endpoint: str, sup: Supervisor, total: int, console: Console) -> bool:
    """Poll the orchestrator's status until every session has ended; then ask it to shut down."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    security.secure_client(sock, run_dir, security.ADMIN)
    sock.connect(endpoint)
    columns = [TextColumn("sessions"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[stages]}"),
               TimeElapsedColumn()]
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            bar = progress.add_task("sessions", total=total, stages="")
            while True:
                status = _status(sock, sup)
                ended = status.total - sum(status.states.get(s, 0) for s in STAGES + ("assigned",))
                stages = "  ".join(f"{s} {status.states.get(s, 0)}" for s in STAGES[1:])
                progress.update(bar, total=max(total, status.total), completed=ended, stages=stages)
                if status.done:
                    break
                time.sleep(0.2)
        sock.send(wire.encode(wire.Shutdown(reason="all sessions ended")))
        return True
    finally:
        sock.close()


def _status(sock: zmq.Socket, sup: Supervisor) -> wire.StatusReply:
    sup.check()  # a child that died (a gateway that could not start its sandboxes) ends the run
    sock.send(wire.encode(wire.StatusRequest()))
    while not sock.poll(500):
        sup.check()
    reply = wire.unpack(sock.recv_multipart(), 1)
    assert isinstance(reply, wire.StatusReply)
    return reply
