"""Every message that crosses a process boundary, and the one codec for them.

Messages are msgspec Structs tagged by class name and encoded as msgpack (the same library encodes
shard records). Links:

- gateway <-> orchestrator (ZeroMQ DEALER -> ROUTER, tcp or ipc): Hello, Heartbeat, Assign, Report
  (the Credit, SessionUpdate and Result of one flush; each may also come alone), Cancel, Shutdown.
  Messages are per batch, not per session: an Assign carries every session one Credit bought, a
  Report all a gateway has to say since its last one.
- engine step -> orchestrator (DEALER -> ROUTER, tcp): EngineHello, Heartbeat, EngineBye; the
  orchestrator relays the live engines to every gateway as Engines, which the gateway forwards to
  its proxy (the URL list a proxy routes over).
- client (CLI, launcher, trainer) -> orchestrator (DEALER -> ROUTER): StatusRequest -> StatusReply,
  Shutdown.
- trainer (polar_hpc.client) -> orchestrator of a service run (DEALER -> ROUTER): SubmitTasks ->
  Submitted | Busy | Refused, BatchStatusRequest -> BatchStatus, CancelTasks -> Cancelled,
  UpdateWeights -> WeightsUpdated, Drain -> StatusReply.
- proxy <-> gateway (DEALER -> ROUTER over ipc): ProxyHello, OpenSession -> SessionOpened,
  CloseSession -> SessionClosed, CallRecord, Heartbeat, Engines.
- gateway -> its proxy child, once, as the child's one command-line argument (JSON): ProxyLaunch,
  holding the topology's ProxySettings.
- metrics: Metrics, a process's counters now (proxy -> gateway, forwarded; gateway -> orchestrator),
  checked by `polar_hpc.metrics.check` where the orchestrator takes it.

TCP links are CURVE-encrypted with the run's keys, one keypair per peer role (`polar_hpc.security`);
the orchestrator takes each message kind only from the roles allowed to send it.

Receiving: `unpack(frames, parts)` turns a received multipart into a message or raises BadMessage
(wrong frame count, undecodable); a receive loop logs it and goes on. The orchestrator's ROUTER,
which peers on other nodes reach, sets MAXMSGSIZE to MAX_MESSAGE_BYTES (`limit_size`): a larger
message drops its sender's connection before it is buffered. The proxy link (ipc, same user only)
has no such bound: a call record is as large as the call the proxy accepted.

Both ends of a link send Heartbeat every `heartbeat_s`; `Liveness` tells when a peer has gone silent.
A weight version's number (`version_number`: "v12" and "12" are 12) orders the versions messages carry.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Union

import msgspec
import zmq

from polar_hpc.errors import ConfigError, PolarError


class Message(msgspec.Struct, tag=True, forbid_unknown_fields=False):
    """Base of every wire message; the tag is the class name."""


# --- liveness -------------------------------------------------------------------------------------


class Heartbeat(Message):
    sender: str
    t: float


class Shutdown(Message):
    reason: str = ""


# --- gateway <-> orchestrator ---------------------------------------------------------------------


class Hello(Message):
    """A gateway introduces itself; `slots` is how many sessions it runs at once."""

    gateway_id: str
    host: str
    slots: int


class Credit(Message):
    """The gateway has room for `n` more sessions (a free INIT slot each)."""

    n: int


class SessionSpec(msgspec.Struct):
    """One rollout of one task: everything a gateway needs to run it."""

    session_id: str
    task: dict[str, Any]  # a validated config.Task, as plain data (the orchestrator sends it as `raw`)
    sample_index: int
    attempt: int
    deadline: float  # unix time; set once, at dispatch


class Assign(Message):
    """Sessions for the gateway to run, in dispatch order: one per unit of credit it had."""

    sessions: list[SessionSpec]


class SessionUpdate(Message):
    """A session entered a pipeline stage (INIT, READY, RUN, POSTRUN)."""

    session_id: str
    state: str
    t: float


class Result(Message):
    """A session ended; its trajectory (if any) is in shard `shard` of this gateway."""

    session_id: str
    status: str  # completed | error | timeout | cancelled
    reward: float | None
    n_calls: int
    n_traces: int
    n_tokens: int
    shard: str
    error: str | None = None


class Report(Message):
    """A gateway's news since its last Report, in order: the latest SessionUpdate of each session
    still running, then Results, then its Credits summed into one (`gateway.server.Outbox`)."""

    items: list[Union[Credit, SessionUpdate, Result]]


class Cancel(Message):
    session_id: str


# --- engine steps -> orchestrator, and engine membership -----------------------------------------


class EngineHello(Message):
    """An engine server answers /health at `url` (before /v1) with these weights."""

    engine_id: str
    url: str
    weight_version: str
    host: str


class EngineBye(Message):
    engine_id: str


class Engines(Message):
    """The engines that are up now (orchestrator -> gateway -> proxy); sent whenever it changes.
    `versions`: each engine's weight version as the orchestrator knows it (those given with
    --engine-url included), for engines whose answers carry none (vLLM)."""

    urls: list[str]
    versions: dict[str, str] = {}


# --- clients -> orchestrator ----------------------------------------------------------------------


class StatusRequest(Message):
    pass


class Member(msgspec.Struct):
    """An engine or gateway the orchestrator knows: `load` = sessions (gateway) in flight."""

    kind: str  # engine | gateway
    name: str
    host: str
    up: bool
    load: int = 0
    detail: str = ""  # engine: url and weight version


class StatusReply(Message):
    """Sessions by state, how many there are in all, and whether the run has finished."""

    states: dict[str, int]
    total: int
    done: bool
    gateways: int
    mean_reward: float | None
    tokens: int
    members: list[Member] = []
    sessions_per_s: float = 0.0  # sessions ended per second over the last minute
    eta_s: float | None = None
    versions_in_flight: dict[str, int] = {}  # running sessions by the newest weight version at their dispatch


# --- trainers -> orchestrator of a service run ---------------------------------------------------


class SubmitTasks(Message):
    """Add `tasks` (config.Task as plain data) as batch `batch_id`; ids the run has are not redone."""

    batch_id: str
    tasks: list[dict[str, Any]]
    max_staleness: int | None = None  # versions a trajectory may lag the newest policy; older: `stale`


class Submitted(Message):
    batch_id: str
    added: list[str]  # task ids queued now
    known: list[str]  # task ids the run already had: not added again


class Busy(Message):
    """The queue is full: nothing of the request was taken; send it again after `retry_after_s`."""

    queued: int
    max_queued: int
    retry_after_s: float


class Refused(Message):
    """The request cannot be served as it is (bad tasks, not a service run, draining)."""

    error: str


class BatchStatusRequest(Message):
    batch_id: str | None = None  # None: every batch


class BatchState(msgspec.Struct):
    states: dict[str, int]  # sessions by state
    total: int
    done: bool
    stale: int = 0  # ended sessions marked stale (see SubmitTasks.max_staleness)


class BatchStatus(Message):
    batches: dict[str, BatchState]


class CancelTasks(Message):
    """Cancel every unfinished session of a batch or of one task."""

    batch_id: str | None = None
    task_id: str | None = None


class Cancelled(Message):
    sessions: int  # sessions cancelled by this request


class UpdateWeights(Message):
    """Every engine loads the weights in `model_path` as `weight_version`; `mode` (wait | abort |
    continue, None: the topology's service.weight_update_mode) says what happens to calls in flight."""

    model_path: str
    weight_version: str
    mode: str | None = None


class WeightsUpdated(Message):
    weight_version: str
    mode: str  # the mode the update ran in
    engines: list[str]  # engine URLs now serving the version
    pause_ms: float  # longest time an engine held generation
    errors: list[str] = []  # engines that failed, with why


class Drain(Message):
    """Accept no more tasks; the run ends once every session has ended."""


# --- a proxy's start (gateway -> `polar-hpc proxy`, one JSON argument) ---------------------------

MAX_COUNT = 1 << 20  # a count of the topology (pool slots, pids, nodes, cpus, restarts, queued sessions)
MAX_SECONDS = 30 * 86400.0  # a period or timeout of the topology
ToolParserName = Literal["auto", "hermes", "qwen3_coder"]  # the tool-call formats proxy.tool_parsers reads


class ProxySettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The topology's `proxy:` section, defined here once: `config.Topology` validates the user's
    YAML against these types, defaults and bounds (FILE:LINE errors), and the gateway hands the
    validated value to its proxy inside a ProxyLaunch."""

    mode: Literal["tito", "passthrough"] = "tito"  # tito: the proxy renders; passthrough: the engine
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0  # harnesses' TCP port; 0 picks a free one
    tokenizer: str | None = None  # model folder (tito; passthrough: its chat template) (default: the engine's)
    tool_parser: ToolParserName = "auto"
    strict_model: bool = False  # refuse (404) requests naming another model (default: serve ours)
    max_body_mb: Annotated[float, msgspec.Meta(gt=0, le=1 << 20)] = 32.0  # larger request bodies get 413
    # a call waits this long for an engine while none is up
    engine_wait_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)] = 30.0
    # requests a task's engine may carry over the least loaded and still get the task's next sample
    affinity_slack: Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)] = 16
    # each engine's /metrics read this often for its load (0: never)
    engine_poll_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)] = 1.0

    @property
    def max_body(self) -> int:
        """Bytes of the largest request body taken."""
        return int(self.max_body_mb * (1 << 20))


class ProxyLaunch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """All a proxy process is started with (`polar-hpc proxy LAUNCH`, LAUNCH this as JSON): the
    topology's settings for it (its `proxy:` section, and the engine's and gateway's values it
    needs, with no defaults of their own here) and what its gateway gives it."""

    gateway: str  # zmq endpoint of the gateway's ROUTER, e.g. ipc:///tmp/gw.ipc
    engine_urls: list[str]  # base URLs of the engines, before /v1
    model: str  # engine.model: the served model name
    engine_kind: str  # engine.kind: which engines.kinds client speaks to the engines
    heartbeat_s: float  # gateway.heartbeat_s
    peer_timeout_s: float  # gateway.peer_timeout_s: exit when the gateway is silent this long
    settings: ProxySettings = ProxySettings()
    proxy_id: str = "proxy"
    host: str = "127.0.0.1"  # address harnesses connect to
    relay_socket: str | None = None  # where sandboxes without network hand over their listeners (proxy/relay.py)
    metrics_s: float = 0.0  # metrics.interval_s where metrics.enabled: its snapshot interval (0: it counts nothing)

    def argument(self) -> str:
        """This launch as the proxy's command-line argument."""
        return msgspec.json.encode(self).decode()


