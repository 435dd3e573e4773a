"""Apptainer: the command lines it runs, node-local image copies, start admission; the real thing
where `apptainer` is on PATH (skipped otherwise, with the reason in the test output)."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path

import pytest

from polar_hpc.sandbox import SandboxError
from polar_hpc.sandbox.apptainer import ApptainerSandbox, ApptainerSettings, copy_to_node
from polar_hpc.sandbox.base import INSIDE, MARKER
from polar_hpc.sandbox.inside import RELAY_TOKEN

HAVE_APPTAINER = shutil.which("apptainer") is not None


def _box(tmp_path: Path, network="none", gpus=False, image="img.sif", **settings) -> ApptainerSandbox:
    (tmp_path / "images").mkdir(exist_ok=True)
    (tmp_path / "images" / "img.sif").write_bytes(b"SIF")
    settings = ApptainerSettings(image_dir=tmp_path / "images", **settings)
    return ApptainerSandbox(tmp_path / "sb", {}, [], network, proxy_socket=tmp_path / "p.sock",
                            image=image, settings=settings, gpus=gpus)


def test_instance_start_isolated_with_overlay_binds_and_relay(tmp_path: Path) -> None:
    sb = _box(tmp_path, gpus=True)
    sb.privileged = True  # a gateway running as root: harnesses run as the sandbox's leased uid, never as root
    sb.run_as = (2_000_000_007, 2_000_000_007)  # what start() would lease
    image = sb.resolve_image()
    argv = sb.instance_start_argv(image)
    ws, tmp = sb.workspace, sb.tmp
    assert argv == [
        "apptainer", "instance", "start", "--containall", "--no-home", "--no-privs",
        "--security", "uid:2000000007,gid:2000000007",
        "--overlay", str(sb.root / "overlay"), "--bind", f"{ws}:{ws}", "--bind", f"{tmp}:/tmp",
        "--bind", f"{sb.root / 'shm'}:/dev/shm", "--bind", f"{INSIDE}:/.polar/inside.py:ro",
        "--net", "--network", "none", "--bind", f"{tmp_path / 'p.sock'}:/run/polar/proxy.sock",
        "--nv", str(tmp_path / "images" / "img.sif"), sb.instance,
    ]
    assert "--writable-tmpfs" not in argv
    assert sb.proxy_url("http://10.0.0.1:8000") == "http://127.0.0.1:47111"
    exec_argv = sb._wrap(sb._launcher(["true"]))
    assert exec_argv[:5] == ["apptainer", "exec", "--cleanenv", "--no-privs", "--security"]
    assert exec_argv[5] == "uid:2000000007,gid:2000000007"
    assert "--nproc" in exec_argv  # no pids cgroup here: RLIMIT_NPROC, of the sandbox's own uid
    argv, env = sb._process("true", {"POLAR_SANDBOX_ID": "m", RELAY_TOKEN: "session-token"})  # the harness's
    assert argv[argv.index("--relay") + 1] == "47111=/run/polar/proxy.sock" and "--relay" not in exec_argv
    assert env["APPTAINERENV_POLAR_RELAY_TOKEN"] == "session-token" and not any("session-token" in a for a in argv)


def test_host_network_no_gpu_and_exec_stop_lines(tmp_path: Path) -> None:
    sb = _box(tmp_path, network="host")
    sb.privileged = False  # a gateway that is not root: its own user, in a user namespace
    argv = sb.instance_start_argv("docker://python:3.11")
    assert "--security" not in argv and argv[3:6] == ["--containall", "--no-home", "--no-privs"]
    assert "--net" not in argv and "--nv" not in argv and "/run/polar/proxy.sock" not in " ".join(argv)
    assert sb.proxy_url("http://10.0.0.1:8000") == "http://10.0.0.1:8000"
    exec_argv = sb._wrap(sb._launcher(["/bin/sh", "-c", "echo hi"]))
    assert exec_argv[:7] == ["apptainer", "exec", "--cleanenv", "--no-privs", "--pwd", str(sb.workspace),
                             f"instance://{sb.instance}"]
    assert exec_argv[7:9] == ["python3", "/.polar/inside.py"]
    assert exec_argv[-4:] == ["--", "/bin/sh", "-c", "echo hi"]
    assert "--nproc" in exec_argv and "--relay" not in exec_argv
    assert sb._wrap(["true"], cwd="/app")[4:6] == ["--pwd", "/app"]  # a command's cwd
    with pytest.raises(ValueError, match="runs every command as the harness's own user"):
        sb._wrap(["true"], user="root")  # no user of the image can be chosen (no --fakeroot yet)
    assert sb.instance_stop_argv() == ["apptainer", "instance", "stop", "--force", sb.instance]
    harbor = ApptainerSandbox(tmp_path / "h", {}, [], "host", settings=sb.settings, mounts={"/tests": "tests"})
    assert harbor.seen_at("/tests") == "/tests"
    argv = harbor.instance_start_argv("docker://python:3.11")
    assert argv[argv.index(f"{tmp_path / 'h' / 'tests'}:/tests") - 1] == "--bind"  # Harbor's paths, bound


def test_environment_travels_as_apptainerenv_without_the_host_path(tmp_path: Path) -> None:
    env = _box(tmp_path)._environment({"OPENAI_API_KEY": "tok", "PATH": "/host/venv/bin", MARKER: "m"})
    assert env["APPTAINERENV_OPENAI_API_KEY"] == "tok" and env["APPTAINERENV_POLAR_SANDBOX_ID"] == "m"
    assert env["APPTAINERENV_TMPDIR"] == "/tmp" and "APPTAINERENV_PATH" not in env
    assert "OPENAI_API_KEY" not in env


def test_missing_image_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match=r"sandbox.image: no such image: .*nope.sif"):
        _box(tmp_path, image="nope.sif").resolve_image()
    with pytest.raises(SandboxError, match="needs an image"):
        _box(tmp_path, image=None).resolve_image()


def test_sif_is_copied_once_per_node(tmp_path: Path) -> None:
    image = tmp_path / "shared" / "harness.sif"
    image.parent.mkdir()
    image.write_bytes(os.urandom(1 << 20))
    local = tmp_path / "node"
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(copy_to_node(image, local))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and Path(results[0]).read_bytes() == image.read_bytes()
    assert [p.name for p in local.glob("*.sif")] == [Path(results[0]).name]
    first = Path(results[0]).stat().st_mtime_ns
    assert copy_to_node(image, local) == results[0] and Path(results[0]).stat().st_mtime_ns == first


def test_start_admission_limits_concurrent_starts(tmp_path: Path) -> None:
    """A stand-in `apptainer` records how many instance starts overlap."""
    fake = tmp_path / "apptainer"
    log = tmp_path / "starts.log"
    fake.write_text(f"#!/bin/sh\necho start >> {log}; sleep 0.3; echo end >> {log}\n")
    fake.chmod(0o755)
    settings = ApptainerSettings(image_dir=tmp_path, starts_per_node=3, starts_per_image=2, executable=str(fake))
    for name in ("a.sif", "b.sif"):
        (tmp_path / name).write_bytes(b"SIF")

    async def go():
        boxes = [ApptainerSandbox(tmp_path / f"sb{i}", {}, [], "host", image="ab"[i % 2] + ".sif",
                                  settings=settings) for i in range(8)]
        await asyncio.gather(*(b._launch() for b in boxes))

    asyncio.run(go())
    depth = peak = 0
    for line in log.read_text().split():
        depth += 1 if line == "start" else -1
        peak = max(peak, depth)
    assert peak == 3  # 2 per image, 3 per node


@pytest.mark.skipif(not HAVE_APPTAINER, reason="apptainer is not installed here (not packaged in Debian bookworm "
                    "nor on PyPI); the command lines are unit-tested above")
def test_real_instance_runs_commands_and_stops(tmp_path: Path) -> None:
    image = os.environ.get("POLAR_TEST_SIF")
    if not image:
        pytest.skip("set POLAR_TEST_SIF to a SIF with python3 to run the apptainer integration test")

    async def go():
        sb = ApptainerSandbox(tmp_path / "sb", {}, [], "none", image=image, settings=ApptainerSettings())
        await sb.start()
        r = await sb.exec("echo hi > f && cat f && cat /proc/net/dev | tail -n +3 | cut -d: -f1", {}, 60)
        return r, await sb.stop()

    r, clean = asyncio.run(go())
    assert r.stdout.split() == [b"hi", b"lo"] and clean
