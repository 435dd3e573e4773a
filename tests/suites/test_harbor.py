"""Harbor-format tasks written in Harbor's published conventions (tests/suites/harbor_tasks: absolute
/tests, /solution, /logs/agent and /logs/verifier paths, reward.json with several keys, reward.txt,
a test.sh that writes no reward, env tables, legacy memory/storage strings, a service the agent
leaves running, a multi-step task),
through the real `polar-hpc tasks check` and `polar-hpc run` with bubblewrap on the host's tree
(a suite file's `dockerfile: host`: their Dockerfiles are not built):
the oracle scores 1.0 and the no-op 0.0 on each; no reward file is an `error`; the multi-step task
is refused with a warning without blocking the others; the tests see the agent's sandbox as it
left it, unless `verifier_sandbox: fresh`; a harness planting rewards or reading /tests gains nothing."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
from conftest import polar
from e2e.helpers import trajectories
from suites.helpers import suite_file

from polar_hpc import suites
from sandbox.bwrap_required import needs_bwrap

HERE = Path(__file__).resolve().parent / "harbor_tasks"
RUNS = ("installed-tool", "multi-key", "no-reward", "service", "text-reward")  # multi-step is left out
NO_REWARD = "no reward file: the tests wrote neither /logs/verifier/reward.json nor /logs/verifier/reward.txt"


def run(tmp_path: Path, name: str, harness: str = "{kind: oracle}", extra: str = "") -> dict:
    (tmp_path / "topology.yaml").write_text("sandbox: {backend: bwrap}\n")
    ref = tmp_path / f"{name}.yaml"
    ref.write_text(f"suite: {HERE}\nharness: {harness}\ndockerfile: host\n{extra}")
    result = polar("run", ref, "-c", tmp_path / "topology.yaml", "--run-dir", tmp_path / name, timeout=280)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "multi-step/task.toml:9: steps: a multi-step task" in result.stderr  # said by `run` too
    found = {t.task_id: t for t in trajectories(tmp_path / name)}
    assert sorted(found) == list(RUNS)
    return found


def test_tasks_check_names_what_is_ignored_and_loads_the_rest(tmp_path: Path) -> None:
    (tmp_path / "host.yaml").write_text(f"suite: {HERE}\ndockerfile: host\n")  # not built: run on the host's tree
    result = polar("tasks", "check", tmp_path / "host.yaml")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # the table may wrap
    assert f"warning: {HERE}/multi-step/task.toml:9: steps: a multi-step task ([[steps]]" in result.stdout
    assert f"warning: {HERE}/text-reward/task.toml:5: agent.user: not honoured with `dockerfile: host`" in result.stdout
    assert f"warning: {HERE}/multi-key/task.toml:16: environment.build_timeout_sec: not used" in result.stdout
    assert "5 task(s), 5 session(s)" in out and "1 cpu, 2048 MB mem, 10240 MB disk" in out  # "2G", "10G"
    tasks = {t.id: t for t in suites.load(tmp_path / "host.yaml")}
    text = tasks["text-reward"]
    assert text.evaluator.env == {"GREETING": "hi there", "EXPECTED": "42"}  # [environment.env] + [verifier.env]
    assert text.solution.env == {"GREETING": "hi there", "ANSWER": "42"} and text.harness.env == {"GREETING": "hi there"}
    assert text.sandbox.network == "proxy-only" and text.evaluator.sandbox == "session"
    single = polar("tasks", "check", HERE / "multi-step")  # alone, it is an error
    assert single.returncode == 2 and "Traceback" not in single.stderr
    assert f"{HERE}/multi-step/task.toml:9: steps: a multi-step task" in single.stderr


def test_bad_legacy_sizes_and_unset_variables_are_errors(tmp_path: Path) -> None:
    task = shutil.copytree(HERE / "text-reward", tmp_path / "bad")
    toml = task / "task.toml"
    text = toml.read_text()
    toml.write_text(text.replace("allow_internet = false", 'memory = "2GB"'))
    result = polar("tasks", "check", task)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{toml}:17: environment.memory: Value error, '2GB' is not a size such as '2G'" in result.stderr
    toml.write_text(text.replace("${POLAR_HARBOR_TEST_UNSET:-hi there}", "${POLAR_HARBOR_TEST_UNSET}"))
    result = polar("tasks", "check", task)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{toml}:20: environment.env.GREETING: ${{POLAR_HARBOR_TEST_UNSET}} is not set" in result.stderr


def test_agent_and_verifier_users_as_harbor_defines_them(tmp_path: Path) -> None:
    """`[agent]` / `[verifier] user`: a name or a uid (TOML integer), the harness's and the tests'
    user in the task's image; both start in the image's WorkingDir. A user of no such form is an
    error, and so are two different users where the tests run in the harness's own sandbox (one
    user is mapped there); a suite file's `verifier_sandbox: fresh` takes them."""
    task = shutil.copytree(HERE / "text-reward", tmp_path / "suite" / "users")
    toml = task / "task.toml"
    text = toml.read_text().replace("[environment]\n", '[environment]\ndocker_image = "debian:bookworm-slim"\n')
    toml.write_text(text.replace("timeout_sec = 120.0\n\n[verifier.env]", "timeout_sec = 120.0\nuser = 1000\n\n[verifier.env]"))
    result = polar("tasks", "check", task)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (f"{toml}:9: verifier.user: 1000 differs from agent.user (agent): the tests run in the harness's own "
            "sandbox") in result.stderr, result.stderr
    fresh = suite_file(tmp_path / "fresh.yaml", tmp_path / "suite", "{kind: oracle}")
    fresh.write_text(fresh.read_text() + "verifier_sandbox: fresh\n")
    [loaded] = suites.load(fresh, cached_images=False)
    assert (loaded.sandbox.cwd, loaded.sandbox.user, loaded.evaluator.user, loaded.evaluator.sandbox) == (
        "image", "agent", "1000", "fresh")
    for bad, why in (('"a b"', "String should match pattern"), ("-1", "-1 is not a uid"), ("true", "string")):
        toml.write_text(text.replace('user = "agent"', f"user = {bad}"))
        result = polar("tasks", "check", task)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert f"{toml}:5: agent.user: " in result.stderr and why in result.stderr, result.stderr


