"""Harness-controlled paths touched from the host: no link followed, no FIFO waited on, sizes bounded."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from pathlib import Path

import pytest

from polar_hpc.sandbox import files


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("SECRET-0.125")
    return tmp_path / "ws"


def test_read_refuses_links_fifos_and_escapes(ws: Path) -> None:
    secret = ws.parent / "secret"
    (ws / "ok.txt").write_text("0.5")
    os.symlink(secret / "key", ws / "link.txt")
    os.symlink(secret, ws / "out")
    os.mkfifo(ws / "fifo")
    (ws / "d").mkdir()
    os.symlink("..", ws / "d" / "up")
    assert files.read(ws, "ok.txt", 10) == b"0.5"
    cases = {"link.txt": "link.txt: a symbolic link", "out/key": "out: a symbolic link",
             "d/up/ok.txt": "d/up: a symbolic link", "fifo": "fifo: not a regular file (a FIFO)",
             "d": "d: not a regular file (a folder)", "../secret/key": "leaves its folder",
             "/etc/hostname": "leaves its folder", "absent": "absent: not found"}
    for rel, expected in cases.items():
        t0 = time.monotonic()
        with pytest.raises(files.FileError, match=re.escape(expected)):
            files.read(ws, rel, 4096)
        assert time.monotonic() - t0 < 30, f"{rel}: must not block (a hang, not a slow machine)"


def test_read_is_bounded_on_a_huge_file(ws: Path) -> None:
    with open(ws / "huge", "wb") as f:
        f.truncate(50 << 30)  # 50 GiB, sparse
    t0 = time.monotonic()
    assert len(files.read(ws, "huge", 4096)) == 4097
    assert time.monotonic() - t0 < 30  # reading all 50 GiB would take minutes


def test_write_never_follows_a_link_or_waits_on_a_fifo(ws: Path) -> None:
    secret = ws.parent / "secret"
    os.symlink(secret / "key", ws / "instruction.txt")
    os.symlink(secret, ws / ".codex")
    os.mkfifo(ws / "fifo")
    for rel, expected in (("instruction.txt", "a symbolic link"), (".codex/config.toml", ".codex: a symbolic link"),
                          ("fifo", "fifo: not a regular file")):
        with pytest.raises(files.FileError, match=re.escape(expected)):
            files.write(ws, rel, b"overwritten")
    assert (secret / "key").read_text() == "SECRET-0.125"
    assert not (secret / "config.toml").exists()
    files.write(ws, "a/b/c.txt", b"made")
    assert (ws / "a" / "b" / "c.txt").read_bytes() == b"made"


def test_copy_keeps_links_skips_fifos_and_stops_at_its_budget(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("a" * 100)
    os.symlink("/etc/shadow", src / "shadow")
    os.mkfifo(src / "fifo")
    dst = tmp_path / "dst"
    dst.mkdir()
    stop = threading.Event()
    assert files.copy(tmp_path, "src", dst, "in/here", 10_000, stop) == 100 + len("/etc/shadow")
    out = dst / "in" / "here"
    assert (out / "sub" / "a.txt").read_text() == "a" * 100
    assert os.readlink(out / "shadow") == "/etc/shadow"  # a link, never its target's bytes
    assert not (out / "fifo").exists()
    (src / "big").write_bytes(b"x" * (3 << 20))
    with pytest.raises(files.OverBudget, match="over the disk limit"):
        files.copy(tmp_path, "src", dst, "again", 1 << 20, stop)
    assert sum(f.stat().st_size for f in (dst / "again").rglob("*") if f.is_file()) <= 2 << 20
    os.symlink(tmp_path / "src", dst / "linked")
    with pytest.raises(files.FileError, match="linked: a symbolic link"):
        files.copy(tmp_path, "src", dst, "linked/x", 10_000, stop)


def test_a_stopped_copy_ends_within_a_chunk(tmp_path: Path) -> None:
    with open(tmp_path / "huge", "wb") as f:
        f.truncate(20 << 30)
    (tmp_path / "dst").mkdir()
    stop = threading.Event()

    async def go():
        copy = asyncio.ensure_future(files.run(lambda: files.copy(tmp_path, "huge", tmp_path / "dst", "huge",
                                                                  1 << 40, stop), None))
        await asyncio.sleep(0.3)
        assert not copy.done()
        stop.set()
        with pytest.raises(files.FileError, match="stopped"):
            await asyncio.wait_for(copy, 2)

    asyncio.run(go())
    assert (tmp_path / "dst" / "huge").stat().st_size < 20 << 30


def test_run_gives_up_on_a_stuck_thread() -> None:
    never = threading.Event()

    async def go():
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await files.run(never.wait, 0.2)
        return time.monotonic() - t0

    assert asyncio.run(go()) < 1
    never.set()
