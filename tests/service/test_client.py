"""A service run's orchestrator and a real `Client`: idempotent submit, refused strangers, busy
answers that take nothing, cancel, drain, and the file inbox consumed once."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from polar_hpc import security
from polar_hpc.client import Client, ServiceBusy
from polar_hpc.config import ConfigError
from polar_hpc.errors import RequestRefused
from tests.conftest import polar
from tests.orchestrator.helpers import start_orchestrator

SERVICE = "service:\n  enabled: true\n  max_queued: 12\ngateway:\n  heartbeat_s: 0.1\n"
FIRST = {"id": "first", "instruction": "hi", "num_samples": 2, "harness": {"command": "true"}}


def _task(tid: str, samples: int = 3) -> dict:
    return {"id": tid, "instruction": "hi", "num_samples": samples, "harness": {"command": "true"}}


@pytest.fixture
def service_run(tmp_path: Path):
    security.create_keys(tmp_path)
    proc, _ = start_orchestrator(tmp_path, SERVICE, FIRST)
    try:
        yield tmp_path
    finally:
        proc.kill()
        proc.wait()


def test_submit_is_idempotent_and_a_stranger_is_refused(service_run: Path, tmp_path_factory) -> None:
    with Client(service_run, timeout_s=10) as client:
        batch = client.submit([_task("a"), _task("b")])
        assert client.submit([_task("b"), _task("a")]) == batch  # a restarted trainer gets its batch back
        assert client.run_status().states == {"queued": 8}  # 2 (initial) + 2 x 3, once
        assert client.status(batch)[batch].total == 6

        stranger_dir = tmp_path_factory.mktemp("stranger")
        security.create_keys(stranger_dir)  # keys of another run
        shutil.copy(service_run / "rendezvous.json", stranger_dir / "rendezvous.json")
        with Client(stranger_dir, timeout_s=1.5) as stranger:
            with pytest.raises(ConnectionError, match="keys"):
                stranger.submit([_task("intruder")])
        assert "intruder" not in str(client.status()) and client.run_status().total == 8


def test_busy_takes_nothing_until_there_is_room(service_run: Path) -> None:
    with Client(service_run, timeout_s=10) as client:
        kept = client.submit([_task("a", 9)])  # 2 + 9 = 11 of 12 queued
        with pytest.raises(ServiceBusy) as busy:
            client.submit([_task("b", 2)], block=False)
        assert busy.value.retry_after_s > 0
        with pytest.raises(ServiceBusy):  # blocking gives up at its own timeout, still taking nothing
            client.submit([_task("b", 2)], timeout_s=0.1)
        assert client.run_status().total == 11
        with pytest.raises(ConfigError, match="can never fit"):
            client.submit([_task("huge", 13)])
        assert client.cancel(batch_id=kept) == 9  # queued sessions are cancelled at once
        assert client.status(kept)[kept].states == {"cancelled": 9} and client.status(kept)[kept].done
        batch = client.submit([_task("b", 2)])
        assert client.status(batch)[batch].states == {"queued": 2}
        with pytest.raises(ConfigError, match="no batch"):
            client.cancel(batch_id="nope")


def test_bad_tasks_are_refused_before_anything_is_sent(service_run: Path) -> None:
    with Client(service_run, timeout_s=10) as client:
        with pytest.raises(ConfigError, match=r"task 1 \(id 'x'\): num_samples"):
            client.submit([_task("ok"), _task("x", 0)])
        with pytest.raises(ConfigError, match="duplicate task id"):
            client.submit([_task("d"), _task("d")])
        client.drain()
        with pytest.raises(RequestRefused, match="draining"):  # the job refused it
            client.submit([_task("late")])
        assert client.run_status().total == 2


def test_an_inbox_file_is_consumed_once(service_run: Path) -> None:
    inbox = service_run / "inbox"
    inbox.mkdir(exist_ok=True)

    def drop(name: str, lines: list[str]) -> None:
        tmp = inbox / f".{name}.tmp"  # written under another name, then renamed into place
        tmp.write_text("".join(line + "\n" for line in lines))
        tmp.rename(inbox / name)

    def settled(name: str, folder: str) -> Path:
        deadline = time.monotonic() + 60
        while not (inbox / folder / name).exists():
            assert time.monotonic() < deadline, f"{name} never reached inbox/{folder}"
            time.sleep(0.05)
        assert not (inbox / name).exists()
        return inbox / folder / name

    drop("one.jsonl", [json.dumps(_task("i1", 2)), json.dumps(_task("i2", 2))])
    settled("one.jsonl", "done")
    drop("again.jsonl", [json.dumps(_task("i2", 2))])  # the same task a second time
    settled("again.jsonl", "done")
    drop("bad.jsonl", [json.dumps(_task("i3", 2)), json.dumps({"id": "i4", "instruction": "x"})])
    settled("bad.jsonl", "rejected")
    drop("junk.jsonl", [json.dumps(_task("i5", 1)), "{not json"])
    settled("junk.jsonl", "rejected")
    assert "junk.jsonl:2: not valid JSON" in (inbox / "rejected" / "junk.jsonl.error").read_text()
    error = (inbox / "rejected" / "bad.jsonl.error").read_text()
    assert "bad.jsonl:2: harness: missing required field" in error
    with Client(service_run, timeout_s=10) as client:
        assert client.status("inbox-one")["inbox-one"].total == 4
        assert client.run_status().total == 6  # 2 initial + i1, i2 once; nothing from the bad file
        with pytest.raises(ConfigError, match="no batch"):
            client.status("inbox-again")


def test_a_run_that_is_not_a_service_refuses_tasks(tmp_path: Path) -> None:
    proc, _ = start_orchestrator(tmp_path, "gateway:\n  heartbeat_s: 0.1\n", FIRST)
    try:
        with Client(tmp_path, timeout_s=10) as client, pytest.raises(ConfigError, match="not a service run"):
            client.submit([_task("a")])
    finally:
        proc.kill()
        proc.wait()


def test_run_without_tasks_needs_service(tmp_path: Path) -> None:
    result = polar("run", "--run-dir", tmp_path / "run")
    assert result.returncode == 2 and "--service" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_restarted_orchestrator_keeps_what_trainers_added(tmp_path: Path) -> None:
    proc, _ = start_orchestrator(tmp_path, SERVICE, FIRST)
    try:
        with Client(tmp_path, timeout_s=10) as client:
            batch = client.submit([_task("a"), _task("b", 2)], max_staleness=2)
    finally:
        proc.kill()  # preempted: no chance to write anything more
        proc.wait()
    (tmp_path / "rendezvous.json").unlink()
    proc, _ = start_orchestrator(tmp_path, SERVICE, FIRST)
    try:
        with Client(tmp_path, timeout_s=10) as client:
            assert client.status(batch)[batch].total == 5 and client.status(batch)[batch].states == {"queued": 5}
            assert client.submit([_task("a"), _task("b", 2)]) == batch and client.run_status().total == 7
    finally:
        proc.kill()
        proc.wait()
