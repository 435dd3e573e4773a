"""The API-neutral shape of one harness call, shared by the API adapters and the capture modes.

An API adapter (`openai_chat`, `openai_responses`, `anthropic`) turns the harness's body into a
`Call`: the conversation as OpenAI Chat messages and tools (the lingua franca of chat templates),
sampling limits, reasoning settings (a `Reasoning`), and whether to stream. A capture mode
(`tito`, `passthrough`) answers a `Call` with text deltas as they are sampled and, last, one
`Outcome`: the reply (content, tool calls, finish reason) and what was captured (prompt ids,
sampled ids, logprobs, weight version, engine, and `meta`: the rid, chain and retry notes).
`BadRequest` is the harness's fault (HTTP 400). `assistant_message(outcome)` is the reply as an OpenAI Chat assistant message, and
`message_key(message)` is what a re-sent history must match, as a hashable tuple (ids and
formatting of JSON arguments ignored). `StreamEvents` is the base of each API's streamed answer
(`delta(piece)`: a piece of content or, once complete, a tool call). `sse(data, event)` is one
Server-Sent Event;
`usage(outcome)` the token counts; `number(body, key, kind)`, `stops(body, key)`,
`controls(body)` (seed, top_k, min_p, penalties, logit_bias), `effort(value, field)` (a reasoning
effort level) and `array(body, key)` read optional fields or raise BadRequest naming them;
`text_of` is a content's text, any other part (an image, `not_text` says why) a BadRequest; `decode_object(raw)`
is the body as a JSON object, anything else (not UTF-8, not JSON, nested too deep) a BadRequest;
`check_messages(messages)` refuses Chat messages of the wrong shape, naming the field. `new_id()`
is a fresh 32-hex-digit id (this process's random prefix and a counter: uuid4's uniqueness
without a system call per id). `offload(size, fn, *args)` runs the work of a call whose body is
over `BIG` bytes (parsing, rendering, tokenizing) in a worker thread, so the event loop keeps
serving other calls and heartbeats meanwhile; `release_memory()` hands what such a call used back
to the system once it is over.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import itertools
import json
import os
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from polar_hpc.errors import PolarError


class BadRequest(PolarError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


_ids = itertools.count()
_ID_PREFIX: str  # set by _new_prefix, in this process and in each forked child


def _new_prefix() -> None:
    global _ID_PREFIX
    _ID_PREFIX = os.urandom(8).hex()


_new_prefix()
os.register_at_fork(after_in_child=_new_prefix)  # a forked child must not repeat its parent's ids


def new_id() -> str:
    return f"{_ID_PREFIX}{next(_ids):016x}"


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")  # OpenAI's reasoning effort levels


@dataclass(frozen=True)
class Reasoning:
    """A call's reasoning settings (`reasoning.template_kwargs` passes them to the chat template)."""

    field: str  # the harness's field, named in errors: reasoning_effort | reasoning.effort | thinking
    effort: str | None = None  # one of EFFORTS
    think: bool | None = None  # thinking on (with `budget`) or off
    budget: int | None = None  # tokens of thinking, with think=True


@dataclass
class Call:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    logprobs: bool = False  # the harness wants per-token logprobs in its answer
    top_logprobs: int = 0  # and this many alternatives at each token
    sampling: dict[str, Any] = field(default_factory=dict)  # `controls(body)`: seed, top_k, penalties...
    tool_choice: str | dict[str, str] = "auto"  # auto | none | required | {"name": NAME}
    one_call: bool = False  # parallel tool calls off: the harness gets the first call only
    response_format: dict[str, Any] | None = None  # {"type": "json_object" | "json_schema", "schema"?}
    n: int = 1  # choices asked (Chat): each a sample of its own
    reasoning: Reasoning | None = None  # reasoning settings asked, for the chat template
    id: str = field(default_factory=new_id)  # the engine rid, in tito mode
    chat_body: dict[str, Any] | None = None  # openai_chat only: the harness's own body
    size: int = 0  # bytes of the harness's body: over BIG, the call's work is offloaded


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON string


