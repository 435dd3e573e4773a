"""The proxy's memory per request: peak RSS over body size (issue 33: a 31 MB prompt took a tito
proxy to 5.2 GB, tokenizing all of it before the engine refused it for its context length).

A tito proxy and the scripted engine (context 65536 tokens), a stand-in gateway (bench/rounds.py);
one call of 1, 10 or 28 MB of pasted code (under the 32 MiB body limit once JSON-escaped) to a
fresh proxy each, answered 400 (it cannot fit the context). For each, the proxy's peak RSS (VmHWM)
less its RSS before the call, and that divided by the body. The last line printed is one JSON object:
{"body_mb": [...], "status": [...], "peak_added_mb": [...], "peak_over_body": [...]}.
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from polar_hpc import procs
from rounds import Gateway, proxy_args, start  # bench/rounds.py

SIZES_MB = (1, 10, 28)
MODEL = "polar-scripted"


def _kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _call(url: str, token: str, size_mb: int) -> int:
    text = ("def f(x):\n    return x * 2  # pasted code\n" * (size_mb << 16))[: size_mb << 20]
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8}).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=600) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        gateway = Gateway(f"ipc://{tmp}/gw.ipc")
        engine, engine_url = start("engine", ["engine", "--kind", "scripted", "--port", "0"], tmp)
        statuses, added = [], []
        try:
            for size in SIZES_MB:
                name = f"memory-{size}"
                proxy, url = start(name, proxy_args(name, tmp, engine_url, "tito"), tmp)
                try:
                    gateway.open(name, [name])
                    base = _kib(proxy.proc.pid, "VmRSS")
                    statuses.append(_call(url, name, size))
                    added.append(round((_kib(proxy.proc.pid, "VmHWM") - base) / 1024, 1))
                finally:
                    procs.stop([proxy])
                print(f"{size} MB body: {statuses[-1]}, peak RSS +{added[-1]} MB", flush=True)
        finally:
            procs.stop([engine])
            gateway.close()
    print(json.dumps({"body_mb": list(SIZES_MB), "status": statuses, "peak_added_mb": added,
                      "peak_over_body": [round(a / s, 2) for a, s in zip(added, SIZES_MB)]}))


if __name__ == "__main__":
    main()
