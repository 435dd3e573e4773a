"""tito mode: the model's own rendering, drift-free history, real streaming, failover."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest
from transformers import AutoTokenizer

from polar_hpc import wire
from polar_hpc.engines.scripted.chat_format import ASSET_DIR, ChatFormat
from polar_hpc.proxy.calls import BadRequest
from polar_hpc.proxy.tito import RENDER_CACHE, Renderer, _templated

from proxy.helpers import CALCULATOR, MODEL, check_capture, extends, launch, start_engine, start_proxy, stop

TOOLS = [{"type": "function", "function": CALCULATOR}]


def sdk(proxy, token: str) -> openai.OpenAI:
    proxy.gateway.open(token, token)
    return openai.OpenAI(base_url=proxy.base_url, api_key=token, max_retries=0, timeout=30)


def test_renderer_is_the_engine_rendering():
    """The model folder's tokenizer + template, read without transformers, give the scripted
    engine's ids."""
    r, fmt = Renderer(ASSET_DIR), ChatFormat()
    messages = [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
         "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "5"},
    ]
    assert r.encode(r.text(messages, TOOLS, True)) == fmt.encode(fmt.render(messages, TOOLS))
    assert fmt.im_end_id in r.eos_ids


# A template that reads what apply_chat_template adds or drops: special tokens, tools or none,
# None-valued fields (dropped), reasoning under its other names (aliased), raise_exception.
PROBE_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if tools is not none -%}[tools: {{ tools | map(attribute='function.name') | join(',') }}]"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{- raise_exception('bad role ' + m.role) -}}{%- endif -%}"
    "<{{ m.role }}>"
    "{%- if m.reasoning_content is defined -%}<think>{{ m.reasoning_content }}</think>{%- endif -%}"
    "{%- if m.content is defined -%}{{ m.content if m.content is string else m.content | tojson }}"
    "{%- else -%}(no content){%- endif -%}"
    "{%- for tc in m.tool_calls or [] -%}<call {{ tc.function.name }} {{ tc.function.arguments | tojson }}>"
    "{%- endfor -%}{{ eos_token }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<assistant>{%- endif -%}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 2+3?"},
     {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'}}]},
     {"role": "tool", "tool_call_id": "c", "content": "5"}],
    [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
     {"role": "assistant", "content": "ab", "reasoning": "they asked for ab", "name": None}],
]


@pytest.mark.parametrize("template", ["scripted", "probe", "named"])
def test_renderer_renders_as_apply_chat_template(tmp_path, template):
    """As transformers renders, read without it: one template, or named ones (tool_use with tools)."""
    folder = ASSET_DIR
    if template != "scripted":
        folder = tmp_path
        config = json.loads((ASSET_DIR / "tokenizer_config.json").read_text())
        chosen = PROBE_TEMPLATE if template == "probe" else [
            {"name": "default", "template": "{% generation %}plain{% endgeneration %}" + PROBE_TEMPLATE},
            {"name": "tool_use", "template": "{% set ns = namespace(n=0) %}tools " + PROBE_TEMPLATE}]
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": chosen}))
        shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path)
    r = Renderer(folder)
    reference = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)  # what it must equal
    for messages in CONVERSATIONS:
        for tools in (TOOLS, None):
            for generation in (True, False):
                expected = reference.apply_chat_template(
                    _templated(messages), tools=tools, tokenize=False, add_generation_prompt=generation)
                assert r.text(messages, tools, generation) == expected
    if template == "probe":
        assert "<think>they asked for ab</think>" in r.text(CONVERSATIONS[2], None, False)
        assert "(no content)<call calculator" in r.text(CONVERSATIONS[1], None, False)
        with pytest.raises(Exception, match="bad role robot"):
            r.text([{"role": "robot", "content": "x"}], None, True)


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # a sandbox escape
    "{% set ns = namespace() %}{% set ns._x = 1 %}{{ ns._x }}",  # a private attribute
    "{{ raise_exception('no') }}",
])
def test_a_hostile_template_is_refused_per_call(tmp_path, template):
    config = json.loads((ASSET_DIR / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path)
    with pytest.raises(BadRequest, match="chat template cannot render"):
        Renderer(tmp_path).text([{"role": "user", "content": "Hi"}], None, True)


@pytest.mark.parametrize("broken, problem", [
    ({"tokenizer.json": "{not json"}, "cannot load the tokenizer in"),
    ({"tokenizer_config.json": "[1, 2]"}, "tokenizer_config.json is not a JSON object"),
    ({"tokenizer_config.json": "{\"chat_template\": 3}"}, "has no chat template"),
])
def test_a_broken_model_folder_is_a_clear_error(tmp_path, broken, problem):
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path)
    shutil.copy(ASSET_DIR / "tokenizer_config.json", tmp_path)
    for name, text in broken.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=problem):
        Renderer(tmp_path)


