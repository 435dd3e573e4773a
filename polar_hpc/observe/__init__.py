"""Watching a run from its run directory: figures (`RunReader`), the dashboard server, metrics.

Reads only the shared filesystem (journal, shards, logs), so it works from a login node, live or
after the job; placed above shards/ and trajectory/ and below launch/ (whose `status --watch`
uses it). See docs/observe.md.
"""

from __future__ import annotations

from polar_hpc.observe.run import RunReader

__all__ = ["RunReader"]
