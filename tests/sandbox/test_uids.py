"""A root gateway's uid leases (sandbox/uids.py): never two at once on one uid, whichever pool of
the node holds them; never a uid some process runs as; /proc read only where it is due."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from polar_hpc.sandbox import uids
from polar_hpc.sandbox.uids import Uids, UidsExhausted

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="leases are a root gateway's")
FIRST = 2_000_070_000  # outside the default sandbox.uid_range: no other test's sandbox runs as these


@contextmanager
def _process_as(uid: int) -> Iterator[None]:
    """A process running as `uid` (a leftover, or a host user's) while inside."""
    sleeper = subprocess.Popen(["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{sleeper.pid}").st_uid != uid and time.monotonic() < deadline:
            time.sleep(0.01)  # until setpriv has changed user
        yield
    finally:
        sleeper.kill()
        sleeper.wait()


def test_two_pools_of_a_node_never_hand_out_one_uid_and_a_released_one_is_free_again(tmp_path: Path) -> None:
    ours, theirs = Uids(FIRST, FIRST + 2, tmp_path), Uids(FIRST, FIRST + 2, tmp_path)  # two gateways of a node
    held = [ours.take(), theirs.take(), ours.take()]
    assert len({lease.uid for lease in held}) == 3
    assert theirs.quick() is None
    with pytest.raises(UidsExhausted):
        theirs.take()
    held[0].release()
    assert theirs.take().uid == held[0].uid


def test_a_uid_a_process_runs_as_is_passed_over(tmp_path: Path) -> None:
    with _process_as(FIRST):
        pool = Uids(FIRST, FIRST + 1, tmp_path)
        lease = pool.take()
        assert lease.uid == FIRST + 1
        lease.release()
        assert pool.quick().uid == FIRST + 1  # the next try starts at FIRST, still passed over
        with pytest.raises(UidsExhausted):
            Uids(FIRST, FIRST, tmp_path).take()
    assert Uids(FIRST, FIRST, tmp_path).take().uid == FIRST


def test_only_a_uid_whose_holder_ended_without_release_waits_for_a_read_of_proc(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = []
    scan = uids._process_uids
    monkeypatch.setattr(uids, "_process_uids", lambda: reads.append(1) or scan())
    pool = Uids(FIRST, FIRST, tmp_path)
    assert pool.quick() is None  # nothing read yet
    pool.take().release()
    assert len(reads) == 1
    lease = pool.quick()  # released: no leftover possible, no read
    assert lease is not None and lease.uid == FIRST and len(reads) == 1
    with _process_as(FIRST):  # the holder's leftover...
        del lease  # ...and the holder gone without release()
        assert pool.quick() is None
        with pytest.raises(UidsExhausted):
            pool.take()
        assert len(reads) == 2
    assert pool.take().uid == FIRST  # read again: nothing runs as it now
