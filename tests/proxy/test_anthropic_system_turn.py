"""A `system` turn inside Anthropic `messages` (Claude Code sends its reminders so) is accepted and
reaches the engine as a system message where it stood, in both capture modes."""

from __future__ import annotations

import anthropic
import pytest

from polar_hpc import wire
from polar_hpc.engines.scripted.chat_format import ChatFormat

from proxy.helpers import check_capture


def test_a_system_turn_mid_conversation_is_a_system_message(proxy, engine):
    proxy.gateway.open("s1", "s1")
    c = anthropic.Anthropic(base_url=proxy.url, api_key="s1", max_retries=0, timeout=20)
    reply = c.messages.create(model="claude", max_tokens=50, system="Be brief.", messages=[
        {"role": "user", "content": "Hello"},
        {"role": "system", "content": [{"type": "text", "text": "Reminder: answer in English."}]},
    ])
    assert reply.type == "message" and reply.stop_reason == "end_turn"
    rec = proxy.gateway.expect(wire.CallRecord)
    check_capture(rec, engine[1])
    prompt = ChatFormat().decode(rec.prompt_ids)
    assert prompt.index("Be brief.") < prompt.index("Hello") < prompt.index(
        "<|im_start|>system\nReminder: answer in English.<|im_end|>")


def test_a_system_turn_must_be_text(proxy):
    proxy.gateway.open("s2", "s2")
    c = anthropic.Anthropic(base_url=proxy.url, api_key="s2", max_retries=0, timeout=20)
    with pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(model="claude", max_tokens=10, messages=[
            {"role": "user", "content": "hi"}, {"role": "system", "content": 7}])
    assert "messages.1.content" in err.value.body["error"]["message"]
