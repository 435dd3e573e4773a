"""Every setting of the topology's `proxy:` section reaches the proxy a real gateway starts: each is
set to a value other than its default, the run's proxy logs the launch it decoded, and a harness
sees the ones it can observe take effect (port, strict_model, max_body_mb, passthrough mode)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import msgspec
import yaml
from conftest import polar
from e2e.helpers import write_jsonl

from polar_hpc import wire
from polar_hpc.engines.scripted.chat_format import ASSET_DIR

MODEL = "polar-scripted"
PROBE = '''
import json, os, sys, urllib.error, urllib.parse, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]

def status(body):
    request = urllib.request.Request(base + "/chat/completions", data=body, method="POST",
                                     headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code

def chat(model, text="Hi"):
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8}).encode()

seen = {"port": urllib.parse.urlsplit(base).port, "other_model": status(chat("another-model")),
        "too_big": status(chat(%(model)r, "x" * (600 << 10))), "ours": status(chat(%(model)r))}
open(sys.argv[1], "w").write(json.dumps(seen))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_proxy_setting_reaches_the_proxy(tmp_path: Path) -> None:
    port = _free_port()
    settings = {"mode": "passthrough", "port": port, "tokenizer": str(ASSET_DIR), "tool_parser": "hermes",
                "strict_model": True, "max_body_mb": 0.5, "engine_wait_s": 7.0, "affinity_slack": 3,
                "engine_poll_s": 0.5}
    defaults = wire.ProxySettings()
    assert set(settings) == set(wire.ProxySettings.__struct_fields__)  # a new setting is tested here too
    assert all(value != getattr(defaults, name) for name, value in settings.items())
    gateway = {"heartbeat_s": 0.5, "peer_timeout_s": 20.0}
    topology = tmp_path / "topology.yaml"
    topology.write_text(yaml.safe_dump({"proxy": settings, "gateway": gateway, "sandbox": {"backend": "none"}}))
    (tmp_path / "probe.py").write_text(PROBE % {"model": MODEL})
    seen = tmp_path / "seen.json"
    task = {"id": "probe", "instruction": "-", "timeout_s": 120,
            "harness": {"command": f"{sys.executable} {tmp_path / 'probe.py'} {seen}"}}
    run_dir = tmp_path / "run"
    result = polar("run", write_jsonl(tmp_path / "tasks.jsonl", [task]), "-c", topology, "--run-dir", run_dir)
    assert result.returncode == 0, result.stdout + result.stderr

    [log] = (run_dir / "logs").glob("proxy-*.log")
    [line] = [line for line in log.read_text().splitlines() if " launch {" in line]
    launch = wire.proxy_launch(line.partition(" launch ")[2])
    assert msgspec.structs.asdict(launch.settings) == settings
    assert (launch.heartbeat_s, launch.peer_timeout_s, launch.model) == (0.5, 20.0, MODEL)
    assert json.loads(seen.read_text()) == {"port": port, "other_model": 404, "too_big": 413, "ours": 200}
