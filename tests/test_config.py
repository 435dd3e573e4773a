"""Bad task files and topologies are refused before anything starts: exit 2, FILE:LINE: FIELD."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import polar

GOOD = {"id": "t", "instruction": "What is 1+1?", "harness": {"command": "true"}}


def _refused(result, *expected: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr
    return result.stderr


def test_yaml_missing_field_wrong_type_unknown_key(tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(
        "id: t\n"
        "instruction: hi\n"
        "num_samples: many\n"          # line 3: wrong type
        "harness:\n"                   # line 4: command missing
        "  kind: shell\n"
        "  comand: python agent.py\n"  # line 6: unknown key
    )
    run_dir = tmp_path / "run"
    result = polar("run", task, "--run-dir", run_dir)
    _refused(
        result,
        f"{task}:3: num_samples:",
        f"{task}:4: harness.command: missing required field",
        f"{task}:6: harness.comand: unknown key",
    )
    assert not run_dir.exists(), "nothing may be started or created on bad input"


def test_jsonl_names_the_bad_record_line(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    bad = dict(GOOD, id="b", evaluator={"kind": "regex"})
    tasks.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(bad) + "\n{not json\n")
    result = polar("run", tasks, "--run-dir", tmp_path / "run")
    _refused(result, f"{tasks}:3: evaluator.pattern: missing required field", f"{tasks}:4: not valid JSON")


def test_early_acceptance_fields_are_checked_with_their_line(tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(
        "- id: a\n  instruction: hi\n  harness: {command: 'true'}\n  num_samples: 3\n"
        "  accept: 4\n"                 # line 5: more than started
        "- id: b\n  instruction: hi\n  harness: {command: 'true'}\n  num_samples: 3\n  accept: 2\n"
        "  accept_fraction: 0.5\n"      # line 11: without its grace
        "- id: c\n  instruction: hi\n  harness: {command: 'true'}\n"
        "  accept_fraction: 0.5\n"      # line 15: a fraction of nothing
        "  accept_grace_s: 10\n"
        "- id: d\n  instruction: hi\n  harness: {command: 'true'}\n  accept: 1\n"
        "  accept_fraction: 1.5\n"      # line 21: above 1
        "  accept_grace_s: 10\n"
    )
    _refused(polar("run", task, "--run-dir", tmp_path / "run"),
             f"{task}:5: accept: 4 accepted samples of 3 started", f"{task}:11: accept_fraction: needs accept_grace_s too",
             f"{task}:15: accept_fraction: a fraction of what", f"{task}:21: accept_fraction:")


def test_topology_unknown_key_and_bad_value(tmp_path: Path, calculator_dir: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text("gateway:\n  pools:\n    run: 0\n  colour: blue\n")
    result = polar("run", calculator_dir / "task.yaml", "-c", topo, "--run-dir", tmp_path / "run")
    _refused(result, f"{topo}:3: gateway.pools.run:", f"{topo}:4: gateway.colour: unknown key")


def test_bad_proxy_settings_name_their_line_and_field(tmp_path: Path, calculator_dir: Path) -> None:
    """The proxy's settings (a wire.ProxySettings) are checked where the topology is read, as strictly
    as the rest: every bad one with its line and field, exit 2, before anything starts."""
    topo = tmp_path / "topology.yaml"
    topo.write_text("proxy:\n  mode: magic\n  max_body_mb: 0\n  engine_wait_s: .inf\n  port: '80'\n  colour: blue\n"
                    "  strict_model: 1\n")
    result = polar("run", calculator_dir / "task.yaml", "-c", topo, "--run-dir", tmp_path / "run")
    _refused(result, f"{topo}:2: proxy.mode: Input should be 'tito' or 'passthrough'",
             f"{topo}:3: proxy.max_body_mb: Input should be greater than 0",
             f"{topo}:4: proxy.engine_wait_s: Input should be a finite number",
             f"{topo}:5: proxy.port: Input should be a valid integer",
             f"{topo}:6: proxy.colour: unknown key", f"{topo}:7: proxy.strict_model: Input should be a valid boolean")
    assert not (tmp_path / "run").exists()


def test_missing_sandbox_file_and_duplicate_ids(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    with_file = dict(GOOD, sandbox={"files": {"a.py": "nope.py"}})
    tasks.write_text(json.dumps(with_file) + "\n")
    _refused(polar("run", tasks), "sandbox.files: no such file", "nope.py")
    tasks.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    _refused(polar("run", tasks), "duplicate task id(s): t")


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    _refused(polar("run", tmp_path / "absent.yaml"), "absent.yaml: cannot read")
    broken = tmp_path / "broken.yaml"
    broken.write_text("id: t\ninstruction: [unclosed\n")
    _refused(polar("run", broken), f"{broken}:3: not valid YAML")


def _refused_all(cases: dict[str, list[str]], tmp_path: Path, timeout: float = 120) -> None:
    """Run `polar-hpc run FILE` on every case at once; each must be refused with its messages."""
    procs = {
        name: subprocess.Popen([sys.executable, "-m", "polar_hpc", "run", str(tmp_path / name), "--run-dir",
                                str(tmp_path / f"run-{name}")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        for name in cases
    }
    for name, proc in procs.items():
        _, stderr = proc.communicate(timeout=timeout)
        _refused(subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr), *cases[name])
        assert not (tmp_path / f"run-{name}").exists(), name


def test_hostile_files_are_refused_quickly_with_their_line(tmp_path: Path) -> None:
    laughs = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    laughs += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    head = "id: t\ninstruction: hi\nharness: {command: 'true'}\nmetadata:\n"
    (tmp_path / "laughs.yaml").write_text(head + "".join(f"  {line}\n" for line in laughs))
    (tmp_path / "loop.yaml").write_text(head + "  m: &m\n    self: *m\n")
    (tmp_path / "deep.yaml").write_text(head + "  x: " + "[" * 100_000 + "]" * 100_000 + "\n")
    chain = "".join(f"  k{i}: &k{i} [{f'*k{i - 1}' if i else 1}]\n" for i in range(40))  # deep only once expanded
    (tmp_path / "chain.yaml").write_text(head + chain)
    (tmp_path / "latin1.yaml").write_bytes(b"id: t\ninstruction: caf\xe9\nharness: {command: 'true'}\n")
    (tmp_path / "deep.jsonl").write_text(json.dumps(GOOD) + "\n" + '{"id": "d", "metadata": ' + "[" * 50_000
                                         + "]" * 50_000 + "}\n")
    shallow = json.dumps(dict(GOOD, id="m", metadata={"x": json.loads("[" * 40 + "]" * 40)}))
    (tmp_path / "nan.jsonl").write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD).replace('"t"', '"u"', 1)
                                        .replace("}}", '}, "timeout_s": NaN}') + "\n" + shallow + "\n")
    t0 = time.monotonic()
    _refused_all({
        "laughs.yaml": ["laughs.yaml:", "aliases expand this document to 12345679"],
        "loop.yaml": ["loop.yaml:6: not valid YAML: an alias to a node that contains it"],
        "deep.yaml": ["deep.yaml:5: not valid YAML: nested deeper than 32 levels"],
        "chain.yaml": ["not valid YAML: nested deeper than 32 levels once its aliases are expanded"],
        "latin1.yaml": ["latin1.yaml:2: not valid UTF-8 (byte 0xe9 at column 17)"],
        "deep.jsonl": ["deep.jsonl:2: not valid JSON: nested too deeply"],
        "nan.jsonl": ["nan.jsonl:2: not valid JSON", "nan.jsonl:3: metadata: nested deeper than 32 levels"],
    }, tmp_path)
    assert time.monotonic() - t0 < 100  # the billion laughs took 74 s alone before it ran out of memory


def test_numbers_are_finite_and_bounded_and_ids_are_safe(tmp_path: Path) -> None:
    (tmp_path / "inf.yaml").write_text(
        "id: t\ninstruction: hi\ntimeout_s: .inf\nnum_samples: 1000000000\nharness: {command: 'true'}\n"
        "evaluator: {kind: command, command: 'true', timeout_s: 1e9}\n")
    many = dict(GOOD, num_samples=10_000)
    (tmp_path / "many.jsonl").write_text("".join(json.dumps(dict(many, id=f"t{i}")) + "\n" for i in range(101)))
    bad_ids = ["../../escape", "a/../../b", "", "with space", "hash#1", ".hidden", "x" * 257, "tab\there"]
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps(dict(GOOD, id=i)) + "\n" for i in bad_ids))
    _refused_all({
        "inf.yaml": ["inf.yaml:3: timeout_s: Input should be a finite number",
                     "inf.yaml:4: num_samples: Input should be less than or equal to 10000",
                     "inf.yaml:6: evaluator.timeout_s: Input should be less than or equal to 86400"],
        "many.jsonl": ["1010000 sessions (tasks x num_samples); at most 1000000 per task file"],
        "ids.jsonl": [f"ids.jsonl:{n}: id: a task id is" for n in range(1, len(bad_ids) + 1)],
    }, tmp_path)


def test_run_folder_named_after_a_task_id_stays_under_runs(tmp_path: Path, monkeypatch) -> None:
    from polar_hpc.launch.rundir import prepare

    monkeypatch.chdir(tmp_path)
    task = tmp_path / "task.yaml"
    task.write_text("id: org/repo:issue-1\ninstruction: hi\nharness: {command: 'true'}\n")
    run_dir, _, _ = prepare(task, None, None)
    assert run_dir.parent == tmp_path / "runs" and run_dir.name.endswith("-org_repo_issue-1")
