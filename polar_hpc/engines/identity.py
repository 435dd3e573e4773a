"""Proof that an engine is this run's own, before anything is served from it.

`port_taken(port)`: something already listens on `port` here (the engine step refuses to start a
server there: whatever answered would be served as ours). `check(url, key)`: None when the engine
at `url` refuses GET /v1/models without a key and with a wrong one (401/403) and answers it with
the run's key (200); else why it cannot prove it is ours (a foreign server, another run's engine,
one that does not demand the key). Every engine kind demands the run's key on every route but
/health (engines/*/launch.py), so only the engine the step started with that key passes.
"""

from __future__ import annotations

import secrets
import socket
import urllib.error
import urllib.request

TIMEOUT_S = 10.0


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free; a listener is not
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def check(url: str, key: str) -> str | None:
    for given, wanted in ((None, (401, 403)), (f"wrong-{secrets.token_hex(8)}", (401, 403)), (key, (200,))):
        status = _status(f"{url}/v1/models", given)
        if status not in wanted:
            shown = "the run's key" if given == key else "a wrong key" if given else "no key"
            return f"{url} answered {status} to GET /v1/models with {shown} (wanted {' or '.join(map(str, wanted))})"
    return None


def _status(url: str, key: str | None) -> int | str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return f"no answer ({e})"
