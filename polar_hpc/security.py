"""Per-run CURVE keys for the TCP ZeroMQ links of a Slurm run.

`create_keys(run_dir)` writes `<run>/keys/` (mode 0700) with two keypairs, each a 0600 JSON file:
`server.json` (the orchestrator's) and `client.json` (shared by every member of the run: gateways,
engine steps, the CLI, trainers). Only processes that can read the run directory hold them, so
other users on the same nodes cannot connect. The orchestrator accepts a CURVE handshake only
from the run's client public key (ZAP); a peer without the keys is refused. A run without a keys
folder (local mode, loopback only) uses plain TCP.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import zmq
import zmq.auth.asyncio

from polar_hpc.config import ConfigError


def keys_dir(run_dir: Path) -> Path:
    return run_dir / "keys"


def create_keys(run_dir: Path) -> None:
    folder = keys_dir(run_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    for name in ("server", "client"):
        public, secret = zmq.curve_keypair()
        _write_private(folder / f"{name}.json", {"public": public.decode(), "secret": secret.decode()})


def has_keys(run_dir: Path) -> bool:
    return (keys_dir(run_dir) / "server.json").exists()


def _write_private(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _load(run_dir: Path, name: str) -> dict:
    path = keys_dir(run_dir) / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read the run's CURVE keys: {e}") from None


class _OneClient:
    """ZAP credentials provider: only the run's client key may connect."""

    def __init__(self, public: str) -> None:
        self.public = public.encode()

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.public


def secure_server(ctx: zmq.asyncio.Context, sock: zmq.Socket, run_dir: Path):
    """Make `sock` a CURVE server accepting only the run's client key; returns the authenticator
    (stop it on exit), or None when the run has no keys."""
    if not has_keys(run_dir):
        return None
    auth = zmq.auth.asyncio.AsyncioAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback("*", credentials_provider=_OneClient(_load(run_dir, "client")["public"]))
    server = _load(run_dir, "server")
    sock.curve_secretkey = server["secret"].encode()
    sock.curve_publickey = server["public"].encode()
    sock.curve_server = True
    return auth


def server_public_key(run_dir: Path) -> str:
    return _load(run_dir, "server")["public"]


def secure_client(sock: zmq.Socket, run_dir: Path) -> None:
    """Give `sock` the run's client keypair and the orchestrator's public key (no-op without keys).
    Call before connect."""
    if not has_keys(run_dir):
        return
    client = _load(run_dir, "client")
    sock.curve_secretkey = client["secret"].encode()
    sock.curve_publickey = client["public"].encode()
    sock.curve_serverkey = _load(run_dir, "server")["public"].encode()
