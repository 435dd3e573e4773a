"""The chat view of a call record, per API: request messages and tools, the assistant's reply.

`openai_chat` records are read as they are; records of the other APIs (`openai_responses`,
`anthropic_messages`) carry the proxy's chat view of the call in `meta["chat"]` (messages, tools,
reply). A record with neither raises `UnsupportedApi` naming the call; a record that lacks the
expected structure raises ValueError naming the call.
"""

from __future__ import annotations

import json
from typing import Any

from polar_hpc.errors import PolarError
from polar_hpc.wire import CallRecord

SUPPORTED_APIS = ("openai_chat",)


class UnsupportedApi(PolarError, ValueError):
    """The record's api has no message adapter here."""


def _chat_view(record: CallRecord) -> dict[str, Any] | None:
    """The proxy's chat view of a non-Chat call; None for openai_chat records."""
    if record.api in SUPPORTED_APIS:
        return None
    view = record.meta.get("chat")
    if not isinstance(view, dict):
        raise UnsupportedApi(
            f"call {record.call_index}: api {record.api!r} is not supported without a chat view "
            f"(supported: {', '.join(SUPPORTED_APIS)})"
        )
    return view


def request_messages(record: CallRecord) -> list[dict[str, Any]]:
    """A copy of the conversation the harness sent."""
    view = _chat_view(record)
    return list((view or record.request).get("messages") or [])


def request_tools(record: CallRecord) -> list[dict[str, Any]]:
    """The tool definitions the harness offered (empty when none)."""
    view = _chat_view(record)
    return list((view or record.request).get("tools") or [])


def assistant_message(record: CallRecord) -> dict[str, Any]:
    """The assistant message the engine answered with."""
    view = _chat_view(record)
    if view is not None:
        return dict(view.get("reply") or {})
    try:
        message = record.response["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(
            f"call {record.call_index}: openai_chat response has no choices[0].message"
        ) from None
    if not isinstance(message, dict):
        raise ValueError(f"call {record.call_index}: openai_chat choices[0].message is not an object")
    return message


def final_answer(records: list[CallRecord]) -> str:
    """The session's final answer: the last call's assistant reply, its text and then, one per
    line, the arguments of each tool call it makes (an agent may answer through a tool, e.g.
    smolagents' `final_answer`). Arguments that are a JSON object give their values (strings as
    written, others as JSON), anything else its text. '' when there is no call."""
    if not records:
        return ""
    message = assistant_message(max(records, key=lambda r: r.call_index))
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    parts = [content] if isinstance(content, str) and content else []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(_argument_text(function.get("arguments")))
    return "\n".join(parts)


def _argument_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    if isinstance(arguments, dict):
        return "\n".join(v if isinstance(v, str) else json.dumps(v) for v in arguments.values())
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
