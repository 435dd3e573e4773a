"""Fixtures shared by the orchestrator's tests."""

from __future__ import annotations

import pytest
import zmq


@pytest.fixture
def ctx():
    """A ZeroMQ context whose sockets never linger (one refused by CURVE keeps its messages)."""
    context = zmq.Context()
    context.setsockopt(zmq.LINGER, 0)
    yield context
    context.destroy(linger=0)
