from __future__ import annotations

import asyncio
import os
import time

import pytest

from polar_hpc.config import CommandEvaluator, RegexEvaluator, RewardFileEvaluator
from polar_hpc.sandbox.none import NoneSandbox
from polar_hpc.trajectory.evaluators import evaluate


@pytest.fixture
def sandbox(tmp_path):
    box = NoneSandbox(tmp_path / "box", files={}, prepare=[], network="host")
    asyncio.run(box.start())
    yield box
    asyncio.run(box.stop())


def run(spec, sandbox, records=()):
    return asyncio.run(evaluate(spec, sandbox, list(records)))


def test_no_evaluator(sandbox):
    assert run(None, sandbox).reward is None


def test_command_pass_and_fail(sandbox):
    (sandbox.workspace / "answer.txt").write_text("42\n")
    ok = run(CommandEvaluator(kind="command", command="grep -q 42 answer.txt && echo fine"), sandbox)
    assert ok.reward == 1.0 and ok.detail == "exit 0: fine"
    bad = run(CommandEvaluator(kind="command", command="echo nope >&2; exit 3"), sandbox)
    assert bad.reward == 0.0 and bad.detail == "exit 3: nope"


def test_command_timeout(sandbox):
    out = run(CommandEvaluator(kind="command", command="echo started; sleep 30", timeout_s=0.3), sandbox)
    assert out.reward == 0.0
    assert out.detail.startswith("evaluator command timed out after 0.3s")


def test_command_detail_is_tail(sandbox):
    out = run(CommandEvaluator(kind="command", command="seq 1 5000"), sandbox)
    assert out.detail.endswith("4999\n5000") and len(out.detail) < 2100


def test_reward_file_good_missing_garbage(sandbox):
    spec = RewardFileEvaluator(kind="reward_file", path="out/reward.txt")
    missing = run(spec, sandbox)
    assert missing.reward is None and "out/reward.txt: not found" in missing.detail
    (sandbox.workspace / "out").mkdir()
    target = sandbox.workspace / "out" / "reward.txt"
    target.write_text(" 0.75\n")
    assert run(spec, sandbox).reward == 0.75
    target.write_text("great job")
    garbage = run(spec, sandbox)
    assert garbage.reward is None and "out/reward.txt: not a float: 'great job'" in garbage.detail
    target.write_text("nan")
    assert run(spec, sandbox).reward is None


def test_regex(sandbox, record):
    records = [record(0, [1], [2], "thinking"), record(1, [1, 2, 3], [4], "The answer is 42.")]
    hit = run(RegexEvaluator(kind="regex", pattern=r"answer is (\d+)"), sandbox, records)
    assert hit.reward == 1.0 and "'answer is 42'" in hit.detail
    assert run(RegexEvaluator(kind="regex", pattern="thinking"), sandbox, records).reward == 0.0
    assert run(RegexEvaluator(kind="regex", pattern="x"), sandbox, []).reward == 0.0
    broken = run(RegexEvaluator(kind="regex", pattern="(unclosed"), sandbox, records)
    assert broken.reward is None and "invalid regex" in broken.detail


def test_reward_file_is_never_followed_waited_on_or_read_whole(sandbox, tmp_path):
    secret = tmp_path / "host"
    secret.mkdir()
    (secret / "reward.txt").write_text("0.125")  # a host file the harness must not get scored by
    ws = sandbox.workspace
    os.mkfifo(ws / "fifo.txt")
    os.symlink(secret / "reward.txt", ws / "link.txt")
    os.symlink(secret, ws / "out")
    with open(ws / "huge.txt", "wb") as f:
        f.truncate(20 << 30)
    cases = {"fifo.txt": "not a regular file (a FIFO)", "link.txt": "a symbolic link (not followed)",
             "out/reward.txt": "out: a symbolic link (not followed)", "huge.txt": "larger than 4096 bytes",
             "../host/reward.txt": "leaves its folder"}
    for path, expected in cases.items():
        t0 = time.monotonic()
        out = run(RewardFileEvaluator(kind="reward_file", path=path), sandbox)
        assert out.reward is None and expected in out.detail, out.detail
        assert "0.125" not in out.detail
        assert time.monotonic() - t0 < 30  # a FIFO read would block for ever


def _answering_through_a_tool(record, arguments, text=None):
    last = record(1, [1, 2, 3], [4], "")
    last.response["choices"][0]["message"] = {"role": "assistant", "content": text, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "final_answer", "arguments": arguments}}]}
    return [record(0, [1], [2], "Let me compute 17 * 23 + 4 = 390. Hmm."), last]


def test_regex_reads_an_answer_given_through_a_tool_call(sandbox, record):
    """smolagents' ToolCallingAgent answers with final_answer({"answer": ...}) and no text."""
    spec = RegexEvaluator(kind="regex", pattern=r"(?m)^395$")  # the argument's value, not its JSON
    assert run(spec, sandbox, _answering_through_a_tool(record, '{"answer": "395"}')).reward == 1.0
    assert run(spec, sandbox, _answering_through_a_tool(record, '{"answer": 395}')).reward == 1.0
    assert run(spec, sandbox, _answering_through_a_tool(record, {"answer": "395"})).reward == 1.0
    assert run(spec, sandbox, _answering_through_a_tool(record, "395")).reward == 1.0  # not JSON: as written
    both = _answering_through_a_tool(record, '{"answer": "395"}', text="Done.")
    assert run(RegexEvaluator(kind="regex", pattern=r"Done\.\n395"), sandbox, both).reward == 1.0
    # an earlier reply does not count; a wrong answer through the tool scores 0
    wrong = _answering_through_a_tool(record, '{"answer": "1"}')
    assert run(RegexEvaluator(kind="regex", pattern="390"), sandbox, wrong).reward == 0.0
    assert run(spec, sandbox, _answering_through_a_tool(record, '{"answer": "3950"}')).reward == 0.0


def test_regex_survives_hostile_tool_calls(sandbox, record):
    records = _answering_through_a_tool(record, "[" * 100_000 + "]" * 100_000)
    records[1].response["choices"][0]["message"]["tool_calls"] += [None, {"function": "x"}, {"function": {}}]
    assert run(RegexEvaluator(kind="regex", pattern="395"), sandbox, records).reward == 0.0
