"""Dispatch throughput of the orchestrator: sessions per second through K gateways, null harness.

Starts a real orchestrator (`polar-hpc orchestrator`, over CURVE as in a Slurm run) and K simulated
gateways, each its own process, speaking the real protocol: Hello, Credit for `slots` INIT slots,
and for every Assign the four stage updates (INIT, READY, RUN, POSTRUN), a Result and a Credit at
once (the harness does nothing). The rate is measured from the orchestrator's own journal: N
sessions divided by the time from the first `assigned` to the last `result`. Runs K = 4 and 64 in
one go; the last line is a JSON list with one {"gateways", "sessions", "sessions_per_s"} per K.

    uv run python bench/dispatch.py [--sessions 10000] [--gateways 4 64]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import zmq

from polar_hpc import procs, security, wire


def gateway(run_dir: str, endpoint: str, name: str, slots: int) -> None:
    sock = zmq.Context().socket(zmq.DEALER)
    security.secure_client(sock, Path(run_dir), security.GATEWAY)
    sock.connect(endpoint)
    sock.send(wire.encode(wire.Hello(gateway_id=name, host="bench", slots=slots)))
    sock.send(wire.encode(wire.Credit(n=slots)))
    last_beat = 0.0
    while True:
        if time.monotonic() - last_beat > 0.5:
            sock.send(wire.encode(wire.Heartbeat(sender=name, t=time.time())))
            last_beat = time.monotonic()
        if not sock.poll(200):
            continue
        msg = wire.decode(sock.recv())
        if isinstance(msg, wire.Shutdown):
            return
        if isinstance(msg, wire.Assign):
            sid = msg.session.session_id
            for state in ("INIT", "READY", "RUN", "POSTRUN"):
                sock.send(wire.encode(wire.SessionUpdate(session_id=sid, state=state, t=time.time())))
            sock.send(wire.encode(wire.Result(session_id=sid, status="completed", reward=1.0, n_calls=0,
                                              n_traces=0, n_tokens=0, shard=f"{name}-000001.shard")))
            sock.send(wire.encode(wire.Credit(n=1)))


def measure(k: int, sessions: int, slots: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"polar-bench-dispatch-{k}-"))
    task = {"id": "null", "instruction": "-", "num_samples": sessions, "harness": {"command": "true"}}
    (run_dir / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    (run_dir / "topology.yaml").write_text("gateway:\n  heartbeat_s: 0.5\n  peer_timeout_s: 30\n")
    security.create_keys(run_dir)
    orch = procs.spawn("orchestrator", ["orchestrator", "--run-dir", str(run_dir)], run_dir / "orchestrator.log")
    endpoint = procs.wait_ready(orch, run_dir / "rendezvous.json")["endpoint"]
    mp = multiprocessing.get_context("spawn")
    gateways = [mp.Process(target=gateway, args=(str(run_dir), endpoint, f"g{i}", slots)) for i in range(k)]
    for g in gateways:
        g.start()
    client = zmq.Context.instance().socket(zmq.DEALER)
    security.secure_client(client, run_dir, security.ADMIN)
    client.connect(endpoint)
    try:
        while True:
            client.send(wire.encode(wire.StatusRequest()))
            if not client.poll(30000):
                raise SystemExit(f"orchestrator stopped answering:\n{orch.tail()}")
            if wire.decode(client.recv()).done:
                break
            time.sleep(0.2)
        client.send(wire.encode(wire.Shutdown(reason="bench done")))
        orch.proc.wait(30)
    finally:
        procs.stop([orch])
        deadline = time.monotonic() + 10
        for g in gateways:  # they exit on the orchestrator's Shutdown
            g.join(max(0.0, deadline - time.monotonic()))
            g.kill()
            g.join()
    events = [json.loads(x) for x in (run_dir / "journal" / "orchestrator.jsonl").read_text().splitlines()]
    first = min(e["t"] for e in events if e["event"] == "assigned")
    last = max(e["t"] for e in events if e["event"] == "result")
    done = sum(e["event"] == "result" for e in events)
    return {"gateways": k, "sessions": done, "sessions_per_s": round(done / (last - first), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--gateways", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--slots", type=int, default=4, help="INIT credits per gateway")
    args = parser.parse_args()
    figures = []
    for k in args.gateways:
        figures.append(measure(k, args.sessions, args.slots))
        print(f"{k} gateways: {figures[-1]['sessions_per_s']} sessions/s", file=sys.stderr, flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
