"""The bubblewrap the isolation tests need: `needs_bwrap` skips a test where bwrap cannot run here,
unless POLAR_REQUIRE_BWRAP=1 (CI, .ci/run), where the test runs and fails instead."""

from __future__ import annotations

import os

import pytest

from polar_hpc.sandbox import bwrap

AVAILABLE = bwrap.available()
REQUIRED = os.environ.get("POLAR_REQUIRE_BWRAP") == "1"
needs_bwrap = pytest.mark.skipif(
    not AVAILABLE and not REQUIRED, reason="bubblewrap not installed or not usable here (CI: POLAR_REQUIRE_BWRAP=1 fails)"
)
