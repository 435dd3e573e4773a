"""A proxy child imports neither the configuration models nor YAML: the CLI's error guard catches
`errors.ConfigError`, not config's, so the proxy starts without that cost."""

from __future__ import annotations

import subprocess
import sys

from polar_hpc import wire


def test_the_proxy_child_loads_no_config_module() -> None:
    """The real child command line, stopped by bad input in the guard (exit 2): Python's own import
    log (-X importtime) names every module it loaded."""
    launch = wire.ProxyLaunch(gateway="ipc:///nowhere", engine_urls=["http://127.0.0.1:9"], model="m",
                              engine_kind="nope", heartbeat_s=1.0, peer_timeout_s=10.0)
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "polar_hpc", "proxy", launch.argument()],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "engine kind 'nope' is not known" in out.stderr, out.stderr[-2000:]
    loaded = {line.rpartition("|")[2].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "polar_hpc.proxy.server" in loaded and "polar_hpc.errors" in loaded
    assert not {"polar_hpc.config", "polar_hpc.config_files", "yaml"} & loaded
