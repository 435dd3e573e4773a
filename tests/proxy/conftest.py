"""Fixtures for proxy tests: the scripted engine (once per run), a fake gateway, a proxy."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from proxy.helpers import BIN, FakeGateway, Proxy, start_proxy, stop, wait_ready


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory):
    """The scripted engine; yields (url, sample log path)."""
    tmp = tmp_path_factory.mktemp("engine")
    ready, log = tmp / "ready.json", tmp / "samples.jsonl"
    proc = subprocess.Popen(
        [str(BIN / "polar-hpc"), "engine", "--kind", "scripted", "--port", "0",
         "--ready-file", str(ready), "--sample-log", str(log)],
        stderr=open(tmp / "engine.log", "w"),
    )
    try:
        yield wait_ready(proc, ready), log
    finally:
        stop(proc)


@pytest.fixture
def short_tmp():
    """A short folder for ipc paths (sun_path holds ~107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="pxy") as d:
        yield Path(d)


@pytest.fixture
def gateway(short_tmp: Path):
    gw = FakeGateway(short_tmp / "gw.ipc")
    yield gw
    gw.close()


@pytest.fixture(params=["tito", "passthrough"])
def proxy(request, short_tmp: Path, gateway: FakeGateway, engine) -> Proxy:
    """A proxy in each capture mode."""
    p = start_proxy(short_tmp, gateway, engine[0], mode=request.param)
    p.mode = request.param
    yield p
    p.stop()
    assert p.proc.returncode == 0, (short_tmp / "p.log").read_text()