def proxy_launch(text: str) -> ProxyLaunch:
    """The ProxyLaunch in `text` (JSON), or ConfigError naming the field that is wrong."""
    try:
        return msgspec.json.decode(text, type=ProxyLaunch)
    except msgspec.DecodeError as e:  # ValidationError too: "Expected ... - at `$.settings.mode`"
        raise ConfigError(f"proxy launch: {e}") from None


# --- proxy <-> gateway ----------------------------------------------------------------------------


class ProxyHello(Message):
    """The proxy is serving harnesses at `url` (an http URL ending before /v1)."""

    proxy_id: str
    url: str


class OpenSession(Message):
    """Calls bearing `token` as their API key now belong to `session_id`, a sample of task `task_id`
    (the proxy routes the samples of a task to the engine that caches their prompt's prefix)."""

    session_id: str
    token: str
    task_id: str = ""


class SessionOpened(Message):
    """The proxy now accepts the session's token (the gateway starts the harness after this)."""

    session_id: str


class CloseSession(Message):
    """Stop accepting calls for this session; answer SessionClosed once its records are sent."""

    session_id: str


class SessionClosed(Message):
    """Every CallRecord of the session was sent before this message, on the same link."""

    session_id: str
    n_calls: int


class CallRecord(Message):
    """One model call as the harness made it and as the engine answered it, token-exact."""

    session_id: str
    call_index: int
    api: str  # openai_chat | openai_responses | anthropic_messages
    request: dict[str, Any]
    response: dict[str, Any]
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    weight_version: str
    engine_url: str
    stream: bool
    t_start: float
    t_end: float
    meta: dict[str, Any] = {}  # capture mode, engine rid, chain, retries; chat view of other APIs
    # per output id, the weight version that sampled it, when they differ (the call went on across
    # an update in `continue` mode); empty: every one is `weight_version`
    token_versions: list[str] = []


