"""Every request field of each API is honoured, refused or of no effect, as `proxy.fields` says, as
docs/proxy.md shows, and as the official SDKs list them; through a real proxy to the scripted
engine every refused or unknown field gets its 400 in the API's shape, naming the field; images
are refused, never stringified."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from anthropic.types import message_create_params as anthropic_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as responses_params

from polar_hpc import wire
from polar_hpc.proxy import fields

from proxy.helpers import CALCULATOR

DOC = Path(__file__).resolve().parents[2] / "docs" / "proxy.md"
TITLES = {"openai_chat": "Chat Completions", "openai_responses": "Responses",
          "anthropic_messages": "Anthropic Messages"}
SDK = {"openai_chat": chat_params.CompletionCreateParamsBase,
       "openai_responses": responses_params.ResponseCreateParamsBase,
       "anthropic_messages": anthropic_params.MessageCreateParamsBase}
PATHS = {"openai_chat": "/v1/chat/completions", "openai_responses": "/v1/responses",
         "anthropic_messages": "/v1/messages"}
ASK = "What is 2 + 2?"
MINIMAL = {
    "openai_chat": {"model": "m", "messages": [{"role": "user", "content": ASK}]},
    "openai_responses": {"model": "m", "input": ASK},
    "anthropic_messages": {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": ASK}]},
}
REFUSED_VALUE = {  # a value each refused field may take that asks for what the proxy lacks
    "modalities": ["text", "audio"], "verbosity": "low", "background": True, "top_logprobs": 3,
    "truncation": "auto", "speed": "fast", "thinking": {"type": "enabled", "budget_tokens": 1024},
}


def doc_tables() -> dict[str, dict[str, tuple[str, str]]]:
    """docs/proxy.md's Request fields tables: API -> field -> (effect column, how)."""
    text = DOC.read_text()
    section = text[text.index("## Request fields"):text.index("## Capture modes")]
    tables = {}
    for api, title in TITLES.items():
        part = section[section.index(f"#### {title}\n"):]
        part = part[:part.find("\n\n", part.index("| --- |"))]
        rows = [line for line in part.splitlines()[4:] if line.startswith("| `")]
        tables[api] = {m[1]: (m[2], m[3]) for m in
                       (re.match(r"\| `([^`]+)` \| (.+?) \| (.+) \|$", row) for row in rows) if m}
        assert len(tables[api]) == len(rows), f"a malformed row in {title}"
    return tables


def effect_column(f: fields.Field) -> str:
    if not f.accept:
        return f.effect
    return f.effect + " unless " + " or ".join(f"`{json.dumps(v)}`" for v in f.accept)


def test_docs_show_the_code_tables_exactly():
    docs = doc_tables()
    for api, table in fields.TABLES.items():
        assert docs[api] == {k: (effect_column(f), f.how) for k, f in table.items()}, api


@pytest.mark.parametrize("api", list(SDK))
def test_every_field_the_sdk_knows_is_in_the_table(api):
    known = set(SDK[api].__annotations__) | {"stream"}
    assert known - set(fields.TABLES[api]) == set()
    assert all(f.effect in (fields.HONOURED, fields.NO_EFFECT, fields.REFUSED) for f in fields.TABLES[api].values())


def post(proxy, api: str, body: dict, token: str) -> httpx.Response:
    headers = {"x-api-key": token} if api == "anthropic_messages" else {"Authorization": f"Bearer {token}"}
    return httpx.post(proxy.url + PATHS[api], json=body, headers=headers, timeout=300)


def refused_in_shape(api: str, r: httpx.Response, field: str) -> str:
    """The error message of a 400 in the API's own error shape, which names `field`."""
    assert r.status_code == 400, r.text
    body = r.json()
    if api == "anthropic_messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    else:
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == field
        message = body["error"]["message"]
    assert field in message
    return message


@pytest.mark.parametrize("api", list(SDK))
def test_every_refused_and_unknown_field_gets_its_400(proxy, api):
    token = f"f-{api}"
    proxy.gateway.open(token, token)
    refused = [k for k, f in fields.TABLES[api].items() if f.effect == fields.REFUSED]
    for field in [*refused, "no_such_field"]:
        value = REFUSED_VALUE.get(field, {"x": 1})
        message = refused_in_shape(api, post(proxy, api, {**MINIMAL[api], field: value}, token), field)
        if field == "no_such_field":
            assert "unknown field" in message
    # the API's own default of a refused field is accepted; no-effect fields are accepted
    quiet = {k: "x" for k, f in fields.TABLES[api].items() if f.effect == fields.NO_EFFECT}
    quiet.update({k: f.accept[0] for k, f in fields.TABLES[api].items() if f.accept})
    quiet["metadata"] = {"k": "v"}
    if "cache_control" in quiet:
        quiet["cache_control"] = {"type": "ephemeral"}
    if "prompt_cache_options" in quiet:
        quiet["prompt_cache_options"] = {}
    r = post(proxy, api, {**MINIMAL[api], **quiet}, token)
    assert r.status_code == 200, r.text
    assert proxy.gateway.expect(wire.CallRecord).api == api


IMAGE_URL = "data:image/png;base64,iVBORw0KGgo="
IMAGES = {
    "openai_chat": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": IMAGE_URL}}]}]},
    "openai_responses": {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": IMAGE_URL}]}]},
    "anthropic_messages": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
}


@pytest.mark.parametrize("api", list(SDK))
def test_images_are_refused_not_stringified(proxy, api):
    token = f"i-{api}"
    proxy.gateway.open(token, token)
    r = post(proxy, api, {**MINIMAL[api], **IMAGES[api]}, token)
    assert r.status_code == 400, r.text
    assert "takes no images" in r.text


def test_an_image_in_a_tool_result_is_refused(proxy):
    proxy.gateway.open("i-tool", "i-tool")
    turns = [{"role": "user", "content": ASK},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "calculator",
                                                "input": {"expression": "2+2"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                 {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}]
    r = post(proxy, "anthropic_messages", {**MINIMAL["anthropic_messages"], "messages": turns}, "i-tool")
    assert r.status_code == 400 and "takes no images" in r.text, r.text


def test_other_tool_types_are_refused(proxy):
    proxy.gateway.open("t-types", "t-types")
    r = post(proxy, "openai_responses", {**MINIMAL["openai_responses"], "tools": [
        {"type": "function", "name": "calculator", "parameters": CALCULATOR["parameters"]},
        {"type": "web_search"}]}, "t-types")
    assert refused_in_shape("openai_responses", r, "tools[1]")
    r = post(proxy, "anthropic_messages", {**MINIMAL["anthropic_messages"], "tools": [
        {"type": "bash_20250124", "name": "bash"}]}, "t-types")
    assert refused_in_shape("anthropic_messages", r, "tools.0")
