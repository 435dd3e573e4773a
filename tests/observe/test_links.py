"""No process of ours follows a link in the run directory, reading or writing.

A finished run is copied, and every file the dashboard's reader, `polar-hpc status`, the shard and
index readers and the journal's readers and writers touch is moved out of it (a secret added, mode
0600) with a link left in its place; `logs/` and `shards/index/` are also tried as linked folders.
Nothing of the targets is read (no trajectory, no result, no error line, no secret), and the
metrics log and the journal refuse to write through a link (the targets are unchanged)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polar_hpc.launch.status import ask
from polar_hpc.observe.metrics import MetricsLog
from polar_hpc.observe.run import RunReader
from polar_hpc.orchestrator.journal import Journal, progress, read_jsonl
from polar_hpc.shards import index
from polar_hpc.shards.reader import iter_trajectories
from polar_hpc import wire

SECRET = "LINKED-SECRET-5f1c"


def _plant(run: Path, away: Path, rel: str) -> Path:
    """`run/rel` moved to `away` (a secret line added, 0600) and a link to it left in its place."""
    src, dst = run / rel, away / rel.replace("/", "__")
    shutil.move(src, dst)
    if dst.is_file():
        if not dst.name.endswith(".shard"):
            with open(dst, "a") as f:
                f.write(json.dumps({"t": 1.0, "event": "result", "error": f"ERROR {SECRET}"}) + "\n"
                        f"ERROR Traceback {SECRET}\n")
        dst.chmod(0o600)
    src.symlink_to(dst)
    return dst


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("linked_folders", [False, True])
def test_no_reader_or_writer_follows_a_link_in_the_run_dir(finished_run: Path, tmp_path: Path,
                                                           linked_folders: bool) -> None:
    run, away = tmp_path / "run", tmp_path / "away"
    shutil.copytree(finished_run, run, symlinks=True)
    away.mkdir()
    assert list(iter_trajectories(run)) and progress(run).ended  # what following the links would give
    if linked_folders:
        rels = ["logs", "shards/index", "journal"]
    else:
        rels = ["tasks.jsonl", "topology.yaml", "rendezvous.json", "metrics.jsonl", "journal/orchestrator.jsonl",
                *[str(p.relative_to(run)) for p in (run / "shards").rglob("*") if p.is_file()],
                *[str(p.relative_to(run)) for p in (run / "logs").glob("*.log")]]
        (run / "journal" / "driver.jsonl").write_text(json.dumps({"event": "end", "outcome": "finished"}) + "\n")
        rels.append("journal/driver.jsonl")
        (run / "accounting.json").write_text(json.dumps({"gpu_hours": 1.0, "note": SECRET}))
        rels.append("accounting.json")
    for rel in rels:
        _plant(run, away, rel)
    before = _contents(away)

    reader = RunReader(run, list_every_s=0)
    reader.poll()
    overview = reader.overview()
    assert overview["done"] == 0 and overview["driver"] is None, overview  # no journal read through a link
    assert SECRET not in json.dumps(overview) and SECRET not in json.dumps(reader.errors.view())
    if linked_folders:
        assert index.writer_ids(run / "shards") == []
    else:
        assert overview["trajectories"] == 0 and reader.shards.query()["rows"] == [], overview
        assert overview["accounting"] is None  # the cost `status` wrote is a link: not read
        assert list(iter_trajectories(run)) == []
        assert all(index.read_entries(index.index_path(run / "shards", w)) == [] for w in index.writer_ids(run / "shards"))
        assert not MetricsLog(run).append(overview)  # metrics.jsonl is a link: not appended to
        with pytest.raises(OSError):
            ask(run, wire.StatusRequest(), timeout_s=0.1)  # rendezvous.json is a link: not read
    with pytest.raises(OSError):  # the journal's readers and its writer refuse the link
        read_jsonl(run / "journal" / "orchestrator.jsonl")
    with pytest.raises(OSError):
        Journal(run)
    with pytest.raises(OSError):
        progress(run)  # what status tells of a run whose orchestrator does not answer
    assert _contents(away) == before  # nothing written through a link