# --- metrics (polar_hpc.metrics) ---------------------------------------------------------------


class MetricSample(msgspec.Struct, array_like=True):
    name: str  # a Prometheus sample name: a family of polar_hpc.metrics.CATALOG and its suffix
    labels: dict[str, str]
    value: float


class Metrics(Message):
    """A snapshot of one process's counters (`role`: proxy | gateway; `process`: its id)."""

    role: str
    process: str
    t: float
    samples: list[MetricSample]


AnyMessage = Union[
    Heartbeat,
    Shutdown,
    Hello,
    Credit,
    Assign,
    SessionUpdate,
    Result,
    Report,
    Cancel,
    EngineHello,
    EngineBye,
    Engines,
    StatusRequest,
    StatusReply,
    SubmitTasks,
    Submitted,
    Busy,
    Refused,
    BatchStatusRequest,
    BatchStatus,
    CancelTasks,
    Cancelled,
    UpdateWeights,
    WeightsUpdated,
    Drain,
    ProxyHello,
    OpenSession,
    SessionOpened,
    CloseSession,
    SessionClosed,
    CallRecord,
    Metrics,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AnyMessage)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def raw(data: Any) -> Any:
    """Plain data encoded once, to go as it is into many messages (a task into each of its sessions'
    SessionSpec): the receiver decodes it as the data itself, so it is typed as that data (Any)."""
    return msgspec.Raw(_encoder.encode(data))


