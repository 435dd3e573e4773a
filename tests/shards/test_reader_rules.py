"""What readers do with files written from docs/shards.md (not by our writer): unknown keys, framed
records that are not trajectories, a session in two shards, several results for a key, keys never
queued, damaged or missing indexes, journal lines cut short."""

from __future__ import annotations

import json
import logging

import msgpack

from conftest import polar
from polar_hpc.shards import Follower, iter_trajectories, summarize, verify
from polar_hpc.shards.table import verify_run

from shards.doc_files import append_line, journal, offsets, queued, result, trace, trajectory, write_shard


def keys(trajs):
    return [(t.task_id, t.sample_index, t.session_id) for t in trajs]


def follow(run, **kw):
    f = Follower(run, poll_s=0.01, idle_timeout_s=kw.pop("idle_timeout_s", 10), index_grace_s=0.05, **kw)
    return keys(f), f


def test_unknown_keys_are_ignored(tmp_path):
    future = trajectory("a", 0, added_later={"x": [1, 2]})
    future["traces"] = [trace(extra_field=b"\x00" * 5)]
    name = write_shard(tmp_path, "gw", 1, [trajectory("a", 1), future, trajectory("a", 2)])
    journal(tmp_path, *(queued("a", i) for i in range(3)), *(result("a", i, name) for i in range(3)))
    assert verify(tmp_path) == []
    got = list(iter_trajectories(tmp_path))
    assert [t.sample_index for t in got] == [1, 0, 2]
    assert got[1].traces[0].response_ids.tolist() == [10, 11, 12] and got[1].traces[0].logprobs.tolist() == [-0.5] * 3
    assert follow(tmp_path)[0] == keys(got)


def test_framed_record_with_bad_content_is_skipped_alone(tmp_path, caplog):
    """A good checksum does not vouch for the content: each bad record is named and skipped, the
    records after it are read."""
    bad = {
        "not a map": msgpack.packb([1, 2, 3]),
        "not msgpack": b"\xc1",
        "field missing": msgpack.packb({k: v for k, v in trajectory("a", 9).items() if k != "task_id"}),
        "wrong type": msgpack.packb(trajectory("a", 9, sample_index="nine")),
        "ragged ids": msgpack.packb(trajectory("a", 9, traces=[trace() | {"response_ids": b"\x01\x02\x03"}])),
        "misaligned": msgpack.packb(trajectory("a", 9, traces=[trace() | {"loss_mask": b""}])),
        "bad status": msgpack.packb(trajectory("a", 9, status="exploded")),
    }
    records = [trajectory("a", 0)]
    for i, payload in enumerate(bad.values(), 1):
        records += [payload, trajectory("a", i)]
    name = write_shard(tmp_path, "gw", 1, records)
    n = len(bad) + 1
    journal(tmp_path, *(queued("a", i) for i in range(n)), *(result("a", i, name) for i in range(n)))

    problems = verify(tmp_path)
    assert len(problems) == len(bad)
    shard = tmp_path / "shards" / name
    bad_offsets = offsets(shard)[2::2]  # header, a0, bad, a1, bad, ...
    for problem, offset, payload in zip(problems, bad_offsets, bad.values(), strict=True):
        assert problem.startswith(f"{shard}: byte offset {offset}: bad trajectory record: "), problem
        assert problem.endswith(f"({8 + len(payload)} bytes skipped)"), problem
    assert "Expected `int`, got `str` - at `$.sample_index`" in problems[3]
    assert "not a whole number of 4-byte items" in problems[4] and "misaligned" in problems[5]
    assert "'exploded'" in problems[6]
    with caplog.at_level(logging.WARNING):
        assert [t.sample_index for t in iter_trajectories(tmp_path)] == list(range(n))
    assert f"{shard}: byte offset" in caplog.text
    got, follower = follow(tmp_path)
    assert [k[1] for k in got] == list(range(n)) and follower.complete() and follower.stats["problems"] == len(bad)


