"""`calls.new_id`: unique within a process and across a fork (the child re-draws its prefix)."""

from __future__ import annotations

import os
import re

from polar_hpc.proxy.calls import new_id


def test_ids_are_unique_and_uuid_shaped():
    ids = [new_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids), [i for i in ids if not re.fullmatch("[0-9a-f]{32}", i)][:3]


def test_a_forked_child_does_not_repeat_its_parents_ids():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.write(write, " ".join(new_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 4096).decode().split()
    os.close(read)
    parent = [new_id() for _ in range(3)]
    assert len(child) == 3
    assert {i[:16] for i in child}.isdisjoint({i[:16] for i in parent})
