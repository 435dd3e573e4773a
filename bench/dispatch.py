"""Dispatch throughput of the orchestrator: sessions per second through K gateways, null harness.

Starts a real orchestrator (`polar-hpc orchestrator`, over CURVE as in a Slurm run) and K simulated
gateways spread over a few processes (`--procs`; each gateway its own DEALER socket and CURVE
connection, so the orchestrator sees K peers), speaking the real protocol: Hello, Credit for
`slots` slots, and for every session of an Assign the four stage updates (INIT, READY, RUN,
POSTRUN), a Result and a Credit at once (the harness does nothing), coalesced by the real
gateway's `Outbox` into one Report per gateway per poll round, as a gateway does per loop turn:
the stage updates never reach the orchestrator. With `--stages` each stage of an Assign's sessions
goes in a Report of its own (as when every stage takes a loop turn of a real gateway), so the
orchestrator also takes and journals four `state` items per session.

Figures, one JSON object per case:
- `sessions_per_s`: N sessions over the time from the first `assigned` to the last `result` in
  the orchestrator's own journal.
- `orchestrator_cpu_s_per_1000`: its CPU time (user + system, /proc) from its ready signal to the
  end of the run, per 1,000 sessions: dispatch alone. `orchestrator_startup_cpu_s`: its CPU time
  before that (imports, reading the task file, journaling every session `queued`).
- `orchestrator_ceiling_per_s`: 1,000 / cpu_s_per_1000, the rate one free core would reach at
  that cost; the figure to read on a loaded machine, where the simulated gateways on the same
  cores can be the bottleneck. `gateways_cpu_s_per_1000`: what the simulated gateways spent
  (their whole life, connecting included).
- `orchestrator_peak_rss_mb`: its peak resident memory (VmHWM); `load_1min`: the machine's load
  average at the end.
The default runs K = 64 gateways x 4 slots, then the scale case, 1,000 gateways x 64 slots (64,000
sessions in flight), in one run; the last line is a JSON list with one object per case.

    uv run python bench/dispatch.py [--cases 64x4:100000 1000x64:200000] [--procs 4] [--stages]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import zmq

from polar_hpc import procs, security, wire
from polar_hpc.gateway.server import Outbox


def gateways(run_dir: str, endpoint: str, names: list[str], slots: int, stages: bool) -> None:
    """Simulated gateways `names`, one DEALER each, served by one poll loop until Shutdown."""
    ctx = zmq.Context()
    poller = zmq.Poller()
    socks = []
    for name in names:
        sock = ctx.socket(zmq.DEALER)
        security.secure_client(sock, Path(run_dir), security.GATEWAY)
        sock.connect(endpoint)
        sock.send(wire.encode(wire.Hello(gateway_id=name, host="bench", slots=slots)))
        sock.send(wire.encode(wire.Credit(n=slots)))
        poller.register(sock, zmq.POLLIN)
        socks.append((sock, name))
    by_sock = dict(socks)
    last_beat, live = 0.0, len(socks)
    while live:
        if time.monotonic() - last_beat > 0.5:
            for sock, name in socks:
                sock.send(wire.encode(wire.Heartbeat(sender=name, t=time.time())))
            last_beat = time.monotonic()
        for sock, _ in poller.poll(200):
            outbox = Outbox()
            while True:
                try:
                    msg = wire.decode(sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if isinstance(msg, wire.Shutdown):
                    poller.unregister(sock)
                    live -= 1
                    break
                if isinstance(msg, wire.Assign):
                    _run(sock, outbox, by_sock[sock], [spec.session_id for spec in msg.sessions], stages)
            _flush(sock, outbox)
    ctx.destroy(linger=0)


def _run(sock: zmq.Socket, outbox: Outbox, name: str, sids: list[str], stages: bool) -> None:
    for state in ("INIT", "READY", "RUN", "POSTRUN"):
        for sid in sids:
            outbox.add(wire.SessionUpdate(session_id=sid, state=state, t=time.time()))
        if stages:
            _flush(sock, outbox)
    for sid in sids:
        outbox.add(wire.Result(session_id=sid, status="completed", reward=1.0, n_calls=0, n_traces=0, n_tokens=0,
                               shard=f"{name}-000001.shard"))
        outbox.add(wire.Credit(n=1))


def _flush(sock: zmq.Socket, outbox: Outbox) -> None:
    if (report := outbox.take()) is not None:
        sock.send(wire.encode(report))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(k: int, slots: int, sessions: int, n_procs: int, stages: bool) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"polar-bench-dispatch-{k}-"))
    tasks = [{"id": f"null{i}", "instruction": "-", "num_samples": min(10_000, sessions - i),  # the most a task takes
              "harness": {"command": "true"}} for i in range(0, sessions, 10_000)]
    (run_dir / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (run_dir / "topology.yaml").write_text("gateway:\n  heartbeat_s: 0.5\n  peer_timeout_s: 60\n")
    security.create_keys(run_dir)
    orch = procs.spawn("orchestrator", ["orchestrator", "--run-dir", str(run_dir)], run_dir / "orchestrator.log")
    endpoint = procs.wait_ready(orch, run_dir / "rendezvous.json", timeout_s=120)["endpoint"]
    startup_cpu_s = _cpu_s(orch.proc.pid)
    mp = multiprocessing.get_context("spawn")
    names = [f"g{i}" for i in range(k)]
    workers = [mp.Process(target=gateways, args=(str(run_dir), endpoint, names[i::n_procs], slots, stages))
               for i in range(min(n_procs, k))]
    for w in workers:
        w.start()
    client = zmq.Context.instance().socket(zmq.DEALER)
    security.secure_client(client, run_dir, security.ADMIN)
    client.connect(endpoint)
    try:
        while True:
            client.send(wire.encode(wire.StatusRequest()))
            if not client.poll(60000):
                raise SystemExit(f"orchestrator stopped answering:\n{orch.tail()}")
            if wire.decode(client.recv()).done:
                break
            time.sleep(0.5)
        cpu_s, rss_mb = _cpu_s(orch.proc.pid), _peak_rss_mb(orch.proc.pid)
        gateways_cpu_s = sum(_cpu_s(w.pid) for w in workers)
        client.send(wire.encode(wire.Shutdown(reason="bench done")))
        orch.proc.wait(60)
    finally:
        procs.stop([orch])
        deadline = time.monotonic() + 10
        for w in workers:  # they exit on the orchestrator's Shutdown
            w.join(max(0.0, deadline - time.monotonic()))
            w.kill()
            w.join()
    events = [json.loads(x) for x in (run_dir / "journal" / "orchestrator.jsonl").read_text().splitlines()]
    first = min(e["t"] for e in events if e["event"] == "assigned")
    last = max(e["t"] for e in events if e["event"] == "result")
    done = sum(e["event"] == "result" for e in events)
    per_1000 = (cpu_s - startup_cpu_s) / done * 1000
    return {"gateways": k, "slots": slots, "stages": stages, "sessions": done, "sessions_per_s": round(done / (last - first), 1),
            "orchestrator_cpu_s_per_1000": round(per_1000, 4), "orchestrator_ceiling_per_s": round(1000 / per_1000),
            "orchestrator_startup_cpu_s": round(startup_cpu_s, 2), "orchestrator_peak_rss_mb": round(rss_mb, 1),
            "gateways_cpu_s_per_1000": round(gateways_cpu_s / done * 1000, 4), "load_1min": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["64x4:100000", "1000x64:200000"],
                        help="GATEWAYSxSLOTS:SESSIONS, one run each")
    parser.add_argument("--procs", type=int, default=4, help="processes the simulated gateways share")
    parser.add_argument("--stages", action="store_true", help="each stage in a Report of its own")
    args = parser.parse_args()
    figures = []
    for case in args.cases:
        shape, sessions = case.split(":")
        k, slots = shape.split("x")
        figures.append(measure(int(k), int(slots), int(sessions), args.procs, args.stages))
        print(json.dumps(figures[-1]), file=sys.stderr, flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
