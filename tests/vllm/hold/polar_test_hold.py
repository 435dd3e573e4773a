"""A test-only vLLM plugin (never product code) that makes "a call is decoding when the pause
takes" certain rather than likely (tests/vllm/test_weights.py, the `continue` step).

vLLM loads it as a general plugin in its engine core (`vllm.general_plugins`, listed by the
`polar_test_hold-0.dist-info` beside this file once this folder is on the server's PYTHONPATH)
and it does something only where `POLAR_TEST_HOLD=MARK:N` is set: after the engine step in which
a request whose id holds MARK has N output tokens, the engine core's busy loop waits until the
next `pause_scheduler` call is in its input queue, once per request (not at all for one a pause
found earlier), and at most `GIVE_UP_S` (a test that failed before its update queues no pause:
the loop goes on, saying it gave up, and that test's own check of the hold fails rather than its
timeout). vLLM 0.32 (v1/engine/core.py `EngineCoreProc.run_busy_loop`, CPU: no async scheduling)
handles every queued message before its next step, so a pause takes with at most N tokens of such
a request sampled (exactly N when it came later), and the request unfinished.
"""

from __future__ import annotations

import os
import time

MARK_ENV = "POLAR_TEST_HOLD"
GIVE_UP_S = 60.0


def register() -> None:
    if not os.environ.get(MARK_ENV):
        return
    mark, n = os.environ[MARK_ENV].rsplit(":", 1)
    from vllm.v1.engine.core import EngineCoreProc, EngineCoreRequestType

    step, pause, held = EngineCoreProc._process_engine_step, EngineCoreProc.pause_scheduler, set()

    def _pause_queued(core: EngineCoreProc) -> bool:
        with core.input_queue.mutex:
            return any(kind == EngineCoreRequestType.UTILITY and request[2] == "pause_scheduler"
                       for kind, request in core.input_queue.queue)

    def held_step(core: EngineCoreProc) -> bool:
        executed = step(core)
        due = [rid for rid, r in core.scheduler.requests.items()
               if mark in rid and rid not in held and r.num_output_tokens >= int(n)]
        if due:
            held.update(due)
            deadline = time.monotonic() + GIVE_UP_S
            while not (queued := _pause_queued(core)) and time.monotonic() < deadline:
                time.sleep(0.005)
            print(f"polar_test_hold: {due} held at {n} tokens " + ("until a pause was queued" if queued else
                  f"for {GIVE_UP_S:.0f} s: no pause was queued, gave up"), flush=True)
        return executed

    def seen_pause(core: EngineCoreProc, *args, **kwargs):
        held.update(rid for rid in core.scheduler.requests if mark in rid)  # a pause found them: no hold
        return pause(core, *args, **kwargs)

    EngineCoreProc._process_engine_step = held_step
    EngineCoreProc.pause_scheduler = seen_pause
    print(f"polar_test_hold: requests {mark!r} held at {n} tokens until a pause is queued", flush=True)
