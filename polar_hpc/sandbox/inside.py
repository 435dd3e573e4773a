"""Runs INSIDE a sandbox, under the sandbox's own python3 (stdlib only): limits, proxy relay, exec.
(bwrap on the host's root uses launcher.c, the same work compiled, instead; without a compiler,
the host's prlimit and setpriv and a shell where it can, and this script with `--relay` alone for
a command relayed to the proxy: bwrap.py.)

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
  that uid and no capability at all. The listener below is made as that user too.
- `--relay PORT=SOCKET`: *before* ARGV starts, make a listening socket on 127.0.0.1:PORT (in the
  sandbox's own network namespace) and hand it, with the session's token from the environment
  variable POLAR_RELAY_TOKEN, to the proxy over its Unix socket SOCKET (proxy/relay.py: one
  SOCK_SEQPACKET message, the descriptor by SCM_RIGHTS). The proxy then serves HTTP on it itself,
  so a harness with no network reaches its proxy at an ordinary http URL with no relay process.
  Unless the proxy answers "ok" within HANDOFF_S, it exits 126 with the proxy's reason on stderr:
  a harness that cannot reach its proxy would otherwise fail later and less clearly. A port
  already taken (apptainer: one namespace for every exec of the instance, and the proxy still
  serves the listener an earlier exec gave it) is left to that listener.

- `--prefixed-env`: ARGV's environment is this script's `POLAR_ENV_*` variables, prefix removed
  (bwrap). What a task sets (LD_PRELOAD, PYTHONPATH, PATH...) then reaches only ARGV, after the
  drop, never the sandbox launcher or this script while they may still be root.

Then it execs ARGV, so ARGV's exit status is the sandbox command's. It runs before every command
(`python3 -I -S` where the backend allows), so it imports what an option needs only when that
option is given: `os` and `sys` always, `resource` for a limit, `ctypes` for `--user`, `_socket` (not `socket`,
which imports far more) for `--relay`. POLAR_RELAY_TOKEN never reaches ARGV's environment.
"""

import os
import sys

_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
ENV_PREFIX = "POLAR_ENV_"
RELAY_TOKEN = "POLAR_RELAY_TOKEN"  # the session's token, for --relay (taken out of ARGV's environment)
HANDOFF_S = 5.0  # how long the proxy may take to answer the handoff
_LIMITS = {"--nproc": "RLIMIT_NPROC", "--fsize": "RLIMIT_FSIZE", "--as": "RLIMIT_AS"}


def main(argv):
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1 :]
    relay = user = None
    token = os.environ.pop(RELAY_TOKEN, "")
    env = dict(os.environ)
    if "--prefixed-env" in opts:
        opts.remove("--prefixed-env")
        env = {k[len(ENV_PREFIX) :]: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for flag, value in zip(opts[::2], opts[1::2]):
        if flag in _LIMITS:
            import resource

            limit = getattr(resource, _LIMITS[flag])
            resource.setrlimit(limit, (int(value), int(value)))
        elif flag == "--user":
            user = tuple(int(n) for n in value.split(":"))
        elif flag == "--relay":
            port, path = value.split("=", 1)
            relay = (int(port), path)
    if user is not None:
        _drop_to(*user)
    if relay is not None:
        _hand_off(*relay, token)
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


def _hand_off(port, path, token):
    import _socket

    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError:  # apptainer: the proxy serves an earlier exec's listener in this namespace
        listener.close()
        return
    listener.listen(128)
    link = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    link.settimeout(HANDOFF_S)
    try:
        link.connect(path)
        fd = listener.fileno().to_bytes(4, sys.byteorder)
        link.sendmsg([token.encode()], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fd)])
        answer = link.recv(512).decode(errors="replace") or "it closed the connection unanswered"
    except OSError as e:
        answer = "cannot reach it: %s" % (e.strerror or e)
    if answer != "ok":
        sys.stderr.write("inside.py: the proxy did not take this sandbox's listener: %s\n" % answer)
        os._exit(126)
    link.close()
    listener.close()


if __name__ == "__main__":
    main(sys.argv[1:])
