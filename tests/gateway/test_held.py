"""A harness command held after it ends (gateway/held.py), on real bubblewrap: a server the harness
left running answers the tests, which get their own variables, and the tests' exit status is the
result; a gate FIFO a harness swapped for a link to a host file is refused, the file untouched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from polar_hpc.gateway.held import GATE, Held
from polar_hpc.sandbox import files
from polar_hpc.sandbox.bwrap import BwrapSandbox
from sandbox.bwrap_required import needs_bwrap

pytestmark = needs_bwrap
SERVE = "python3 -m http.server 8766 --bind 127.0.0.1 > /dev/null 2>&1 & echo harness-done"
ASK = """python3 - <<'PY'
import os, time, urllib.request
for _ in range(600):  # the server may still be starting: up to a minute
    try:
        print(urllib.request.urlopen("http://127.0.0.1:8766/", timeout=5).status, os.environ["CHECK"])
        break
    except OSError as e:
        error = e
        time.sleep(0.1)
else:
    print("no answer:", error)
PY
exit 3"""


async def _held(root: Path, harness: str, tests: str):
    sb = BwrapSandbox(root, {}, [], "none", mounts={GATE: "gate"})
    await sb.start()
    held = Held(sb)
    try:
        first = await held.start(harness, {}, 30, 30)
        return first, await held.run(tests, {"CHECK": "it's me"}, 30), sb.mounts[GATE]
    finally:
        await held.close()
        await sb.stop()


def test_a_service_left_running_answers_the_tests(tmp_path: Path) -> None:
    first, tests, _ = asyncio.run(_held(tmp_path / "sb", SERVE, ASK))
    assert (first.returncode, first.timed_out) == (0, False)
    out = tests.stdout.decode()
    assert out.startswith("harness-done\n") and "200 it's me" in out  # the harness's output, then the tests'
    assert (tests.returncode, tests.timed_out) == (3, False)


def test_a_gate_swapped_for_a_link_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    victim.chmod(0o666)  # writable by anyone: only the gateway's refusal keeps "go" out of it
    swap = f"rm {GATE}/go && ln -s {victim} {GATE}/go"
    with pytest.raises(files.FileError, match="not the FIFO the gateway made"):
        asyncio.run(_held(tmp_path / "sb", swap, "true"))
    assert victim.read_text() == "untouched\n"


def test_the_word_to_go_waits_for_a_shell_that_reads_it_late(tmp_path: Path) -> None:
    """A harness that writes its own status to `done` and works on gets its tests said `go` before
    its shell reaches `read < go` (the shell's own `echo > done` comes first): the gateway holds
    both FIFOs open until the end, so neither that write waits for a reader nor the word is lost
    (a FIFO no process holds drops what was written to it), and the tests run once it is done."""
    early = f"echo 0 > {GATE}/done; sleep 2; echo harness-done"
    first, tests, _ = asyncio.run(_held(tmp_path / "sb", early, "echo tests-ran; exit 4"))
    assert (first.returncode, first.timed_out) == (0, False)
    assert (tests.returncode, tests.timed_out) == (4, False), tests
    assert tests.stdout.decode() == "harness-done\ntests-ran\n"
