"""Runs INSIDE a sandbox, under the sandbox's own python3 (stdlib only): limits, proxy relay, exec.
(bwrap on the host's root uses the host's prlimit and setpriv and a shell instead, where it can,
and this script with `--relay` alone for a command relayed to the proxy: bwrap.py.)

    python3 inside.py [--nproc N] [--fsize BYTES] [--as BYTES] [--user UID:GID] [--relay PORT=SOCKET] [--prefixed-env]
                      -- ARGV...

- `--nproc N`: RLIMIT_NPROC. Inside a fresh user namespace (bwrap, apptainer) the kernel counts
  only this sandbox's processes against it, so it bounds a fork bomb; it is not enforced for a
  process whose user is root outside every namespace (there the gateway uses a pids cgroup).
- `--fsize BYTES`: RLIMIT_FSIZE, the largest file any process may write (`yes > file` stops there).
- `--as BYTES`: RLIMIT_AS, each process's address space (the memory bound where no memory cgroup
  can be made: an allocation past it fails).
- `--user UID:GID` (started as host root, as bwrap does for a root gateway): drop to that host
  uid and gid for good: no supplementary groups, an empty capability bounding set, no_new_privs
  (setuid binaries cannot give root back); it exits 126 unless /proc/self/status then shows
  that uid and no capability at all. The relay below runs as that user too.
- `--relay PORT=SOCKET`: listen on 127.0.0.1:PORT *before* ARGV starts and relay each connection
  to the Unix socket SOCKET (the proxy's), so a harness with no network still reaches its proxy
  at an ordinary http URL. The relay is a forked child that dies with ARGV (PR_SET_PDEATHSIG).
  A port already taken (a relay of an earlier exec still alive in a shared namespace) is reused.

- `--prefixed-env`: ARGV's environment is this script's `POLAR_ENV_*` variables, prefix removed
  (bwrap). What a task sets (LD_PRELOAD, PYTHONPATH, PATH...) then reaches only ARGV, after the
  drop, never the sandbox launcher or this script while they may still be root.

Then it execs ARGV, so ARGV's exit status is the sandbox command's. It runs before every command
(`python3 -I -S` where the backend allows), so it imports what an option needs only when that
option is given: `os`, `resource` and `sys` always, `ctypes` for `--user` and `--relay`, `socket`
and `threading` for `--relay`.
"""

import os
import resource
import sys

_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
ENV_PREFIX = "POLAR_ENV_"


def main(argv):
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1 :]
    relay = user = None
    env = dict(os.environ)
    if "--prefixed-env" in opts:
        opts.remove("--prefixed-env")
        env = {k[len(ENV_PREFIX) :]: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for flag, value in zip(opts[::2], opts[1::2]):
        if flag == "--nproc":
            resource.setrlimit(resource.RLIMIT_NPROC, (int(value), int(value)))
        elif flag == "--fsize":
            resource.setrlimit(resource.RLIMIT_FSIZE, (int(value), int(value)))
        elif flag == "--as":
            resource.setrlimit(resource.RLIMIT_AS, (int(value), int(value)))
        elif flag == "--user":
            user = tuple(int(n) for n in value.split(":"))
        elif flag == "--relay":
            port, path = value.split("=", 1)
            relay = (int(port), path)
    if user is not None:
        _drop_to(*user)
    if relay is not None:
        _start_relay(*relay)
    os.execvpe(command[0], command, env)


def _drop_to(uid, gid):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    cap = 0
    while libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:  # EINVAL past the last capability
        cap += 1
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # clears the permitted, effective and ambient sets
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    fields = ("CapPrm", "CapEff", "CapBnd", "CapAmb")
    dropped = all(int(status[k], 16) == 0 for k in fields) and status["NoNewPrivs"].strip() == "1"
    if status["Uid"].split() != [str(uid)] * 4 or status["Gid"].split() != [str(gid)] * 4 or not dropped:
        sys.stderr.write("inside.py: could not drop to uid %d gid %d with no capabilities\n" % (uid, gid))
        os._exit(126)


def _start_relay(port, path):
    import ctypes
    import signal
    import socket
    import threading

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError:  # an earlier exec's relay still serves this namespace
        listener.close()
        return
    listener.listen(128)
    parent = os.getpid()
    if os.fork() != 0:
        listener.close()
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)
    os.closerange(0, 3)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve, args=(client, path), daemon=True).start()


def _serve(client, path):
    import socket  # loaded already by _start_relay: these imports only bind the names
    import threading

    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _pipe(src, dst):
    import socket

    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