def test_a_session_in_two_shards_is_handed_out_once(tmp_path, capsys):
    """The copy in the shard its result names counts (the first, if that shard has two)."""
    a0 = trajectory("a", 0)
    first = write_shard(tmp_path, "gw0", 1, [trajectory("a", 0, reward=0.25)])  # a copy elsewhere
    named = write_shard(tmp_path, "gw1", 1, [a0, trajectory("a", 1), trajectory("a", 0, reward=0.5), trajectory("a", 2)])
    write_shard(tmp_path, "gw1", 2, [trajectory("a", 0, reward=0.75)])
    journal(tmp_path, *(queued("a", i) for i in range(3)), *(result("a", i, named) for i in range(3)))

    once = [("a", 0, "a#0.0"), ("a", 1, "a#1.0"), ("a", 2, "a#2.0")]
    got = list(iter_trajectories(tmp_path))
    assert keys(got) == once and got[0].reward == 1.0
    assert summarize(tmp_path)["duplicates"] == 3
    got, follower = follow(tmp_path)
    assert sorted(got) == once and follower.complete() and follower.stats["strays"] == 3

    cursor = tmp_path / "cursor.json"  # stopped right after a#0.0: the second copy in its shard is not news
    f = Follower(tmp_path, cursor=cursor, poll_s=0.01, idle_timeout_s=0.2)
    for t in f:
        if t.session_id == "a#0.0":
            f.commit()
            break
    assert f.state()["writers"]["gw1"]["shard"] == named
    got, again = follow(tmp_path, cursor=cursor)
    assert sorted(got + [("a", 0, "a#0.0")]) == once and again.complete()

    (tmp_path / "shards" / named).unlink()  # the copies left do not stand in for it: verify says so
    assert verify_run(tmp_path) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path / 'shards' / 'index' / 'gw1.jsonl'}: the entry for {named} names no sealed shard",
        f"task 'a' sample 0: session a#0.0, accepted by the journal, is not in {named}, the shard its result names "
        f"(the copy in {first}, gw1-000002.shard does not count)",
        f"task 'a' sample 1: session a#1.0, accepted by the journal, is in no sealed shard (expected in {named}; "
        "still open if its writer is running)",
        f"task 'a' sample 2: session a#2.0, accepted by the journal, is in no sealed shard (expected in {named}; "
        "still open if its writer is running)",
    ]


def test_several_results_for_one_key_the_first_counts(tmp_path, capsys):
    s1 = write_shard(tmp_path, "gw", 1, [trajectory("a", 0), trajectory("a", 0, attempt=1)])
    journal(tmp_path, queued("a", 0), result("a", 0, s1), result("a", 0, s1),  # the same again: harmless
            result("a", 0, s1, attempt=1))
    assert keys(iter_trajectories(tmp_path)) == [("a", 0, "a#0.0")]
    got, follower = follow(tmp_path)
    assert got == [("a", 0, "a#0.0")] and follower.complete() and follower.stats["strays"] == 1
    assert verify_run(tmp_path) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line == (f"{tmp_path}/journal/orchestrator.jsonl:4: task 'a' sample 0: a second result "
                    f"(session a#0.1, shard {s1}) ignored: the first (session a#0.0) counts")


def test_keys_never_queued_are_not_part_of_the_run(tmp_path, capsys):
    name = write_shard(tmp_path, "gw", 1, [trajectory("a", 0), trajectory("x", 0), trajectory("y", 0)])
    journal(tmp_path, queued("a", 0), result("a", 0, name), result("x", 0, name))
    assert keys(iter_trajectories(tmp_path)) == [("a", 0, "a#0.0")]  # the journal is complete
    got, follower = follow(tmp_path, idle_timeout_s=5)
    assert got == [("a", 0, "a#0.0")] and follower.complete()  # the held y#0.0 does not hold up the end
    assert verify_run(tmp_path) == 1
    shard, (_, _, x, y) = tmp_path / "shards" / name, offsets(tmp_path / "shards" / name)
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path}/journal/orchestrator.jsonl:3: task 'x' sample 0: a result (session x#0.0) for a key never "
        "queued: ignored",
        f"{shard}: byte offset {x}: session x#0.0 is of task 'x' sample 0, which the journal never queued",
        f"{shard}: byte offset {y}: session y#0.0 is of task 'y' sample 0, which the journal never queued",
    ]


