"""Apptainer sandbox (clusters): one rootless instance per session, with a host-backed overlay.

start (after admission: at most `starts_per_node` instance starts at once in this gateway, one
gateway per node, and `starts_per_image` per image, so 256 simultaneous starts do not storm the
mount layer; a SIF on the shared filesystem is first copied once per node to node-local storage):

    apptainer instance start --containall --no-home --no-privs [--security uid:U,gid:G]
        --overlay ROOT/overlay --bind WS:WS --bind TMP:/tmp --bind SHM:/dev/shm
        --bind inside.py:/.polar/inside.py:ro
        [--net --network none --bind PROXY.sock:/run/polar/proxy.sock] [--nv] IMAGE polar-ID

exec:  apptainer exec --cleanenv --no-privs [--security uid:U,gid:G] --pwd WS|CWD instance://polar-ID
           python3 /.polar/inside.py ... -- CMD
       (the harness's environment travels as APPTAINERENV_*; the image keeps its own PATH)

`--containall` is --contain (minimal /dev, no host /tmp or home) + --cleanenv + --ipc + --pid;
`--no-privs` drops every capability even from a root user. A gateway running as root adds
`--security uid:U,gid:G` (owner.py: `run_as`, the sandbox's own leased uid) so harnesses never run as root,
and gives the sandbox's folders to that user. /dev/shm is the sandbox's `shm` folder, on disk and
counted in the disk limit.
stop:  apptainer instance stop --force polar-ID, then the base kills anything still marked.

The instance has its own PID namespace (`--pid`), so stopping it ends every process it holds.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from polar_hpc.sandbox.base import INSIDE, SandboxError
from polar_hpc.sandbox.owner import RunsAs

_INSIDE_AT = "/.polar/inside.py"


@dataclass
class ApptainerSettings:
    """Per-gateway (= per-node) settings and admission state shared by its sandboxes."""

    image: str | None = None  # used when a task names no image
    image_dir: Path | None = None  # where relative image names are found (shared filesystem)
    node_local_dir: Path | None = None  # where SIF files are copied once per node
    starts_per_node: int = 16
    starts_per_image: int = 8
    executable: str = "apptainer"
    _node: asyncio.Semaphore | None = field(default=None, repr=False)
    _images: dict = field(default_factory=dict, repr=False)

    def gates(self, image: str) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
        if self._node is None:
            self._node = asyncio.Semaphore(self.starts_per_node)
            self._images = defaultdict(lambda: asyncio.Semaphore(self.starts_per_image))
        return self._node, self._images[image]


def available(executable: str = "apptainer") -> bool:
    return shutil.which(executable) is not None


class ApptainerSandbox(RunsAs):
    name = "apptainer"
    binds_mounts = True
    pid_namespace = True
    isolates_network = True
    python = "python3"
    python_flags = ()  # the image's own python3, whatever its version
    inside = _INSIDE_AT

    def __init__(self, *args, settings: ApptainerSettings, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.settings = settings
        self.instance = f"polar-{self.marker}"
        self.overlay = self.root / "overlay"
        self._started = False

    def resolve_image(self) -> str:
        """The image to start: a SIF path (checked) or a URI passed through as given."""
        image = self.image or self.settings.image
        if not image:
            raise SandboxError("sandbox.image: the apptainer backend needs an image (or sandbox.apptainer.image)")
        if "://" in image:
            return image
        path = Path(image)
        if not path.is_absolute() and self.settings.image_dir is not None:
            path = self.settings.image_dir / path
        if not path.exists():
            raise SandboxError(f"sandbox.image: no such image: {path}")
        return str(path)

    def instance_start_argv(self, image: str) -> list[str]:
        ws, tmp = str(self.workspace), str(self.tmp)
        args = [self.settings.executable, "instance", "start", "--containall", "--no-home", *self._unprivileged()]
        args += ["--overlay", str(self.overlay), "--bind", f"{ws}:{ws}", "--bind", f"{tmp}:/tmp"]
        args += ["--bind", f"{self.shm}:/dev/shm", "--bind", f"{INSIDE}:{_INSIDE_AT}:ro"]
        args += [arg for path, folder in self.mounts.items() for arg in ("--bind", f"{folder}:{path}")]
        if self.network != "host":
            args += ["--net", "--network", "none"]
        if self.relayed:
            args += ["--bind", f"{self.proxy_socket}:{self.proxy_socket_inside}"]
        if self.gpus:
            args.append("--nv")
        return args + [image, self.instance]

    def instance_stop_argv(self) -> list[str]:
        return [self.settings.executable, "instance", "stop", "--force", self.instance]

    def _unprivileged(self) -> list[str]:
        return ["--no-privs"] + (["--security", "uid:%d,gid:%d" % self.run_as] if self.privileged else [])

    def _wrap(self, argv: list[str], cwd: str | None = None, user: str | None = None) -> list[str]:
        if user is not None:
            raise ValueError(f"user {user!r}: an Apptainer sandbox runs every command as the harness's own user")
        exe, ws = self.settings.executable, str(self.workspace)
        return [exe, "exec", "--cleanenv", *self._unprivileged(), "--pwd", cwd or ws, f"instance://{self.instance}"] + argv

    def _environment(self, env: dict[str, str]) -> dict[str, str]:
        inner = {"HOME": str(self.workspace), "TMPDIR": "/tmp", "LANG": "C.UTF-8"} | env
        inner.pop("PATH", None)  # the image's own PATH, not the host's
        host = {k: v for k, v in os.environ.items() if k in ("PATH", "XDG_RUNTIME_DIR", "APPTAINER_CACHEDIR")}
        return host | {f"APPTAINERENV_{k}": v for k, v in inner.items()}

    async def _launch(self) -> None:
        await super()._launch()
        image = self.resolve_image()
        self.overlay.mkdir(parents=True, exist_ok=True)
        node_gate, image_gate = self.settings.gates(image)
        async with image_gate, node_gate:  # the node slot is taken only when the image allows
            if image.endswith(".sif") and self.settings.node_local_dir is not None:
                image = await asyncio.to_thread(copy_to_node, Path(image), self.settings.node_local_dir)
            proc = await asyncio.create_subprocess_exec(
                *self.instance_start_argv(image),
                env=self._environment({}),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await proc.communicate()
        if proc.returncode != 0:
            tail = out[-2000:].decode(errors="replace")
            raise SandboxError(f"apptainer instance start exited {proc.returncode}: {tail}")
        self._started = True

    async def _terminate(self) -> None:
        if not self._started:
            return
        proc = await asyncio.create_subprocess_exec(
            *self.instance_stop_argv(),
            env=self._environment({}),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await proc.wait()
        self._started = False


def copy_to_node(image: Path, local_dir: Path) -> str:
    """A node-local copy of `image`, made once per node (other gateways wait on a file lock)."""
    st = image.stat()
    local_dir.mkdir(parents=True, exist_ok=True)
    dest = local_dir / f"{image.stem}-{st.st_size}-{st.st_mtime_ns}.sif"
    if dest.exists():
        return str(dest)
    with open(local_dir / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not dest.exists():
            part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
            shutil.copyfile(image, part)
            os.replace(part, dest)
    return str(dest)