@needs_bwrap
@pytest.mark.timeout(900)
def test_oracle_one_noop_zero_no_reward_an_error(tmp_path: Path) -> None:
    oracle = run(tmp_path, "oracle")
    for name in ("installed-tool", "multi-key", "service", "text-reward"):
        assert (oracle[name].status, oracle[name].reward) == ("completed", 1.0), oracle[name].metadata
    keys = oracle["multi-key"].metadata["rewards"]
    assert keys == {"reward": 1.0, "greeting": 1.0, "agent_log": 1.0}  # every number of reward.json
    assert oracle["text-reward"].metadata["rewards"] == {"reward": 1.0}
    failed = oracle["no-reward"]
    assert (failed.status, failed.reward, failed.metadata["error"]) == ("error", None, NO_REWARD)

    noop = run(tmp_path, "noop", "{kind: noop}")
    for name in ("installed-tool", "multi-key", "service", "text-reward"):
        assert (noop[name].status, noop[name].reward) == ("completed", 0.0), noop[name].metadata
    assert noop["multi-key"].metadata["rewards"] == {"reward": 0.0, "greeting": 0.0, "agent_log": 0.0}
    assert (noop["no-reward"].status, noop["no-reward"].metadata["error"]) == ("error", NO_REWARD)


@needs_bwrap
@pytest.mark.timeout(900)
def test_fresh_mode_sees_only_the_diff_and_hostile_harnesses_gain_nothing(tmp_path: Path) -> None:
    fresh = run(tmp_path, "fresh", extra="verifier_sandbox: fresh\n")
    # what the agent installed outside its workspace diff, and its /logs/agent, are not in a fresh sandbox
    assert (fresh["installed-tool"].status, fresh["installed-tool"].reward) == ("completed", 0.0)
    assert (fresh["service"].status, fresh["service"].reward) == ("completed", 0.0)  # the server is not there
    assert fresh["multi-key"].metadata["rewards"] == {"reward": 1.0, "greeting": 1.0, "agent_log": 0.0}
    assert "fresh_start_s" in fresh["multi-key"].metadata["evaluation_timings"]

    plant = ("ls -A /tests /solution > saw.txt 2>&1; "
             "echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1}' > /logs/verifier/reward.json; "
             "mkdir -p /tests && printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; "
             "echo 'hi' > answer.txt")
    hostile = run(tmp_path, "hostile", json.dumps({"kind": "shell", "command": plant}))
    for name in ("installed-tool", "multi-key", "service", "text-reward"):
        t = hostile[name]
        assert (t.status, t.reward) == ("completed", 0.0), t.metadata
        diff = t.metadata["workspace_diff"]
        data = diff["data"].encode() if diff["encoding"] == "utf-8" else base64.b64decode(diff["data"])
        assert b"+++ b/saw.txt\n@@ -0,0 +1,3 @@\n+/solution:\n+\n+/tests:\n" in data, data  # both empty then
    assert hostile["no-reward"].status == "error"  # its planted reward files were removed before the tests