def test_journal_lines_cut_short(tmp_path, caplog):
    """A last line without newline is still being written; a line a crash cut (ended by the next
    start's newline) is skipped, and the lines after it count."""
    name = write_shard(tmp_path, "gw", 1, [trajectory("a", i) for i in range(3)])
    journal(tmp_path, *(queued("a", i) for i in range(3)), result("a", 0, name))
    path = tmp_path / "journal" / "orchestrator.jsonl"
    whole = json.dumps(result("a", 1, name))
    append_line(path, whole[:25], newline=False)  # the orchestrator was killed mid-line
    f = Follower(tmp_path, poll_s=0.01, idle_timeout_s=0.2)
    assert keys(f) == [("a", 0, "a#0.0")] and not f.complete()
    append_line(path, "")  # its next start ends the cut line
    journal(tmp_path, result("a", 1, name), result("a", 2, name))
    with caplog.at_level(logging.WARNING):
        f.idle_timeout_s = 10
        assert keys(f) == [("a", 1, "a#1.0"), ("a", 2, "a#2.0")] and f.complete()
    assert f"{path}:5: skipping a line that is not a journal event" in caplog.text
    assert [t.sample_index for t in iter_trajectories(tmp_path)] == [0, 1, 2]


def _three_shards(run):
    names = [write_shard(run, "gw", i + 1, [trajectory("a", i)], indexed=False) for i in range(3)]
    journal(run, *(queued("a", i) for i in range(3)), *(result("a", i, n) for i, n in enumerate(names)))
    return names


def _follow_cli(run):
    got = polar("shards", "follow", run, "--json", "--idle-timeout", "30")
    assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
    assert "run complete: 3 trajectories" in got.stderr, got.stderr
    assert sorted(json.loads(line)["sample_index"] for line in got.stdout.splitlines()) == [0, 1, 2]
    return got.stderr


def test_garbage_index_line_is_named_and_skipped(tmp_path):
    names = _three_shards(tmp_path)
    index = tmp_path / "shards" / "index" / "gw.jsonl"
    entry = {"seq": 1, "shard": names[0], "records": 1, "bytes": 1, "t": 1.0}
    for line in (json.dumps(entry), "\x00garbage{", json.dumps(entry),  # a repeat
                 json.dumps(entry | {"seq": 2, "shard": "../../etc/passwd"}), json.dumps(entry | {"seq": 3, "shard": names[2]})):
        append_line(index, line)
    err = _follow_cli(tmp_path)
    assert f"{index}:2: not an index entry (not JSON): skipped" in err
    assert f"{index}:4: not an index entry (shard '../../etc/passwd' is not gw-<seq 2>.shard): skipped" in err
    checked = polar("shards", "verify", tmp_path)
    assert checked.returncode == 1 and "Traceback" not in checked.stderr
    assert checked.stdout.splitlines() == [
        f"{index}:2: not an index entry (not JSON): skipped",
        f"{index}:4: not an index entry (shard '../../etc/passwd' is not gw-<seq 2>.shard): skipped",
        f"{tmp_path / 'shards' / names[1]}: sealed but not in {index} (a follower reads it only once the journal "
        "names it)",
    ]


def test_missing_index_is_found_and_reported(tmp_path):
    names = _three_shards(tmp_path)
    assert "sealed but not in" in _follow_cli(tmp_path)  # read after the grace, not waited for forever
    checked = polar("shards", "verify", tmp_path)
    assert checked.returncode == 1 and len(checked.stdout.splitlines()) == 3
    assert all(f"{n}: sealed but not in" in line for n, line in zip(names, checked.stdout.splitlines()))


def test_an_index_entry_after_the_shard_was_read_is_not_news(tmp_path):
    first = write_shard(tmp_path, "gw", 1, [trajectory("a", 0)], indexed=False)
    journal(tmp_path, queued("a", 0), queued("a", 1), result("a", 0, first))
    f = Follower(tmp_path, poll_s=0.01, idle_timeout_s=0.5, index_grace_s=0.05)
    assert keys(f) == [("a", 0, "a#0.0")] and not f.complete()
    index = tmp_path / "shards" / "index" / "gw.jsonl"
    append_line(index, json.dumps({"seq": 1, "shard": first, "records": 1, "bytes": 1, "t": 1.0}))  # late
    journal(tmp_path, result("a", 1, write_shard(tmp_path, "gw", 2, [trajectory("a", 1)])))
    f.idle_timeout_s = 10
    assert keys(f) == [("a", 1, "a#1.0")] and f.complete() and f.stats["strays"] == 0
