#!/bin/bash
# Talks to the service the agent left running (the agent returned once it answered: a few seconds' grace).
python3 - <<'PY'
import time, urllib.request
reward, deadline = 0, time.monotonic() + 5
while time.monotonic() < deadline:
    try:
        reward = int(urllib.request.urlopen("http://127.0.0.1:8765/status.txt", timeout=5).read().strip() == b"ready")
        break
    except OSError:
        time.sleep(0.2)
open("/logs/verifier/reward.txt", "w").write(f"{reward}\n")
PY
