#!/bin/bash
# Starts the service and leaves it running; returns once it answers (up to 60 s on a busy machine).
mkdir -p site && echo ready > site/status.txt
nohup python3 -m http.server 8765 --bind 127.0.0.1 --directory site > /dev/null 2>&1 &
python3 - <<'PY'
import time, urllib.request
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        urllib.request.urlopen("http://127.0.0.1:8765/status.txt", timeout=5)
        break
    except OSError:
        time.sleep(0.2)
PY
