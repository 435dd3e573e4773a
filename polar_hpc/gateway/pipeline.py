"""A gateway's session pipeline: bounded INIT -> READY -> RUN -> POSTRUN stages.

Each session is one coroutine that moves through the stages by taking the next stage's slot before
giving up its current one, so a full stage holds the sessions behind it (backpressure) and a
session waiting in READY already has a started, prepared sandbox. Leaving INIT returns one credit
to the orchestrator. The session's deadline (set at dispatch) bounds INIT (the wait for its slot
included), the READY wait and RUN; POSTRUN always runs, so the calls captured so far become a
trajectory whatever happened, and its evaluation ends by the later of the deadline and
EVALUATION_SLACK_S (+ a command evaluator's timeout_s) after it starts, else the session is
`timeout`. A sandbox that cannot start or launch the harness (or any bug before POSTRUN) ends the
session `error` at once, with the reason. POSTRUN kills the sandbox's processes (and checks that
none survives) before the trajectory is written; its files and cgroup are removed after the
result is sent, still inside the POSTRUN slot.
A cancel (the orchestrator's `Cancel`: a decided group's tail) ends a session whose harness is still
running (written `cancelled`); one whose harness has ended (waiting for a POSTRUN slot or in POSTRUN)
is left to write its trajectory and result as it is. A stop (`drain(within_s)`) cancels the
sessions whose harness still runs (written `cancelled`), lets the others finish, and cuts whatever
is still running after `within_s` (unwritten).
A harness that dies of a stop signal (STOP_SIGNALS: the gateway sends none, it kills with SIGKILL)
may have been stopped from outside: a Slurm stop signals every process of the step, and its gateway
may see the harness dead before it sees its own SIGTERM. If the gateway's own stop begins within
`stop_grace_s` of that death, the session ends `cancelled` (written so; the orchestrator runs it
again), never `error`; otherwise it is the harness's own `error` (a harness that signals itself or
exits 143 cannot have itself run again forever). So does any session that would end `error` once the
stop has begun (a sandbox start, an evaluation or a harness the stop's signal reached), its error
kept with "(while the gateway stopped)": one more run of an honest error costs less than a sample
lost to a stop.
A command evaluator that asks for a `fresh` sandbox gets one started as the harness starts, so it
is ready (from the pool's point of view, pre-warmed) when POSTRUN evaluates.

A task with a tests evaluator (suites: hidden tests) gets Harbor's container paths: its sandboxes
mount session folders at /tests, /solution, /logs/agent and /logs/verifier (MOUNTS), empty while
the harness runs (the oracle finds its solution at /solution); the harness's sandbox hides the
task's tests and solution folders; its workspace is snapshotted as the base (trajectory.workspace)
once started, and once the harness has run, its workspace diff is captured (in its own sandbox)
into the trajectory's metadata (`workspace_diff`: bytes, encoding utf-8 or base64, data; or
`workspace_diff_error`; in an image sandbox with the tests in the held command, whose layer one
command holds at a time, it is captured after the tests: `workspace_diff_after_tests`). The tests
then run in the harness's sandbox as it left it (`sandbox: session`, the default: in the harness's
own command, held after it with its processes, gateway/held.py), or with `sandbox: fresh` in a fresh
sandbox started (and snapshotted) as the harness starts, where the diff is applied; the tests arrive
only then. A reward file missing or malformed ends the session `error` with the reason; every key of
reward.json goes to the
metadata's `rewards`. `evaluation_timings` holds capture_s, apply_s, tests_s (+ fresh_start_s).
A task's `sandbox.storage_mb` lowers the sandbox's disk limit, `memory_mb` bounds its memory.
A task whose `sandbox.cwd` is "image" (Harbor's) has its harness and its tests start in the
image's WorkingDir (`Sandbox.workdir`) as its container's would, where the sandbox runs an image;
the harness runs as `sandbox.user` and tests in a fresh sandbox as the evaluator's `user` (in the
held command they are the harness's: one user is mapped; suites refuse a task whose two differ).
The gateway's own steps (git, config files) work in the workspace.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import logging
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from polar_hpc import wire
from polar_hpc.config import CommandEvaluator, PoolConfig, SwebenchEvaluator, Task, TestsEvaluator
from polar_hpc.gateway.held import GATE, Held
from polar_hpc.harness import presets
from polar_hpc.sandbox import Factory, Sandbox, SandboxError, checkouts, files
from polar_hpc.shards.writer import ShardWriter
from polar_hpc.trajectory import workspace as diffs
from polar_hpc.trajectory.builders import build
from polar_hpc.trajectory.evaluators import evaluate
from polar_hpc.trajectory.model import Trajectory

STDERR_TAIL = 4000
EVALUATION_SLACK_S = 5.0  # an evaluation may end this long (+ a command's timeout_s) after the harness
ON_DIFF = (TestsEvaluator, SwebenchEvaluator)  # judged on the harness's workspace diff (a snapshot at start)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)  # a job's stop
STOP_GRACE_S = 10.0  # how long after a harness died of a stop signal the gateway's own stop may begin
MOUNTS = {"/tests": "tests", "/solution": "solution", "/logs/agent": "logs/agent", "/logs/verifier": "logs/verifier"}
log = logging.getLogger("polar_hpc.gateway")


class ProxyLink(Protocol):
    """What the pipeline needs of its proxy: open a session, close it and collect its records.

    The proxy link (one per gateway, over ipc) has two ends: `ProxyLinkRouter` (gateway.server, this
    protocol over the gateway's ROUTER) and `ProxyLinkDealer` (proxy.gateway_link, the proxy's)."""

    url: str
    socket: Path | None = None  # the proxy's HTTP on a Unix socket, for sandboxes without network

    async def open(self, session_id: str, token: str, task_id: str) -> None: ...

    async def close(self, session_id: str) -> list[wire.CallRecord]: ...


@dataclass
class _Outcome:
    status: str = "completed"
    error: str | None = None
    metadata: dict = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)  # stage -> unix time it was entered
    fresh: asyncio.Task | None = None  # the evaluator's own sandbox, starting while the harness runs
    held: Held | None = None  # tests in the session's sandbox: its command, held after the harness
    diff: bytes | str | None = None  # tests evaluator: the workspace diff, or why there is none
    evaluation_timings: dict[str, float] = field(default_factory=dict)

    def timings(self, t_end: float) -> dict[str, float]:
        """Seconds spent in each stage the session went through (harness = RUN)."""
        order = [(k, t) for k, t in self.marks.items()] + [("END", t_end)]
        return {f"{k.lower()}_s": round(t2 - t1, 6) for (k, t1), (_, t2) in zip(order, order[1:])}


class Pipeline:
    def __init__(
        self,
        pools: PoolConfig,
        make_sandbox: Factory,
        tmp_root: Path,
        proxy: ProxyLink,
        writer: ShardWriter,
        send: Callable[[wire.Message], None],
    ) -> None:
        self.pools = pools
        self.make_sandbox = make_sandbox
        self.tmp_root = tmp_root
        self.proxy = proxy
        self.writer = writer
        self.send = send
        self._stage = {
            "INIT": asyncio.Semaphore(pools.init),
            "READY": asyncio.Semaphore(pools.ready),
            "RUN": asyncio.Semaphore(pools.run),
            "POSTRUN": asyncio.Semaphore(pools.postrun),
        }
        self.sessions: dict[str, asyncio.Task] = {}
        self._finishing: set[str] = set()  # harness ended (POSTRUN, or waiting for it): a cancel or stop lets them end
        self._draining = False
        self._stop_began = asyncio.Event()  # set by drain(): a harness dead of a stop signal was the stop's
        self.stop_grace_s = STOP_GRACE_S

    def assign(self, spec: wire.SessionSpec) -> None:
        if self._draining:  # sent for a credit given before the stop: requeued with this gateway's others
            log.warning("session %s assigned while the gateway stops: not started", spec.session_id)
            return
        task = asyncio.create_task(self._session(spec), name=spec.session_id)
        self.sessions[spec.session_id] = task
        task.add_done_callback(lambda _: self.sessions.pop(spec.session_id, None))

    def cancel(self, session_id: str) -> None:
        """Cancel a session whose harness still runs; after the loop's turn, so one assigned in the
        same turn has started (inside its handler: it still writes its result) before it is
        cancelled. One past its harness is left to write its result: cancelling it there would end
        it with none."""
        asyncio.get_running_loop().call_soon(self._cancel, session_id)

    def _cancel(self, session_id: str) -> None:
        if session_id in self.sessions and session_id not in self._finishing:
            self.sessions[session_id].cancel()

    async def drain(self, within_s: float) -> None:
        """Cancel every session not yet in POSTRUN and wait, at most `within_s`, until each has
        written its trajectory (one in POSTRUN finishes its evaluation if it can in that time);
        what is still running then is cancelled unwritten. From now on no credit is given back and
        no session is taken."""
        self._draining = True
        self._stop_began.set()
        for sid, t in list(self.sessions.items()):
            if sid not in self._finishing:
                t.cancel()
        if not self.sessions:
            return
        _, late = await asyncio.wait(list(self.sessions.values()), timeout=within_s)
        for t in late:
            log.warning("session %s not written within the %.1fs stop budget", t.get_name(), within_s)
            t.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _session(self, spec: wire.SessionSpec) -> None:
        task = Task.model_validate(spec.task)
        sid = spec.session_id
        sandbox = self._new_sandbox(task)
        t_start = time.time()
        outcome = _Outcome()
        holding: list[str] = []
        try:
            await self._before_postrun(spec, task, sandbox, holding, outcome)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            assert current is not None  # a session runs as a task
            current.uncancel()  # cancelled sessions still write what they captured
            outcome.status = "cancelled"
        finally:
            for stage in holding:
                self._release(stage)
        self._finishing.add(sid)
        try:
            async with self._stage["POSTRUN"]:
                self._update(sid, "POSTRUN", outcome)
                await self._postrun(spec, task, sandbox, outcome, t_start)
        finally:
            self._finishing.discard(sid)

    async def _before_postrun(self, spec, task, sandbox, holding, outcome) -> None:
        sid = spec.session_id
        token = secrets.token_urlsafe(24)
        try:
            async with asyncio.timeout(spec.deadline - time.time()):
                await self._stage["INIT"].acquire()
                holding.append("INIT")
                self._update(sid, "INIT", outcome)
                await sandbox.start()
                if isinstance(task.evaluator, ON_DIFF):
                    await diffs.snapshot(sandbox)
                solution = task.solution.dir if task.solution and task.harness.kind == "oracle" else None
                if solution and "/solution" in sandbox.mounts:
                    await sandbox.put("/solution", Path(solution))
                await self.proxy.open(sid, token, task.id)
                await self._move(holding, "READY")
                self._update(sid, "READY", outcome)
                await self._move(holding, "RUN")
            self._update(sid, "RUN", outcome)
            if _wants_fresh(task):
                outcome.fresh = asyncio.create_task(self._start_fresh(task, outcome))
            proxy_url = sandbox.proxy_url(self.proxy.url)
            solution_at = sandbox.seen_at("/solution") if "/solution" in sandbox.mounts else None
            command, env = presets.launch(task, proxy_url, token, sid, sandbox.workspace, solution_at)
            at = {"cwd": _cwd(task, sandbox), "user": task.sandbox.user, "token": token}
            if GATE in sandbox.mounts:  # the tests will run in this command's sandbox, left as it is
                outcome.held = Held(sandbox)
                hold = diffs.GIT_TIMEOUT_S + task.evaluator.timeout_s + EVALUATION_SLACK_S
                result = await outcome.held.start(command, env, spec.deadline - time.time(), hold, **at)
            else:
                result = await sandbox.exec(command, env, spec.deadline - time.time(), **at)
            outcome.marks["WAIT"] = time.time()  # harness ended; POSTRUN slot not yet taken
            self._finishing.add(sid)  # a cancel or stop lets it end: judged, evaluated and written
        except TimeoutError:
            outcome.status = "timeout"
            return
        except (SandboxError, files.FileError) as e:  # e.g. it could not launch; a linked instruction file
            outcome.status, outcome.error = "error", str(e)
            return
        except Exception as e:  # a bug must end the session as an error, never leave it hanging
            log.exception("session %s failed", sid)
            outcome.status, outcome.error = "error", f"gateway error: {e!r}"
            return
        if result.timed_out:
            outcome.status = "timeout"
        elif result.limit:
            outcome.status, outcome.error = "error", f"harness killed: {result.limit}"
        elif (stop := _stopped_by(result.returncode)) and await self._stop_follows():
            outcome.status, outcome.error = "cancelled", f"harness stopped by {stop} from outside the gateway"
        elif stop:
            outcome.status = "error"
            outcome.error = (f"harness exited with code {result.returncode} ({stop}; no stop of the gateway "
                             f"followed within {self.stop_grace_s:g}s)")
        elif result.returncode != 0:
            outcome.status = "error"
            outcome.error = f"harness exited with code {result.returncode}"
        outcome.metadata["exit_code"] = result.returncode
        outcome.metadata["stderr_tail"] = result.stderr[-STDERR_TAIL:].decode(errors="replace")

    def _new_sandbox(self, task: Task) -> Sandbox:
        """The task's sandbox, which sees neither its hidden parts nor the checkouts holding them."""
        box = task.sandbox
        parts = (getattr(task.evaluator, "dir", None), task.solution and task.solution.dir)
        hidden = tuple(Path(folder) for part in parts if part for folder in checkouts.around(part))
        sandbox = self.make_sandbox(
            self.tmp_root / secrets.token_hex(8), box.files, box.prepare, box.network,
            proxy_socket=self.proxy.socket, image=box.image, gpus=box.gpus, hidden=hidden,
            mounts=_mounts(task),
        )
        if box.storage_mb is not None:
            disk = min(sandbox.limits.max_disk_bytes, box.storage_mb << 20)
            sandbox.limits = dataclasses.replace(sandbox.limits, max_disk_bytes=disk)
        if box.cpus is not None:  # the CPU quota of the sandbox's cgroup, within the topology's max_cpus
            sandbox.limits = dataclasses.replace(sandbox.limits, max_cpus=min(sandbox.limits.max_cpus, box.cpus))
        if box.memory_mb is not None:  # its memory cgroup's limit (else RLIMIT_AS): sandbox/cgroups.py
            sandbox.limits = dataclasses.replace(sandbox.limits, max_memory_bytes=box.memory_mb << 20)
        return sandbox

    async def _start_fresh(self, task: Task, outcome: _Outcome) -> Sandbox:
        t0 = time.monotonic()
        sandbox = self._new_sandbox(task)
        try:
            await sandbox.start()
            if isinstance(task.evaluator, ON_DIFF):
                await diffs.snapshot(sandbox)
        except BaseException:
            await sandbox.stop()
            raise
        outcome.evaluation_timings["fresh_start_s"] = round(time.monotonic() - t0, 6)
        return sandbox

    async def _capture(self, sandbox: Sandbox, outcome: _Outcome, metadata: dict) -> None:
        """The harness's workspace diff, from its own sandbox, into the metadata and `outcome.diff`."""
        t0 = time.monotonic()
        try:
            diff = outcome.diff = await diffs.capture(sandbox)
        except (diffs.DiffError, SandboxError) as e:
            outcome.diff = metadata["workspace_diff_error"] = str(e)
            return
        finally:
            outcome.evaluation_timings["capture_s"] = round(time.monotonic() - t0, 6)
        try:
            data, encoding = diff.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            data, encoding = base64.b64encode(diff).decode("ascii"), "base64"
        metadata["workspace_diff"] = {"bytes": len(diff), "encoding": encoding, "data": data}

    async def _evaluate(self, spec, task: Task, session_box: Sandbox, records, outcome: _Outcome, metadata: dict):
        """The reward, by the later of the session's deadline and the evaluator's own allowance."""
        evaluator = task.evaluator
        command = evaluator.timeout_s if isinstance(evaluator, (CommandEvaluator, *ON_DIFF)) else 0.0
        allowance = EVALUATION_SLACK_S + command
        try:
            async with asyncio.timeout(max(spec.deadline - time.time(), allowance)):
                return await self._evaluation(task, session_box, records, outcome, metadata)
        except TimeoutError:
            outcome.status = "timeout"
            outcome.error = metadata["error"] = metadata["evaluation"] = (
                f"evaluation not finished by the session's deadline (nor {allowance:g}s after the harness)")
        except Exception as e:
            log.exception("evaluation of session %s failed", spec.session_id)
            metadata["evaluation"] = f"evaluation failed: {e!r}"
        return None

    async def _evaluation(self, task: Task, session_box: Sandbox, records, outcome: _Outcome, metadata: dict):
        """The reward, from the session's sandbox or the fresh one (holding the harness's workspace at
        submission/, or for tests its diff applied)."""
        box = session_box
        if outcome.fresh is not None:
            try:
                box = await outcome.fresh
                if not isinstance(task.evaluator, ON_DIFF):
                    await box.upload(session_box.workspace, "submission")
            except SandboxError as e:
                metadata["evaluation"] = f"fresh evaluator sandbox failed: {e}"
                return None
        if outcome.held and box is session_box:
            run = outcome.held.run
        else:  # the tests' own command in a fresh sandbox: where and as whom its task's tests start
            user = task.evaluator.user if isinstance(task.evaluator, TestsEvaluator) else None
            run = functools.partial(box.exec, cwd=_cwd(task, box), user=user)
        evaluation = await evaluate(task.evaluator, box, records, outcome.diff, run)
        metadata["evaluation"] = evaluation.detail
        metadata |= evaluation.metadata
        outcome.evaluation_timings |= evaluation.timings
        if evaluation.rewards:
            metadata["rewards"] = evaluation.rewards
        if evaluation.error:
            outcome.status, outcome.error = "error", evaluation.error
            metadata["error"] = evaluation.error
        return evaluation.reward

    async def _move(self, holding: list[str], stage: str) -> None:
        """Take a slot in `stage`, then give up the current one (READY of size 0 is skipped)."""
        if self.pools.ready == 0 and stage == "READY":
            return
        await self._stage[stage].acquire()
        self._release(holding.pop())
        holding.append(stage)

    def _release(self, stage: str) -> None:
        self._stage[stage].release()
        if stage == "INIT" and not self._draining:
            self.send(wire.Credit(n=1))

    async def _postrun(self, spec, task: Task, sandbox: Sandbox, outcome: _Outcome, t_start: float) -> None:
        records = await self.proxy.close(spec.session_id)
        traces, metadata = build(records, task.builder)
        metadata |= outcome.metadata
        if outcome.error:
            metadata["error"] = outcome.error
        reward = None
        diff = isinstance(task.evaluator, ON_DIFF) and "RUN" in outcome.marks and outcome.status != "cancelled"
        after = diff and outcome.held is not None and not sandbox.side_by_side  # the held command holds its layer
        if diff and not after:
            await self._capture(sandbox, outcome, metadata)
        if outcome.status == "completed" and task.evaluator is not None:
            reward = await self._evaluate(spec, task, sandbox, records, outcome, metadata)
        if outcome.held is not None:
            await outcome.held.close()
        if after:  # the tests ran in the held command without it; what they wrote in the workspace is in it
            await self._capture(sandbox, outcome, metadata)
            metadata["workspace_diff_after_tests"] = True
        if outcome.evaluation_timings:
            metadata["evaluation_timings"] = outcome.evaluation_timings
        if outcome.status == "error" and self._draining:  # perhaps the stop's doing: it runs again
            outcome.status = "cancelled"
            outcome.error = metadata["error"] = f"{outcome.error} (while the gateway stopped)"
        clean = [await sandbox.cancel(), await _stop_fresh(outcome.fresh)]
        if not all(clean):
            metadata["untrainable"] = "sandbox teardown could not verify that no process survived"
        t_end = time.time()
        metadata["timings"] = outcome.timings(t_end)
        trajectory = Trajectory(
            session_id=spec.session_id,
            task_id=task.id,
            sample_index=spec.sample_index,
            attempt=spec.attempt,
            status=outcome.status,
            reward=reward,
            traces=traces,
            metadata=metadata,
            t_start=t_start,
            t_end=t_end,
        )
        shard = self.writer.append(trajectory)
        self.send(
            wire.Result(
                session_id=spec.session_id,
                status=outcome.status,
                reward=reward,
                n_calls=len(records),
                n_traces=len(traces),
                n_tokens=trajectory.n_tokens,
                shard=shard,
                error=outcome.error,
            )
        )
        await sandbox.stop()  # its files and cgroup, after the result: off the session's path

    async def _stop_follows(self) -> bool:
        """Whether the gateway's own stop begins within `stop_grace_s` (a harness died of a stop signal)."""
        try:
            await asyncio.wait_for(self._stop_began.wait(), self.stop_grace_s)
        except TimeoutError:
            return False
        return True

    def _update(self, session_id: str, state: str, outcome: _Outcome) -> None:
        t = outcome.marks[state] = time.time()
        self.send(wire.SessionUpdate(session_id=session_id, state=state, t=t))


