"""Fixtures for shard tests."""

from __future__ import annotations

import pytest

from shards.helpers import make_trajectory


@pytest.fixture
def make_traj():
    return make_trajectory
