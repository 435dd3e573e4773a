"""A hostile harness for test_escape.py: tries each escape it is given and prints one JSON report.

    python escape_probe.py SPEC_JSON

SPEC: {"read": [path], "list": [path], "write": [path], "tcp": ["host:port"], "post": [url],
"zmq": [endpoint], "unmount": [path]}. Each attempt is reported as "ok:<what came back>" or the
exception's class name; "zmq_message" is the status request's bytes (hex; polar-hpc's checkout is
hidden from a sandbox); the report (stdlib only, plus pyzmq for "zmq") goes
to stderr, which the gateway keeps as the session's `stderr_tail`.
"""

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request


def attempt(fn):
    try:
        return "ok:" + str(fn())[:60]
    except Exception as e:  # the report names what stopped it
        return type(e).__name__


def read(path):
    with open(path, "rb") as f:
        return f.read(40)


def write(path):
    with open(path, "w") as f:
        return f.write("escaped")


def connect(target):
    host, port = target.rsplit(":", 1)
    socket.create_connection((host, int(port)), timeout=3).close()
    return "connected"


def post(url):
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 1}}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request, timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code


def proxy_models():
    url = os.environ["OPENAI_BASE_URL"] + "/models"
    auth = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    return urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=5).status


def zmq_status(endpoint, message):
    """Ask the orchestrator for its status with no keys, as any local process could."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send(bytes.fromhex(message))
    answered = sock.poll(3000)
    sock.close()
    return "answered" if answered else "no answer"


def unmount(path):
    """Uncover a hidden folder from a nested user + mount namespace (the kernel must refuse)."""
    script = "umount -l %s && ls -A %s" % (path, path)
    out = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                         capture_output=True, text=True, timeout=10)
    return "exit %d %s" % (out.returncode, out.stdout.split())


def status():
    with open("/proc/self/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    return {k: fields[k].split() for k in ("Uid", "Gid", "CapPrm", "CapEff", "CapBnd", "NoNewPrivs")}


def main(spec):
    home = os.environ["HOME"]
    sessions = os.path.dirname(os.path.dirname(home))  # the folder holding every session's sandbox
    report = {
        "status": status(),
        "read": {p: attempt(lambda p=p: read(p)) for p in spec.get("read", [])},
        "list": {p: attempt(lambda p=p: sorted(os.listdir(p))) for p in spec.get("list", []) + [sessions]},
        "write": {p: attempt(lambda p=p: write(p)) for p in spec.get("write", []) + [home + "/mine.txt"]},
        "tcp": {t: attempt(lambda t=t: connect(t)) for t in spec.get("tcp", [])},
        "post": {u: attempt(lambda u=u: post(u)) for u in spec.get("post", [])},
        "zmq": {e: attempt(lambda e=e: zmq_status(e, spec["zmq_message"])) for e in spec.get("zmq", [])},
        "unmount": {p: attempt(lambda p=p: unmount(p)) for p in spec.get("unmount", [])},
        "proxy": attempt(proxy_models),
        "sessions": sessions,
    }
    sys.stderr.write(json.dumps(report, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
