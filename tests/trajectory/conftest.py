"""Call records for trajectory tests."""

from __future__ import annotations

import pytest

from polar_hpc.wire import CallRecord


def _record(
    index: int,
    prompt: list[int],
    output: list[int],
    text: str = "",
    session: str = "s1",
    messages: list[dict] | None = None,
    tools: list[dict] | None = None,
    version: str = "v0",
    api: str = "openai_chat",
) -> CallRecord:
    request = {"model": "m", "messages": messages or [{"role": "user", "content": f"turn {index}"}]}
    if tools is not None:
        request["tools"] = tools
    return CallRecord(
        session_id=session,
        call_index=index,
        api=api,
        request=request,
        response={"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]},
        prompt_ids=prompt,
        output_ids=output,
        output_logprobs=[-0.5 - 0.25 * i for i in range(len(output))],
        finish_reason="stop",
        weight_version=version,
        engine_url="http://engine",
        stream=False,
        t_start=float(index),
        t_end=float(index) + 0.5,
    )


@pytest.fixture
def record():
    return _record