@dataclass
class Outcome:
    rid: str
    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str  # stop | length | tool_calls
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    weight_version: str
    engine_url: str
    cached_tokens: int = 0
    token_texts: list[str] | None = None  # per sampled token, when known (chat logprobs)
    top_logprobs: list[list[tuple[str, float]]] | None = None  # per sampled token, when asked
    token_versions: list[str] | None = None  # per sampled token, when they differ (engines.capture)
    meta: dict[str, Any] = field(default_factory=dict)
    choices: list[Outcome] = field(default_factory=list)  # n > 1: the other choices, each recorded


def assistant_message(outcome: Outcome) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": outcome.content}
    if outcome.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in outcome.tool_calls
        ]
    return message


_MEDIA = {"image_url": "images", "input_image": "images", "image": "images", "input_audio": "audio",
          "input_file": "files", "file": "files", "document": "documents"}


def not_text(kind: Any) -> str:
    """Why a content part of this type is refused."""
    media = _MEDIA.get(kind) if isinstance(kind, str) else None
    return f"this model takes no {media}, only text" if media else f"parts of type {kind!r} are not supported"


def text_of(content: Any, where: str = "content", kinds: tuple[str, ...] = ("text",)) -> str:
    """The text of a message's content: a string, or the text of its parts, each of `kinds`
    (BadRequest naming the part for any other part, an image say, or a text that is not a string:
    nothing but text reaches the model, and nothing is dropped)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise BadRequest(f"{where}[{i}]: {not_text(kind)}", f"{where}[{i}].type")
        text = part.get("text", "")
        if not isinstance(text, str):
            raise BadRequest(f"{where}: the text of a text part must be a string", where)
        texts.append(text)
    return "".join(texts)


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def message_key(message: dict[str, Any]) -> tuple:
    """What a re-sent message must keep: role, text, and tool calls' names and arguments."""
    calls = tuple(
        (fn.get("name"), json.dumps(_arguments(fn.get("arguments")), sort_keys=True))
        for fn in ((c.get("function") or c) for c in message.get("tool_calls") or [])
    )
    return (message.get("role"), text_of(message.get("content")), calls)


class StreamEvents(ABC):
    """One streamed answer in an API's own events, each method returning the bytes to write:
    `start()`, then `delta(piece)` for each piece of content (a str) or complete tool call (a
    `ToolCall`, numbered from 0 in order), then `end(outcome)` (the calls not streamed yet, the
    finish) or `error(status, message, kind)` once the stream has begun."""

    calls_sent = 0

    def delta(self, piece: str | ToolCall) -> bytes:
        if isinstance(piece, str):
            return self.text(piece)
        self.calls_sent += 1
        return self.tool_call(piece, self.calls_sent - 1)

    def unsent(self, outcome: Outcome) -> bytes:
        """The outcome's tool calls not yet streamed, as events."""
        calls = outcome.tool_calls[self.calls_sent:]
        return b"".join(self.delta(c) for c in calls)

    @abstractmethod
    def start(self) -> bytes: ...

    @abstractmethod
    def text(self, delta: str) -> bytes: ...

    @abstractmethod
    def tool_call(self, call: ToolCall, index: int) -> bytes: ...

    @abstractmethod
    def end(self, outcome: Outcome) -> bytes: ...

    @abstractmethod
    def error(self, status: int, message: str, kind: str) -> bytes: ...


def sse(data: Any, event: str | None = None) -> bytes:
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + msgspec.json.encode(data) + b"\n\n"


def usage(outcome: Outcome) -> tuple[int, int, int]:
    """(prompt tokens, sampled tokens, prompt tokens the engine had cached)."""
    return len(outcome.prompt_ids), len(outcome.output_ids), outcome.cached_tokens