def decode(data: bytes) -> AnyMessage:
    """Decode one message; raises msgspec.DecodeError / ValidationError on garbage."""
    return _decoder.decode(data)


MAX_MESSAGE_BYTES = 64 * 2**20  # to the orchestrator: a batch of thousands of tasks fits with room to spare


class BadMessage(PolarError, ValueError):
    """A received multipart that is not one wire message: the reason is the text."""


def unpack(frames: Sequence[bytes], parts: int) -> AnyMessage:
    """The message in a received multipart of exactly `parts` frames (the payload last)."""
    if len(frames) != parts:
        raise BadMessage(f"{len(frames)} frames where {parts} belong")
    payload = frames[-1]
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as e:  # ValidationError included
        raise BadMessage(f"undecodable ({len(payload)} bytes): {e}") from None


def limit_size(sock: zmq.Socket) -> None:
    """Refuse (disconnect) any peer of `sock` that sends a message over MAX_MESSAGE_BYTES."""
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)


class Liveness:
    """Tracks when each peer was last heard from; a peer silent for `timeout_s` is lost."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._last: dict[Any, float] = {}

    def heard(self, peer: Any) -> None:
        self._last[peer] = time.monotonic()

    def forget(self, peer: Any) -> None:
        self._last.pop(peer, None)

    def lost(self) -> list[Any]:
        """Peers silent for longer than the timeout (each reported until forgotten)."""
        now = time.monotonic()
        return [p for p, t in self._last.items() if now - t > self.timeout_s]


_TRAILING_INT = re.compile(r"(\d+)$")


def version_number(version: str) -> int | None:
    """A weight version's trailing integer ("v12" and "12" are 12); None when it has none."""
    m = _TRAILING_INT.search(version)
    return int(m[1]) if m else None
