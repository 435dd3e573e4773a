"""The nix environment of tests/nix: a private store and cache, never /nix or a daemon."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def nix_env(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("nix")
    return {**os.environ, "NIX_REMOTE": str(base / "store"), "XDG_CACHE_HOME": str(base / "cache")}
