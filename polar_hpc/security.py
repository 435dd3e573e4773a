"""Per-run secrets: CURVE keys for the TCP ZeroMQ links, by peer role, and the engines' API key.

`create_keys(run_dir)` writes `<run>/keys/` (mode 0700, each file 0600) for every run (`submit`,
`sbatch`, `polar-hpc run`): `server.json` (the orchestrator's keypair), one keypair per peer role
(`ROLES`: `gateway.json` for gateways, `engine.json` for engine steps, `client.json` for trainers
through `polar_hpc.client`, `admin.json` for the launcher: the driver, `polar-hpc run`, `status`,
`cancel`) and `engine_api_key` (the Bearer key every engine demands, sent by proxies and by the
orchestrator's weight updates). Only processes that can read the run directory hold them; an
operator may hand a trainer `client.json` alone.

`secure_server(ctx, sock, run_dir)` makes the orchestrator's ROUTER a CURVE server whose ZAP
handler accepts only the run's role keys and names the role as the connection's User-Id;
`peer_roles(frame, secured)` reads it back from a received frame. `secure_client(sock, run_dir,
role)` gives a socket its role's keypair and the server's public key. A run directory without keys
(an orchestrator started by hand, tests) means plain TCP, where every peer holds every role (`ANY`).

The gateway's proxy link (ipc) takes messages only from the routing id it handed its proxy in
`PROXY_LINK_ENV` (a random secret per gateway), so another process that reaches the socket cannot
pose as the proxy.

The engine API key reaches a process in the environment variable `ENGINE_KEY_ENV`, never on a
command line (`ps` shows command lines to every user of a node); `engine_env(run_dir)` is the
environment entry for a child that needs it, `engine_api_key(run_dir)` the key itself (None
without keys).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import zmq
import zmq.auth.asyncio
from zmq.utils import z85

from polar_hpc.errors import ConfigError

GATEWAY, ENGINE, CLIENT, ADMIN = "gateway", "engine", "client", "admin"
ROLES = (GATEWAY, ENGINE, CLIENT, ADMIN)
ANY = frozenset(ROLES)
ENGINE_KEY_ENV = "POLAR_ENGINE_API_KEY"
PROXY_LINK_ENV = "POLAR_PROXY_LINK_ID"
_ENGINE_KEY_FILE = "engine_api_key"


def keys_dir(run_dir: Path) -> Path:
    return run_dir / "keys"


def create_keys(run_dir: Path) -> None:
    folder = keys_dir(run_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    for name in ("server", *ROLES):
        public, secret = zmq.curve_keypair()
        _write_private(folder / f"{name}.json", json.dumps({"public": public.decode(), "secret": secret.decode()}))
    _write_private(folder / _ENGINE_KEY_FILE, secrets.token_urlsafe(32))


def has_keys(run_dir: Path) -> bool:
    return (keys_dir(run_dir) / "server.json").exists()


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _read(run_dir: Path, name: str) -> str:
    path = keys_dir(run_dir) / name
    try:
        return path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the run's keys: {e}") from None


def _load(run_dir: Path, name: str) -> dict:
    text = _read(run_dir, f"{name}.json")
    try:
        return json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{keys_dir(run_dir) / name}.json: not a keypair: {e}") from None


class _RoleAuthenticator(zmq.auth.asyncio.AsyncioAuthenticator):
    """ZAP handler: a CURVE client key of one of the run's roles may connect; its User-Id is the role."""

    def __init__(self, ctx: zmq.asyncio.Context, roles: dict[bytes, str]) -> None:
        super().__init__(ctx)
        self.roles = roles  # z85 public key -> role

    def callback(self, domain: str, key: bytes) -> bool:  # the credentials provider
        return key in self.roles

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.roles[z85.encode(client_public_key)]


def secure_server(ctx: zmq.asyncio.Context, sock: zmq.Socket, run_dir: Path):
    """Make `sock` a CURVE server accepting only the run's role keys; returns the authenticator
    (stop it on exit), or None when the run has no keys."""
    if not has_keys(run_dir):
        return None
    auth = _RoleAuthenticator(ctx, {_load(run_dir, role)["public"].encode(): role for role in ROLES})
    auth.start()
    auth.configure_curve_callback("*", credentials_provider=auth)
    server = _load(run_dir, "server")
    sock.curve_secretkey = server["secret"].encode()
    sock.curve_publickey = server["public"].encode()
    sock.curve_server = True
    return auth


def peer_roles(frame: zmq.Frame, secured: bool) -> frozenset[str]:
    """The roles of the peer that sent `frame`: its key's role on a secured socket, else all."""
    if not secured:
        return ANY
    try:
        role = frame.get("User-Id")
    except zmq.ZMQError:
        return _NONE
    return _ONE.get(role, _NONE) if isinstance(role, str) else _NONE


_ONE = {role: frozenset({role}) for role in ROLES}  # made once: a message costs a lookup, not a set
_NONE: frozenset[str] = frozenset()


def server_public_key(run_dir: Path) -> str:
    return _load(run_dir, "server")["public"]


def secure_client(sock: zmq.Socket, run_dir: Path, role: str) -> None:
    """Give `sock` the keypair of `role` and the orchestrator's public key (no-op without keys).
    Call before connect."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r} (known: {', '.join(ROLES)})")
    if not has_keys(run_dir):
        return
    keys = _load(run_dir, role)
    sock.curve_secretkey = keys["secret"].encode()
    sock.curve_publickey = keys["public"].encode()
    sock.curve_serverkey = _load(run_dir, "server")["public"].encode()


def engine_api_key(run_dir: Path) -> str | None:
    """The run's engine API key; None for a run without keys."""
    return _read(run_dir, _ENGINE_KEY_FILE).strip() if has_keys(run_dir) else None


def engine_env(run_dir: Path) -> dict[str, str]:
    """The environment of the current process plus the engine API key (for one child only)."""
    key = engine_api_key(run_dir)
    return dict(os.environ) | ({ENGINE_KEY_ENV: key} if key else {})
