"""`beside_probe.py FOLDER TOKEN`: two bwrap sandboxes under FOLDER, made by this process (a root
gateway's or, run as another user, an unprivileged one's): a victim holding TOKEN in its
environment waits while a thief reads every /proc/PID/environ it can; prints, as JSON, what the
host's view (this process) and the thief found."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from polar_hpc.sandbox.bwrap import BwrapSandbox

SCAN = "for e in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $e 2>/dev/null; done | grep 'OPENAI_API_KEY=' || true"


async def main(folder: Path, token: str) -> dict:
    victim = BwrapSandbox(folder / "victim", {}, [], "none")
    thief = BwrapSandbox(folder / "thief", {}, [], "none")
    for sb in (victim, thief):
        await sb.start()
    held = asyncio.ensure_future(victim.exec("touch ready; while [ ! -e go ]; do sleep 0.05; done",
                                             {"OPENAI_API_KEY": token}, 120))
    while not (victim.workspace / "ready").exists():
        assert not held.done(), held.result()
        await asyncio.sleep(0.05)
    on_host = subprocess.run(["/bin/sh", "-c", SCAN], capture_output=True, text=True).stdout
    stolen = await thief.exec(SCAN, {"OPENAI_API_KEY": "thief-own"}, 60)  # its own is there to be read
    (victim.workspace / "go").touch()
    await held
    stopped = await victim.stop() and await thief.stop()
    return {"on_host": on_host, "stolen": stolen.stdout.decode(), "stopped": stopped}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))))