def _stopped_by(returncode: int) -> str | None:
    """The stop signal a harness died of (-N from the process itself, 128+N as a shell or bwrap
    reports it), or None. The gateway kills sandboxes only with SIGKILL, so such a signal came from
    outside: a Slurm stop (scancel, preemption, requeue) signals every process of the step, the
    harness and its gateway alike, in an order no one controls."""
    return next((s.name for s in STOP_SIGNALS if returncode in (-s, 128 + s)), None)


def _mounts(task: Task) -> dict[str, str] | None:
    """Harbor's paths for a tests task; with tests in the session's sandbox, the gate that holds it."""
    spec = task.evaluator
    if not isinstance(spec, TestsEvaluator):
        return None
    return MOUNTS | ({GATE: "gate"} if spec.sandbox == "session" else {})


def _cwd(task: Task, sandbox: Sandbox) -> str | None:
    """Where the task's harness and tests start in `sandbox`: its image's WorkingDir for a task that
    asks for it, else (None) the workspace."""
    return sandbox.workdir if task.sandbox.cwd == "image" else None


def _wants_fresh(task: Task) -> bool:
    spec = task.evaluator
    return isinstance(spec, SwebenchEvaluator) or (
        isinstance(spec, (TestsEvaluator, CommandEvaluator)) and spec.sandbox == "fresh")


async def _stop_fresh(fresh: asyncio.Task | None) -> bool:
    """Stop the evaluator's fresh sandbox (cancelling its start if still under way); True if clean."""
    if fresh is None:
        return True
    fresh.cancel()  # no effect once started
    started = (await asyncio.gather(fresh, return_exceptions=True))[0]
    return await started.stop() if isinstance(started, Sandbox) else True  # a failed start tore itself down