def test_renderer_caches_renderings_by_what_the_template_sees(monkeypatch):
    r = Renderer(ASSET_DIR)
    renders = []
    real = r._render
    monkeypatch.setattr(r, "_render", lambda *a: renders.append(1) or real(*a))
    hi = [{"role": "user", "content": "Hi"}]
    first = r.text(hi, TOOLS, True)
    assert r.text([{"role": "user", "content": "Hi"}], TOOLS, True) == first
    assert len(renders) == 1
    assert r.text(hi, None, True) != first  # tools, messages and the generation prompt are the key
    assert r.text([{"role": "user", "content": "Ho"}], TOOLS, True) != first
    assert r.text(hi, TOOLS, False) != first
    assert len(renders) == 4
    for i in range(RENDER_CACHE):
        r.text([{"role": "user", "content": str(i)}], None, True)
    assert r.text(hi, TOOLS, True) == first and len(renders) == 4 + RENDER_CACHE + 1  # evicted


@pytest.mark.parametrize("mode", ["tito", "passthrough"])
def test_reformatted_history_is_spliced_token_exactly(short_tmp, gateway, engine, mode):
    """A harness re-sends the tool call with its JSON re-serialized (as many do): tito still
    extends the sampled ids; passthrough re-tokenizes and drifts."""
    proxy = start_proxy(short_tmp, gateway, engine[0], mode=mode)
    try:
        c = sdk(proxy, "t1")
        question = [{"role": "user", "content": "What is 2+3?"}]
        first = c.chat.completions.create(model=MODEL, messages=question, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        resent = {"role": "assistant", "content": "", "tool_calls": [{
            "id": call.id, "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression":"2+3"}'}}]}
        history = question + [resent, {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        second = c.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
        assert second.choices[0].message.content == "The answer is 5."
        third = c.chat.completions.create(model=MODEL, messages=history + [
            {"role": "assistant", "content": "The answer is 5."},
            {"role": "user", "content": "What is 5*5?"}], tools=TOOLS)
        assert third.choices[0].finish_reason == "tool_calls"
        r1, r2, r3 = (gateway.expect(wire.CallRecord) for _ in range(3))
        for r in (r1, r2, r3):
            check_capture(r, engine[1])
        if mode == "passthrough":
            assert not extends(r2, r1)
            return
        assert extends(r2, r1) and extends(r3, r2)
        assert [r.meta["chain"] for r in (r1, r2, r3)] == [0, 0, 0]
        assert r1.meta["new_chain"] == "first call of the session" and "new_chain" not in r2.meta

        edited = [{"role": "user", "content": "What is 2+3?"},
                  {"role": "assistant", "content": "I changed this."},
                  {"role": "user", "content": "What is 2+3?"}]
        c.chat.completions.create(model=MODEL, messages=edited, tools=TOOLS)
        r4 = gateway.expect(wire.CallRecord)
        check_capture(r4, engine[1])
        assert r4.meta["chain"] == 1 and r4.meta["new_chain"] == "message 1 differs from chain 0"
    finally:
        proxy.stop()


def test_tokens_stream_as_they_are_sampled(short_tmp, gateway):
    proc, url, log = start_engine(short_tmp, "slow", "--token-delay-ms", "40")
    proxy = start_proxy(short_tmp, gateway, url)
    try:
        c = sdk(proxy, "t2")
        hi = [{"role": "user", "content": "Hi"}]
        c.chat.completions.create(model=MODEL, messages=hi, max_tokens=1)  # loads the tokenizer
        gateway.expect(wire.CallRecord)
        arrivals = [time.monotonic() for chunk in c.chat.completions.create(
                    model=MODEL, messages=hi, stream=True)
                    if chunk.choices and chunk.choices[0].delta.content]
        rec = gateway.expect(wire.CallRecord)
        check_capture(rec, log)
        n = len(rec.output_ids)
        assert n > 10 and len(arrivals) >= n // 2  # many pieces, not one lump
        # pieces arrive at the engine's pace (40 ms a token), not all at once at the end
        assert arrivals[-1] - arrivals[0] > 0.5 * 0.04 * (n - 2)
    finally:
        proxy.stop()
        stop(proc)


def test_failover_when_an_engine_stops_mid_session(short_tmp, gateway):
    engines = [start_engine(short_tmp, name) for name in ("e0", "e1")]
    urls = [url for _, url, _ in engines]
    proxy = start_proxy(short_tmp, gateway, urls)
    try:
        c = sdk(proxy, "t3")
        question = [{"role": "user", "content": "What is 2+3?"}]
        first = c.chat.completions.create(model=MODEL, messages=question, tools=TOOLS)
        r1 = gateway.expect(wire.CallRecord)
        assert "retried" not in r1.meta
        stop(engines[urls.index(r1.engine_url)][0])  # the session's engine goes away
        history = question + [first.choices[0].message.model_dump(exclude_none=True),
                              {"role": "tool", "tool_call_id": "x", "content": "5"}]
        second = c.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
        assert second.choices[0].message.content == "The answer is 5."
        r2 = gateway.expect(wire.CallRecord)
        assert r2.meta["retried"] == [r1.engine_url] and r2.engine_url != r1.engine_url
        check_capture(r2, engines[urls.index(r2.engine_url)][2])
        assert extends(r2, r1)  # the chain survives the move
    finally:
        proxy.stop()
        for proc, _, _ in engines:
            stop(proc)


@pytest.mark.parametrize("options, problem", [
    ({"tokenizer": "/nonexistent/model"}, "cannot load the tokenizer in /nonexistent/model"),
    ({"mode": "magic"}, "Invalid enum value 'magic' - at `$.settings.mode`"),
    ({"tool_parser": "xml"}, "Invalid enum value 'xml' - at `$.settings.tool_parser`"),
    ({"max_body_mb": 0}, "Expected `float` > 0.0 - at `$.settings.max_body_mb`"),
    ({"engine_kind": "tgi"}, "engine kind 'tgi' is not known"),
])
def test_bad_options_are_exit_2(gateway, engine, options, problem):
    """A launch the proxy cannot serve with (one a gateway never writes: it validated the topology)
    is refused before it listens, naming the field."""
    done = subprocess.run([sys.executable, "-m", "polar_hpc", "proxy", launch(gateway, engine[0], **options).argument()],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert problem in done.stderr and "Traceback" not in done.stderr


def test_strict_model_refuses_other_names(short_tmp, gateway, engine):
    proxy = start_proxy(short_tmp, gateway, engine[0], strict_model=True)
    try:
        c = sdk(proxy, "t4")
        with pytest.raises(openai.NotFoundError) as err:
            c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
        assert err.value.body["code"] == "model_not_found" and MODEL in err.value.body["message"]
        answer = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
        assert answer.model == MODEL
        assert gateway.expect(wire.CallRecord).call_index == 0  # the refused call left none
    finally:
        proxy.stop()


def test_tokenizer_is_loaded_before_hello_never_on_a_call(short_tmp, gateway, engine):
    """The gateway assigns no session before ProxyHello; the proxy says it only once its tokenizer
    (from the engine's folder) is loaded, so the first call loads nothing."""
    proxy = start_proxy(short_tmp, gateway, engine[0])  # returns once ProxyHello arrived
    try:
        loaded = proxy.log.read_text()
        assert loaded.count("tito: tokenizer ") == 1, loaded
        c = sdk(proxy, "t5")
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
        check_capture(gateway.expect(wire.CallRecord), engine[1])
        assert proxy.log.read_text().count("tito: tokenizer ") == 1
    finally:
        proxy.stop()


def test_renderer_tokenizes_on_the_calling_thread():
    """No hand-off to tokenizers' thread pool: the event loop would wait for that thread to run."""
    r = Renderer(ASSET_DIR)
    before = threading.active_count(), len(list(Path("/proc/self/task").iterdir()))
    assert r.encode("What is 2+3? " * 500) == ChatFormat().encode("What is 2+3? " * 500)
    assert (threading.active_count(), len(list(Path("/proc/self/task").iterdir()))) == before