def number(body: dict[str, Any], key: str, kind: type = float) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        kind is int and not isinstance(value, int)
    ):
        raise BadRequest(f"{key!r} must be {'an integer' if kind is int else 'a number'}", key)
    if kind is int and value < 1:
        raise BadRequest(f"{key!r} must be at least 1", key)
    return value


def stops(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise BadRequest(f"{key!r} must be a string or a list of strings", key)


_CONTROLS = {  # sampling controls every API may carry: field -> (type, what it must be)
    "seed": (int, "an integer"), "top_k": (int, "an integer"), "min_p": (float, "a number"),
    "presence_penalty": (float, "a number"), "frequency_penalty": (float, "a number"),
    "repetition_penalty": (float, "a number"),
}


def controls(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling controls of `body` beyond temperature, top_p, stop and the token limit, for
    the engine (`_CONTROLS`, and `logit_bias`: token id -> bias), or BadRequest naming one."""
    out: dict[str, Any] = {}
    for key, (kind, what) in _CONTROLS.items():
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)):
            raise BadRequest(f"{key!r} must be {what}", key)
        out[key] = value
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or not all(
            isinstance(k, str) and k.isdigit() and isinstance(v, (int, float)) and not isinstance(v, bool)
            for k, v in bias.items()
        ):
            raise BadRequest("'logit_bias' must map token ids to numbers", "logit_bias")
        if bias:
            out["logit_bias"] = bias
    return out


def effort(value: Any, field: str) -> Reasoning | None:
    """An OpenAI reasoning effort level (None: not asked), or BadRequest naming `field`."""
    if value is None:
        return None
    if value not in EFFORTS:
        raise BadRequest(f"{field!r} must be one of {', '.join(EFFORTS)}", field)
    return Reasoning(field, effort=value)


def decode_object(raw: bytes) -> dict[str, Any]:
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON in UTF-8: {e}") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def array(body: dict[str, Any], key: str) -> list[Any]:
    """An optional array field (absent or null: empty), or BadRequest naming it."""
    value = body.get(key) or []
    if not isinstance(value, list):
        raise BadRequest(f"{key!r} must be an array", key)
    return value


def check_messages(messages: list[Any]) -> None:
    """Chat messages as the capture modes read them, or BadRequest naming the first bad field."""
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where} must be an object", where)
        if not isinstance(m.get("role"), str):
            raise BadRequest(f"{where}.role must be a string", f"{where}.role")
        if not isinstance(m.get("content"), (str, list, type(None))):
            raise BadRequest(f"{where}.content must be a string, an array of parts or null", f"{where}.content")
        text_of(m.get("content"), f"{where}.content")
        for key in ("name", "tool_call_id"):
            if not isinstance(m.get(key), (str, type(None))):
                raise BadRequest(f"{where}.{key} must be a string", f"{where}.{key}")
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise BadRequest(f"{where}.tool_calls must be an array", f"{where}.tool_calls")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                    or not isinstance(fn.get("arguments"), (str, dict)):
                raise BadRequest(f"{where}.tool_calls[{j}] must be an object with a function "
                                 "{name: string, arguments: string}", f"{where}.tool_calls[{j}]")


BIG = 256 << 10  # a body over this many bytes has its work done in the worker thread
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="big-call")
_malloc_trim: Callable[[int], int] | None
try:
    _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
except (OSError, AttributeError):  # not glibc
    _malloc_trim = None


async def offload(size: int, fn, *args):
    """`fn(*args)`: inline for a call of `size` <= BIG bytes (no thread hop for the common call),
    else in the one worker thread (other big calls wait their turn: one big call's tokenizing
    needs about 200 bytes of memory per byte of text at its peak)."""
    if size <= BIG:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(_WORKER, functools.partial(fn, *args))


def release_memory() -> None:
    """Have the worker give the memory big calls used back to the system once it is idle (glibc
    keeps freed memory in its arenas otherwise: 10 MB calls left the proxy at 1.2 GB)."""
    if _malloc_trim is not None:
        _WORKER.submit(_malloc_trim, 0)
