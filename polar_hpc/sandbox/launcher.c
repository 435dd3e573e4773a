/* The compiled launcher: inside.py's work without Python, for bwrap on the host's root (launcher.py
 * compiles it once per gateway with the host's `cc`).
 *
 *     launcher [--join FILE]... [--nproc N] [--fsize BYTES] [--as BYTES] [--user UID:GID]
 *              [--relay PORT=SOCKET] [--prefixed-env] -- ARGV...
 *
 * In this order: writes 0 to each FILE (a cgroup's `tasks`/`cgroup.procs`: this process and all
 * it starts join that cgroup; run on the host before bwrap); sets the limits (hard and soft);
 * ignores SIGXFSZ (as Python does: a write past the file size bound fails with EFBIG); drops to
 * UID:GID for good (no supplementary groups, every capability set emptied, no_new_privs; exit 126
 * unless /proc/self/status then shows exactly that); hands the proxy a listener on 127.0.0.1:PORT
 * with the token in POLAR_RELAY_TOKEN and waits for its "ok" (exit 126 with its reason otherwise;
 * a port already taken is left to the listener on it); then execs ARGV (found on PATH) with this
 * environment, or with only its POLAR_ENV_* variables, prefix removed (`--prefixed-env`), never
 * POLAR_RELAY_TOKEN. Options and messages as inside.py's (its docstring says why each exists). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define PREFIX "POLAR_ENV_"
#define TOKEN "POLAR_RELAY_TOKEN"
#define HANDOFF_S 5 /* how long the proxy may take to answer the handoff */

extern char **environ;

static void fail(const char *what) {
    fprintf(stderr, "launcher: %s\n", what);
    exit(126);
}

static void join(const char *file) {
    FILE *f = fopen(file, "w");
    if (f == NULL || fputs("0", f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "launcher: cannot join the cgroup %s: %s\n", file, strerror(errno));
        exit(126);
    }
}

static void limit(int resource, const char *value) {
    struct rlimit r;
    r.rlim_cur = r.rlim_max = strtoull(value, NULL, 10);
    if (setrlimit(resource, &r) != 0) fail("cannot set a limit");
}

static void drop_to(unsigned uid, unsigned gid) {
    for (int cap = 0; prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0; cap++) {
    }
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    int ok = setgroups(0, NULL) == 0 && setresgid(gid, gid, gid) == 0 && setresuid(uid, uid, uid) == 0;
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[2] = {{0}};
    ok = ok && syscall(SYS_capset, &header, none) == 0; /* the inheritable set too */
    char status[8192], line[96];
    FILE *f = fopen("/proc/self/status", "r");
    size_t n = f ? fread(status, 1, sizeof status - 1, f) : 0;
    if (f) fclose(f);
    status[n] = 0;
    const char *want[] = {"Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs"};
    for (size_t k = 0; ok && k < sizeof want / sizeof *want; k++) {
        unsigned id = k == 0 ? uid : gid;
        if (k < 2) snprintf(line, sizeof line, "\n%s:\t%u\t%u\t%u\t%u\n", want[k], id, id, id, id);
        else snprintf(line, sizeof line, "\n%s:\t%s\n", want[k], k == 7 ? "1" : "0000000000000000");
        ok = strstr(status, line) != NULL;
    }
    if (!ok) {
        fprintf(stderr, "launcher: could not drop to uid %u gid %u with no capabilities\n", uid, gid);
        exit(126);
    }
}

static void refused(const char *why) {
    fprintf(stderr, "launcher: the proxy did not take this sandbox's listener: %s\n", why);
    exit(126);
}

static void hand_off(const char *value, const char *token) {
    const char *eq = strchr(value, '=');
    if (eq == NULL) fail("--relay PORT=SOCKET");
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons(atoi(value))};
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) fail("cannot make the relay's listener");
    if (bind(listener, (struct sockaddr *)&at, sizeof at) != 0) { /* apptainer: an earlier exec's */
        close(listener);
        return;
    }
    if (listen(listener, 128) != 0) fail("cannot listen on the relay's port");
    struct sockaddr_un path = {.sun_family = AF_UNIX};
    if (strlen(eq + 1) >= sizeof path.sun_path) refused("cannot reach it: its socket's path is too long");
    strcpy(path.sun_path, eq + 1);
    int link = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct timeval wait = {.tv_sec = HANDOFF_S};
    setsockopt(link, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    setsockopt(link, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof wait);
    char cmsg[CMSG_SPACE(sizeof(int))] = {0}, answer[513], why[600];
    struct iovec iov = {.iov_base = (void *)token, .iov_len = strlen(token)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cmsg, .msg_controllen = sizeof cmsg};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &listener, sizeof(int));
    ssize_t got = -1;
    if (connect(link, (struct sockaddr *)&path, sizeof path) == 0 && sendmsg(link, &msg, 0) >= 0)
        got = recv(link, answer, sizeof answer - 1, 0);
    if (got < 0) {
        snprintf(why, sizeof why, "cannot reach it: %s", strerror(errno == EAGAIN ? ETIMEDOUT : errno));
        refused(why);
    }
    answer[got] = 0;
    if (got == 0) refused("it closed the connection unanswered");
    if (strcmp(answer, "ok") != 0) refused(answer);
    close(link);
    close(listener);
}

int main(int argc, char **argv) {
    const char *relay = NULL, *user = NULL;
    int prefixed = 0, i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--prefixed-env") == 0) {
            prefixed = 1;
            continue;
        }
        if (i + 1 >= argc) fail("an option without its value");
        const char *flag = argv[i], *value = argv[++i];
        if (strcmp(flag, "--join") == 0) join(value);
        else if (strcmp(flag, "--nproc") == 0) limit(RLIMIT_NPROC, value);
        else if (strcmp(flag, "--fsize") == 0) {
            limit(RLIMIT_FSIZE, value);
            signal(SIGXFSZ, SIG_IGN);
        }
        else if (strcmp(flag, "--as") == 0) limit(RLIMIT_AS, value);
        else if (strcmp(flag, "--user") == 0) user = value;
        else if (strcmp(flag, "--relay") == 0) relay = value;
        else fail("unknown option");
    }
    if (i + 1 >= argc) fail("no command after --");
    if (user != NULL) {
        unsigned uid, gid;
        if (sscanf(user, "%u:%u", &uid, &gid) != 2) fail("--user UID:GID");
        drop_to(uid, gid);
    }
    const char *token = getenv(TOKEN);
    if (relay != NULL) hand_off(relay, token ? token : "");
    size_t n = 0, plen = strlen(PREFIX), tlen = strlen(TOKEN);
    while (environ[n]) n++;
    char **env = calloc(n + 1, sizeof *env), **out = env;
    for (char **e = environ; *e; e++) {
        if (prefixed ? strncmp(*e, PREFIX, plen) == 0 : !(relay && strncmp(*e, TOKEN, tlen) == 0 && (*e)[tlen] == '='))
            *out++ = *e + (prefixed ? plen : 0);
    }
    execvpe(argv[i + 1], argv + i + 1, env); /* PATH: this process's, as a shell's exec */
    fprintf(stderr, "launcher: cannot run %s: %s\n", argv[i + 1], strerror(errno));
    return 127;
}
