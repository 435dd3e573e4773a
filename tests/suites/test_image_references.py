"""Image references in suites (suites.images.parse): Harbor's docker_image and a SWE-bench image
become canonical `docker://` references (Docker's defaults filled in); a malformed one (an option
in disguise, upper case, a bad digest, too long) is named with its file and line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from suites.helpers import copy_task
from suites.swebench_rows import row
from suites.test_loading import check_fails

from polar_hpc import suites
from polar_hpc.errors import ConfigError
from polar_hpc.suites import dockerfile as dockerfile_mod
from polar_hpc.suites.images import parse

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text, canonical", [
    ("python:3.11-slim", "docker.io/library/python:3.11-slim"),
    ("docker://ubuntu", "docker.io/library/ubuntu:latest"),
    ("user/repo", "docker.io/user/repo:latest"),
    ("ghcr.io/org/img:1.0", "ghcr.io/org/img:1.0"),
    ("localhost:5000/a/b", "localhost:5000/a/b:latest"),
    (f"127.0.0.1:5000/x@{DIGEST}", f"127.0.0.1:5000/x@{DIGEST}"),
])
def test_references_are_made_canonical(text: str, canonical: str) -> None:
    assert str(parse(text)) == canonical


@pytest.mark.parametrize("text", ["--src-creds=a:b", "Upper/Case", "a b", "x@sha256:12", "x:" + "t" * 200,
                                  "ghcr.io/" + "a/" * 300 + "b", "", "docker://", "x;rm -rf /"])
def test_malformed_references_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not an image reference"):
        parse(text)


def test_suites_name_bad_images_with_file_and_line(tmp_path: Path) -> None:
    task = copy_task(tmp_path, "t")
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]\n", '[environment]\ndocker_image = "python:3.11-slim"\n'))
    [loaded] = suites.load(task)
    assert loaded.sandbox.image == "docker://docker.io/library/python:3.11-slim"
    line = toml.read_text().splitlines().index('docker_image = "python:3.11-slim"') + 1
    assert loaded.metadata["image_source"] == f"{toml}:{line}: environment.docker_image"
    toml.write_text(toml.read_text().replace("python:3.11-slim", "-oops"))
    assert f"{toml}:{line}: environment.docker_image: not an image reference" in check_fails("tasks", "check", task)

    data, commits = tmp_path / "swe.jsonl", {"base_commit": "abc", "patch": "p", "test_patch": "diff --git a/t b/t\n"}
    data.write_text(json.dumps(row(commits, image="swebench/sweb.eval.x86_64.pkg:v1")) + "\n"
                    + json.dumps(row(commits, instance_id="b", image="Bad Image")) + "\n")
    assert f"{data}:2: image: not an image reference" in check_fails("tasks", "check", data)
    data.write_text(json.dumps(row(commits, image="swebench/sweb.eval.x86_64.pkg:v1")) + "\n")
    [swe] = suites.load(data)
    assert swe.sandbox.image == "docker://docker.io/swebench/sweb.eval.x86_64.pkg:v1"
    assert swe.metadata["image_source"] == f"{data}:1: image"


def test_a_dockerfiles_bases_are_read_as_docker_reads_them(tmp_path: Path) -> None:
    """FROM references become canonical (resolved through the same mirrors as pulls); a stage's name,
    scratch and an ARG are left to the builder; a malformed one is named with its line; the build key
    changes with any byte or mode of the context, and with the build's network."""
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG BASE=debian\nFROM --platform=linux/amd64 python:3.11-slim AS build\nRUN true\n"
                          "from build as test\nFROM scratch\nFROM ${BASE}\nFROM 127.0.0.1:5000/env:1\n")
    text, bases = dockerfile_mod.canonical(dockerfile)
    assert text.splitlines()[1] == "FROM --platform=linux/amd64 docker.io/library/python:3.11-slim AS build"
    assert text.splitlines()[3:6] == ["from build as test", "FROM scratch", "FROM ${BASE}"]
    assert [str(b) for b in bases] == ["docker.io/library/python:3.11-slim", "127.0.0.1:5000/env:1"]
    dockerfile.write_text("FROM debian\nFROM Ubuntu:22.04\n")
    with pytest.raises(ConfigError, match=rf"^{dockerfile}:2: FROM: not an image reference"):
        dockerfile_mod.canonical(dockerfile)
    key = dockerfile_mod.spec(tmp_path, offline=True)
    assert key["network"] == "none" and dockerfile_mod.spec(tmp_path, offline=False)["context"] != key["context"]
    dockerfile.chmod(0o600)
    assert dockerfile_mod.spec(tmp_path, offline=True) != key
