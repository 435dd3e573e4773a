"""Runs made once for the dashboard tests (package scope: all of it, the browser and its event loop
included, is gone before the next package runs): a finished one and a live one, the
dashboard served on each (a real `polar-hpc dashboard` process), and one headless chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, background, polar

CALCULATOR = ROOT / "examples" / "calculator"
CHROMIUM = "/usr/bin/chromium"
HOSTILE = "<img src=x onerror=\"window.__injected=1\"><script>window.__injected=2</script>"  # shown as text only


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def journal(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "journal" / "orchestrator.jsonl").read_text().splitlines()]


@pytest.fixture(scope="package")
def finished_run(tmp_path_factory) -> Path:
    """Calculator sessions (prefix_merge, and per_request: two traces each) and a crashing one."""
    tmp = tmp_path_factory.mktemp("finished")
    shutil.copy(CALCULATOR / "agent.py", tmp)
    calc = {"instruction": "What is 17 * 23 + 4?", "harness": {"command": "python agent.py"},
            "sandbox": {"files": {"agent.py": "agent.py"}}, "evaluator": {"kind": "regex", "pattern": "\\b395\\b"}}
    tasks = [
        {"id": "calc-merge", "num_samples": 3, "builder": "prefix_merge", **calc},
        {"id": "calc-per-call", "num_samples": 1, "builder": "per_request", **calc},
        {"id": "crash", "instruction": "x", "harness": {"command": f"echo '{HOSTILE}' >&2; exit 5"}},
    ]
    run_dir = tmp / "run"
    result = polar("run", write_jsonl(tmp / "tasks.jsonl", tasks), "--run-dir", run_dir, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir


@pytest.fixture(scope="package")
def live_run(tmp_path_factory) -> Iterator[Path]:
    """A run in progress: two quick sessions ended and sealed, two whose harness sleeps."""
    tmp = tmp_path_factory.mktemp("live")
    marker = f"96{os.getpid() % 10000:04d}7"
    tasks = [{"id": "quick", "instruction": "x", "num_samples": 2, "harness": {"command": "echo hi"}},
             {"id": "slow", "instruction": "x", "num_samples": 2, "timeout_s": 900, "harness": {"command": f"sleep {marker}"}}]
    topo = tmp / "topology.yaml"
    topo.write_text("gateway:\n  shard_max_age_s: 0.5\n")
    run_dir = tmp / "run"
    args = ["run", write_jsonl(tmp / "tasks.jsonl", tasks), "-c", topo, "--run-dir", run_dir]
    with background(args, run_dir, _live_ready, "the live run never had its quick sessions sealed and its slow ones running"):
        yield run_dir


def _live_ready(run_dir: Path) -> bool:
    try:
        events = journal(run_dir)
        entries = [json.loads(x) for p in (run_dir / "shards" / "index").glob("*.jsonl") for x in p.read_text().splitlines()]
    except (OSError, ValueError):
        return False
    running = {e["session"] for e in events if e.get("state") == "RUN" and e["session"].startswith("slow#")}
    results = [e for e in events if e["event"] == "result"]
    return len(running) == 2 and len(results) == 2 and sum(e["records"] for e in entries) >= 2


class Served:
    def __init__(self, run_dir: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "polar_hpc", "dashboard", str(run_dir), "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("open "):
                self.page = line.split()[1]
                break
        else:
            raise AssertionError(f"the dashboard did not start (exit code {self.proc.wait()})")
        self.base, _, self.token = self.page.partition("/?token=")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="package")
def finished_dashboard(finished_run: Path) -> Iterator[Served]:
    served = Served(finished_run)
    yield served
    served.close()


@pytest.fixture(scope="package")
def browser():
    """One headless Debian chromium for the whole session (never `playwright install`)."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("POLAR_REQUIRE_CHROMIUM"):
            pytest.fail(f"POLAR_REQUIRE_CHROMIUM is set but {CHROMIUM} is missing")
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()
