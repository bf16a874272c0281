/*
 * tsbox-ctr: the per-container holder.
 *
 * One holder per container (create mode) and one per exec'd process while it runs (exec
 * mode). It keeps, outside of tsbox, everything a container needs for as long as it runs:
 * runc's children (it is their subreaper, so only it can read the real exit status), the
 * container's FIFO ends, the pty master and its relay, and the exit status, written down
 * as tsbox-shim writes a sandbox's: the records, the answer, the control socket and the
 * unmount of the rootfs are the supervision library's (supervise.h), which both programs
 * share. A restart or a crash of tsbox ends no container and loses no exit code.
 *
 * Usage:
 *   tsbox-ctr create --dir DIR --bundle B --id ID --root R [--stdin P] [--stdout P]
 *                    [--stderr P] [--terminal] [--systemd-cgroup] [--kill-all]
 *                    [--kill-all-v2 MOUNT | --kill-all-freezer MOUNT] [--direct-start]
 *                    [--unmount-rootfs]
 *                    [--runc PATH] [--notify FILE]
 *   tsbox-ctr exec   --dir DIR --id ID --root R --process P.json [--stdin P] [--stdout P]
 *                    [--stderr P] [--terminal] [--systemd-cgroup] [--runc PATH] [--notify FILE]
 * DIR (absolute, the holder's own) receives: runc.log (runc's JSON log), pid, exit, ctl
 * (the control socket) and, with a terminal, console.sock while runc hands over the pty.
 * --kill-all: the container does not have a pid namespace of its own, so when its init ends
 * its other processes are not ended by the kernel: the holder SIGKILLs them all (runc kill
 * --all ID KILL) before it writes the exit. tsbox decides it from the bundle's config.json.
 * --kill-all-v2 MOUNT / --kill-all-freezer MOUNT: the same, through the container's cgroup
 * without runc (cgroup.kill on v2; freeze, SIGKILL each, thaw on v1), MOUNT being where that
 * hierarchy is mounted; runc kill --all still where that cannot be done.
 * --unmount-rootfs: when the init ends (after kill-all, before the exit is written), whatever is
 * mounted at and below BUNDLE/rootfs is unmounted (plain unmounts only; what stays busy is left
 * to tsbox's Delete).
 *
 * Protocol with tsbox, on the holder's stdout (a pipe), one line, then EOF:
 *   "ok <holder-pid> <pid>\n"   the container is created (create) or the process runs (exec)
 *   "error <message>\n"         nothing is left running; the holder exits 1. <message> is
 *                               runc's own last error when runc failed.
 * First of all the holder writes DIR/holder, "<holder-pid> <holder-start>\n": a tsbox restarted
 * before the answer finds the holder still at work by it.
 * Before answering ok the holder writes DIR/pid:
 *   "<holder-pid> <holder-start> <pid> <pid-start>\n"
 * (start times are field 22 of /proc/PID/stat): written by the one process that knows all
 * four, before anyone is told, so there is no moment in which a crash of tsbox leaves a
 * running holder that no file names with the start time that makes its pid trustworthy.
 *
 * Control socket DIR/ctl, one line per request, one line per answer:
 *   "start"          runc start (create mode; again once started: "ok"); with --direct-start
 *                    (no poststart hooks in the bundle) what runc start does, without runc:
 *                    the exec FIFO opened, read to its end, removed
 *   "resize W H"     TIOCSWINSZ on the pty master ("ok" without a terminal, as the runc shim)
 *   "kill N"         signal N to the process (as runc kill without --all, but no runc and no
 *                    race with its reaping): "ok", or "gone" once it has been reaped
 *   "closeio"        closes the holder's stdin writer: the process sees EOF once every other
 *                    writer has closed too
 *   "wait"           no answer until the process has exited and the exit file is written:
 *                    then "exited <status> <seconds> <nanoseconds>". A connection that closes
 *                    without it means the holder died. Before it, "oom <count>" each time the
 *                    OOM watch sees the container's OOM-kill count grow (and at once, when it
 *                    has grown since the watch began).
 *   "oom FILE"       watches the container's cgroup for OOM kills while the process runs:
 *                    FILE is its memory.events (cgroup v2: inotify) or memory.oom_control (v1:
 *                    an eventfd registered in cgroup.event_control). "ok <count>", the count of
 *                    OOM kills so far; once watched, the same again answers the same.
 * Answers: "ok", "ok <pid>" or "error <message>".
 *
 * When the process ends: (kill-all,) DIR/exit "<status> <seconds> <nanoseconds>" written
 * atomically and durably, the notify file touched, waiters told, the tty relay drained (until
 * the pty reports that every slave end is closed, at most DRAIN_MS), the FIFO holders closed,
 * exit. The holder's exit status: 0 exit file written, 2 not written, 3 written but the
 * notify file not.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "holder.h"
#include "supervise.h"

#define MAX_CLIENTS 32
#define RELAY_BUF 32768
/* How long a pty may keep output coming after the process ended: a process that escaped
   the container's end (it cannot in a pid namespace of its own) may hold the slave forever. */
#define DRAIN_MS 5000

static const char *dir;
/* Set once the container or exec exists: a failed start must remove it. */
static const char *runc_bin = "runc";
static const char *root, *id;
static int systemd_cgroup = 0;
/* --direct-start: the bundle has no poststart hooks; start opens runc's exec FIFO itself. */
static int direct_start = 0;
/* --unmount-rootfs: the bundle's rootfs is unmounted when the init ends (see the exit). */
static int unmount_rootfs = 0;
static const char *bundle_dir = NULL;
static int created = 0;
static int exec_mode = 0;
static pid_t proc_pid = 0;

static void cleanup_created(void);

static void path_in_dir(char *out, size_t size, const char *name) {
  if (sv_path(out, size, dir, name) < 0) sv_fail("path %s/%s is too long", dir, name);
}

/* ---- runc ---------------------------------------------------------------------------- */

/*
 * The message of the last "error" entry of runc's JSON log (runc writes one object per line:
 * {"level":"error","msg":"...","time":"..."}), unescaped into `out`; 0 when there is none.
 */
static int last_runc_error(char *out, size_t size) {
  char path[4096];
  path_in_dir(path, sizeof path, "runc.log");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  static char log[65536] SV_OWN_PAGES; /* read only when runc failed */
  struct stat st;
  if (fstat(fd, &st) < 0) {
    (void)close(fd); /* no log to read: the caller says runc failed without one */
    return 0;
  }
  off_t from = st.st_size > (off_t)sizeof log - 1 ? st.st_size - (off_t)sizeof log + 1 : 0;
  ssize_t n;
  do n = pread(fd, log, sizeof log - 1, from);
  while (n < 0 && errno == EINTR);
  if (close(fd) < 0 || n <= 0) return 0;
  log[n] = '\0';
  const char *found = NULL;
  for (char *line = log; line != NULL && *line != '\0';) {
    char *end = strchr(line, '\n');
    if (end != NULL) *end = '\0';
    if (strstr(line, "\"level\":\"error\"") != NULL && strstr(line, "\"msg\":\"") != NULL) found = line;
    line = end == NULL ? NULL : end + 1;
  }
  if (found == NULL) return 0;
  const char *s = strstr(found, "\"msg\":\"") + 7;
  size_t o = 0;
  for (; *s != '\0' && *s != '"' && o + 1 < size; s++) {
    char c = *s;
    if (c == '\\' && s[1] != '\0') {
      s++;
      switch (*s) {
        case 'n': case 'r': case 't': c = ' '; break;
        case 'u':
          /* Non-ASCII and control characters: '?' keeps the one-line answer one line. */
          if (strlen(s) >= 5) {
            char hex[5] = {s[1], s[2], s[3], s[4], '\0'};
            long v = strtol(hex, NULL, 16);
            c = v >= 0x20 && v < 0x7f ? (char)v : '?';
            s += 4;
          }
          break;
        default: c = *s; break; /* \" \\ \/ */
      }
    }
    out[o++] = c;
  }
  out[o] = '\0';
  return o > 0;
}

/*
 * Runs `runc --root R --log DIR/runc.log --log-format json [--systemd-cgroup] ARGS...` with
 * stdin/stdout/stderr as given (-1: /dev/null) and waits for it. Returns its exit code, or
 * -1 with `why` filled when it could not be run or was killed.
 */
static int run_runc(const char *const *args, int in, int out, int err, char *why, size_t whysize) {
  const char *argv[32];
  char logpath[4096];
  path_in_dir(logpath, sizeof logpath, "runc.log");
  int n = 0;
  argv[n++] = runc_bin;
  argv[n++] = "--root";
  argv[n++] = root;
  argv[n++] = "--log";
  argv[n++] = logpath;
  argv[n++] = "--log-format";
  argv[n++] = "json";
  if (systemd_cgroup) argv[n++] = "--systemd-cgroup";
  for (; *args != NULL && n < 31; args++) argv[n++] = *args;
  argv[n] = NULL;

  int errpipe[2];
  if (pipe2(errpipe, O_CLOEXEC) < 0) {
    snprintf(why, whysize, "pipe: %s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, whysize, "fork: %s", strerror(errno));
    (void)close(errpipe[0]); /* the fork failure is what is reported */
    (void)close(errpipe[1]);
    return -1;
  }
  if (pid == 0) {
    char msg[512];
    /* A holder that dies mid-call must not leave a half-made container behind. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) {
      snprintf(msg, sizeof msg, "prctl PR_SET_PDEATHSIG: %s", strerror(errno));
      goto child_fail;
    }
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0) {
      snprintf(msg, sizeof msg, "open /dev/null: %s", strerror(errno));
      goto child_fail;
    }
    /* dup2 clears close-on-exec on the copies: 0, 1 and 2 survive the exec. Moved above 2
       first, so that a source that is itself 0..2 is not overwritten before it is copied. */
    int fds[3] = {in < 0 ? devnull : in, out < 0 ? devnull : out, err < 0 ? devnull : err};
    for (int i = 0; i < 3; i++) {
      if (fds[i] <= 2 && (fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3)) < 0) {
        snprintf(msg, sizeof msg, "dup: %s", strerror(errno));
        goto child_fail;
      }
    }
    for (int i = 0; i < 3; i++) {
      if (dup2(fds[i], i) < 0) {
        snprintf(msg, sizeof msg, "dup2 to fd %d: %s", i, strerror(errno));
        goto child_fail;
      }
    }
    sigset_t none;
    if (sigemptyset(&none) < 0 || sigprocmask(SIG_SETMASK, &none, NULL) < 0) {
      snprintf(msg, sizeof msg, "sigprocmask: %s", strerror(errno));
      goto child_fail;
    }
    const int sigs[] = {SIGHUP, SIGINT, SIGTERM, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
      if (signal(sigs[i], SIG_DFL) == SIG_ERR) {
        snprintf(msg, sizeof msg, "signal: %s", strerror(errno));
        goto child_fail;
      }
    }
    execvp(runc_bin, (char *const *)argv);
    snprintf(msg, sizeof msg, "run %s: %s", runc_bin, strerror(errno));
  child_fail:
    if (write(errpipe[1], msg, strlen(msg)) < 0) { /* the holder is gone: nobody to tell */ }
    _exit(127);
  }
  if (close(errpipe[1]) < 0) {
    snprintf(why, whysize, "close: %s", strerror(errno));
    (void)close(errpipe[0]); /* the close failure is what is reported */
    return -1;
  }
  char msg[512];
  ssize_t r;
  do r = read(errpipe[0], msg, sizeof msg - 1);
  while (r < 0 && errno == EINTR);
  int saved = errno;
  if (close(errpipe[0]) < 0 && r >= 0) saved = errno, r = -1;
  int status;
  pid_t w;
  do w = waitpid(pid, &status, 0);
  while (w < 0 && errno == EINTR);
  if (r < 0) {
    snprintf(why, whysize, "read from runc's start: %s", strerror(saved));
    return -1;
  }
  if (r > 0) {
    msg[r] = '\0';
    snprintf(why, whysize, "%s", msg);
    return -1;
  }
  if (w < 0) {
    snprintf(why, whysize, "wait for runc: %s", strerror(errno));
    return -1;
  }
  if (WIFSIGNALED(status)) {
    snprintf(why, whysize, "runc %s was killed by signal %d", args[0], WTERMSIG(status));
    return -1;
  }
  return WEXITSTATUS(status);
}

/* Runs runc; 0 on success, else -1 with runc's own last error (or why it failed) in `why`. */
static int runc_ok(const char *const *args, int in, int out, int err, char *why, size_t whysize) {
  int code = run_runc(args, in, out, err, why, whysize);
  if (code == 0) return 0;
  if (code > 0 && !last_runc_error(why, whysize)) snprintf(why, whysize, "runc %s exited with status %d", args[0], code);
  return -1;
}

/* After a failed start: the container runc made (if any) goes, so nothing is left running. */
static void cleanup_created(void) {
  if (!created) return;
  created = 0;
  char why[512];
  if (!exec_mode) {
    const char *args[] = {"delete", "--force", id, NULL};
    if (run_runc(args, -1, -1, -1, why, sizeof why) != 0 && proc_pid > 0 && kill(proc_pid, SIGKILL) < 0 && errno != ESRCH) {
      /* both ways failed: the answer's message says the start failed, nothing more to do */
    }
  } else if (proc_pid > 0 && kill(proc_pid, SIGKILL) < 0 && errno != ESRCH) {
    /* already gone, or not ours to kill: nothing more to do */
  }
}

/* ---- IO ------------------------------------------------------------------------------ */

/*
 * The container's end of a FIFO CRI made, opened the way that never blocks: first O_RDONLY |
 * O_NONBLOCK (always immediate), its type checked (a caller-supplied path must not hang the
 * start), then the same inode again through /proc/self/fd with `flags`: an O_WRONLY open
 * succeeds at once since a reader (ours) exists. Both ends have close-on-exec; the second
 * is a blocking open file description of its own. Returns the first (the reader).
 */
static int open_fifo(const char *path, int flags, int *second) {
  int r = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (r < 0) sv_fail("open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(r, &st) < 0) sv_fail("stat %s: %s", path, strerror(errno));
  if (!S_ISFIFO(st.st_mode)) sv_fail("%s is not a FIFO", path);
  char self[64];
  snprintf(self, sizeof self, "/proc/self/fd/%d", r);
  *second = open(self, flags | O_CLOEXEC | O_NOCTTY);
  if (*second < 0) sv_fail("open %s again: %s", path, strerror(errno));
  return r;
}

static int set_nonblock(int fd, int on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

/* Listens on DIR/NAME (sv_listen: mode 0600, a stale socket replaced); fails the start when it cannot. */
static int listen_at(const char *name, char *path, size_t pathsize, struct sv_bound *bound) {
  path_in_dir(path, pathsize, name);
  char why[PATH_MAX + 128];
  int fd = sv_listen(path, 16, bound, why, sizeof why);
  if (fd < 0) sv_fail("%s", why);
  return fd;
}

/* The pty master runc sent over the console socket (SCM_RIGHTS), after runc has exited. */
static int receive_master(int lfd, struct sv_bound *bound) {
  const char *path = bound->path;
  int conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (conn < 0) sv_fail("runc sent no terminal on %s: %s", path, strerror(errno));
  char data[256];
  struct iovec iov = {data, sizeof data};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } control;
  struct msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.buf;
  msg.msg_controllen = sizeof control.buf;
  ssize_t n;
  do n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) sv_fail("receive the terminal on %s: %s", path, strerror(errno));
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  if (c == NULL || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int)))
    sv_fail("runc sent no terminal on %s", path);
  int master;
  memcpy(&master, CMSG_DATA(c), sizeof master);
  if (close(conn) < 0) sv_fail("close the console connection: %s", strerror(errno));
  if (close(lfd) < 0) sv_fail("close %s: %s", path, strerror(errno));
  if (sv_unlink_bound(bound, NULL) < 0) sv_fail("remove %s: %s", path, strerror(errno));
  if (set_nonblock(master, 1) < 0) sv_fail("make the terminal non-blocking: %s", strerror(errno));
  return master;
}

/* ---- the running holder ---------------------------------------------------------------- */

static void close_fd(int *fd);

/* True once the process is a zombie or gone: it can no longer open its end of a FIFO. */
static int process_dead(pid_t pid) {
  char buf[1024];
  /* Gone (ENOENT, ESRCH) is dead; any other failure to look says nothing: not dead yet. */
  if (sv_read_stat(pid, buf, sizeof buf) < 0) return errno == ENOENT || errno == ESRCH;
  const char *paren = strrchr(buf, ')');
  return paren != NULL && paren[1] == ' ' && paren[2] == 'Z';
}

/*
 * What `runc start` does to a created container (runc 1.1, libcontainer's exec()), without
 * running runc: open the container's exec FIFO for reading, which lets its init (blocked
 * opening the other end) write its byte and go on to exec the process; read until that end
 * closes at the exec; remove the FIFO, after which runc reports the container running. As runc,
 * the init is looked at every 100 ms: one that died never opens its end. Only for bundles
 * without poststart hooks (tsbox decides): runc start runs nothing else. 0, or -1 with `why`.
 */
static int open_exec_fifo(char *why, size_t whysize) {
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/%s/exec.fifo", root, id) >= sizeof path) {
    snprintf(why, whysize, "the exec FIFO's path is too long");
    return -1;
  }
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, whysize, "open %.300s: %s", path, strerror(errno));
    return -1;
  }
  size_t got = 0;
  int dead_checks = 0;
  for (;;) {
    /* POLLIN once the init wrote; POLLHUP once its end closed (never before it opened it). */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, 100);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      snprintf(why, whysize, "poll %.300s: %s", path, strerror(errno));
      close_fd(&fd);
      return -1;
    }
    if (r == 0) {
      if (!process_dead(proc_pid)) continue;
      /* Dead: whatever it wrote before is still to be read; one more look, then give up. */
      if (dead_checks++ > 0) break;
      continue;
    }
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      got += (size_t)n;
      continue;
    }
    if (n == 0) break; /* its end closed: the init has exec'd (or died) */
    if (errno == EAGAIN || errno == EINTR) continue;
    snprintf(why, whysize, "read %.300s: %s", path, strerror(errno));
    close_fd(&fd);
    return -1;
  }
  close_fd(&fd);
  if (got == 0) {
    snprintf(why, whysize, "the container's process is already dead");
    return -1;
  }
  if (unlink(path) < 0 && errno != ENOENT) {
    snprintf(why, whysize, "remove %.300s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* A request line with a path in it. */
#define CLIENT_LINE 4352

struct client {
  int fd;
  int waiting;
  size_t len;
  char *buf; /* CLIENT_LINE bytes of client_lines, the slot's own */
};

static struct client clients[MAX_CLIENTS];
/* Apart from the clients, so that a slot's line touches only the pages of the slots in use. */
static char client_lines[MAX_CLIENTS][CLIENT_LINE] SV_OWN_PAGES;
static int nclients = 0;
static int ctl_fd = -1;
/* <dir>/ctl: a unix socket's address. */
static char ctl_path[sizeof ((struct sockaddr_un *)0)->sun_path];
static struct sv_bound ctl_bound;
static int started = 0;
static int exited = 0;
static char exit_line[96];

/* Holders: stdin writer (till closeio), stdout/stderr readers (till exit). */
static int stdin_hold = -1, stdout_hold = -1, stderr_hold = -1;
/* The tty relay: pty master, stdin FIFO (read), stdout FIFO (write). */
static int master = -1, relay_in = -1, relay_out = -1;
/* The terminal relay's buffers: touched only for a container with a terminal. */
static char out_buf[RELAY_BUF] SV_OWN_PAGES, in_buf[RELAY_BUF] SV_OWN_PAGES;
static size_t out_len = 0, in_len = 0;
static int master_done = 0;

static void close_fd(int *fd) {
  if (*fd >= 0 && close(*fd) < 0) { /* a close that fails still releases the descriptor */ }
  *fd = -1;
}

static void drop_client(int i) {
  close_fd(&clients[i].fd);
  /* The last client takes the slot; the slot's line goes to the one freed. */
  char *line = clients[i].buf;
  clients[i] = clients[--nclients];
  clients[nclients].buf = line;
}

/* Best effort: a client that is gone or not reading loses its answer, nobody else does. */
static void answer(struct client *c, const char *fmt, ...) {
  char line[600];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  if (send(c->fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* the client went away */ }
}

#define REPLY(...) \
  do { \
    answer(c, __VA_ARGS__); \
    return; \
  } while (0)

/* ---- the OOM watch --------------------------------------------------------------------- */

static int oom_fd = -1;
/* v1: the eventfd fires as the cgroup meets its limit, before the kill is counted, and never
   after: each firing is counted as one. v2: memory.events changes again once the kill is. */
static int oom_v1 = 0;
static char oom_file[4096] SV_OWN_PAGES;
/* The count when the watch began, and now. */
static long long oom_base = 0, oom_kills = 0;

/* The "oom_kill N" field of a cgroup's memory.events or memory.oom_control; -1 if unreadable. */
static long long read_oom_kills(const char *file) {
  char buf[2048];
  if (sv_read_file(file, buf, sizeof buf) < 0) return -1;
  for (const char *at = buf; at != NULL && *at != '\0'; at = strchr(at, '\n'), at = at == NULL ? NULL : at + 1) {
    if (strncmp(at, "oom_kill ", 9) == 0) return strtoll(at + 9, NULL, 10);
  }
  return 0;
}

/* Starts the watch on FILE (see the protocol); 0, or -1 with why. */
static int watch_oom(const char *file, char *why, size_t whysize) {
  const char *base = strrchr(file, '/');
  if (base == NULL || file[0] != '/' || strlen(file) >= sizeof oom_file) {
    snprintf(why, whysize, "%.200s is not a cgroup file's absolute path", file);
    return -1;
  }
  int fd = -1;
  if (strcmp(base + 1, "memory.events") == 0) {
    fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) {
      snprintf(why, whysize, "inotify_init1: %s", strerror(errno));
      return -1;
    }
    if (inotify_add_watch(fd, file, IN_MODIFY) < 0) {
      snprintf(why, whysize, "watch %.300s: %s", file, strerror(errno));
      close_fd(&fd);
      return -1;
    }
  } else if (strcmp(base + 1, "memory.oom_control") == 0) {
    char control[4200], line[64];
    snprintf(control, sizeof control, "%.*s/cgroup.event_control", (int)(base - file), file);
    fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
      snprintf(why, whysize, "eventfd: %s", strerror(errno));
      return -1;
    }
    /* The kernel keeps the registration until the eventfd closes or the cgroup goes. */
    int ofd = open(file, O_RDONLY | O_CLOEXEC);
    int cfd = ofd < 0 ? -1 : open(control, O_WRONLY | O_CLOEXEC);
    int n = snprintf(line, sizeof line, "%d %d", fd, ofd);
    if (ofd < 0 || cfd < 0 || sv_write_all(cfd, line, (size_t)n) < 0) {
      snprintf(why, whysize, "register for OOM events in %.300s: %s", control, strerror(errno));
      close_fd(&cfd);
      close_fd(&ofd);
      close_fd(&fd);
      return -1;
    }
    int failed = close(cfd) < 0;
    int saved = errno;
    close_fd(&ofd);
    if (failed) {
      snprintf(why, whysize, "register for OOM events in %.300s: %s", control, strerror(saved));
      close_fd(&fd);
      return -1;
    }
  } else {
    snprintf(why, whysize, "%.300s is neither memory.events nor memory.oom_control", file);
    return -1;
  }
  long long kills = read_oom_kills(file);
  if (kills < 0) {
    snprintf(why, whysize, "read %.300s: %s", file, strerror(errno));
    close_fd(&fd);
    return -1;
  }
  strcpy(oom_file, file);
  oom_base = oom_kills = kills;
  oom_fd = fd;
  oom_v1 = strcmp(base + 1, "memory.oom_control") == 0;
  return 0;
}

/* The watch fired: drains it and tells the waiting clients when the count grew. */
static void oom_event(void) {
  char buf[4096] __attribute__((aligned(8)));
  long long fired = 0;
  ssize_t n;
  while ((n = read(oom_fd, buf, sizeof buf)) > 0) {
    if (oom_v1 && n == 8) fired += (long long)*(unsigned long long *)buf;
  }
  long long kills = read_oom_kills(oom_file);
  /* Unreadable: the cgroup is going with the container (v1 fires then too); its exit tells. */
  if (kills < 0) return;
  if (oom_v1) kills = oom_kills + fired;
  if (kills <= oom_kills) return;
  oom_kills = kills;
  for (int i = 0; i < nclients; i++) {
    if (clients[i].waiting) answer(&clients[i], "oom %lld", oom_kills);
  }
}

/* ---- kill-all through the cgroup ------------------------------------------------------ */

/* --kill-all-v2 MOUNT / --kill-all-freezer MOUNT: the container's processes are ended through
   its cgroup, as runc kill --all does, without running runc: MOUNT is where the cgroup2
   hierarchy (v2) or the freezer hierarchy (v1) is mounted; the container's path below it is
   read from its init's /proc/PID/cgroup once runc has made it. */
static const char *kill_mount = NULL;
static int kill_v1 = 0;
static char kill_dir[4096] SV_OWN_PAGES;

/* Sets kill_dir from PID's /proc/PID/cgroup; left empty (runc does the kill) when not found. */
static void locate_kill_cgroup(pid_t pid) {
  char file[64], buf[8192];
  snprintf(file, sizeof file, "/proc/%d/cgroup", (int)pid);
  if (sv_read_file(file, buf, sizeof buf) < 0) return;
  for (char *line = buf; line != NULL && *line != '\0';) {
    char *next = strchr(line, '\n');
    if (next != NULL) *next++ = '\0';
    char *c1 = strchr(line, ':');
    char *c2 = c1 == NULL ? NULL : strchr(c1 + 1, ':');
    if (c2 != NULL && c2[1] == '/') {
      *c2 = '\0';
      int match = 0;
      if (!kill_v1) {
        match = strcmp(line, "0:") == 0;
      } else {
        for (char *c = strtok(c1 + 1, ","); c != NULL && !match; c = strtok(NULL, ",")) match = strcmp(c, "freezer") == 0;
      }
      if (match) {
        int n = snprintf(kill_dir, sizeof kill_dir, "%s%s", kill_mount, c2 + 1);
        /* Not a cgroup there (a wrong mount): runc does the kill. */
        if (n < 0 || (size_t)n >= sizeof kill_dir || access(kill_dir, F_OK) < 0) kill_dir[0] = '\0';
        return;
      }
    }
    line = next;
  }
}

/* SIGKILL to every process of cgroup DIR and the cgroups below it (depth bounded). */
static void kill_procs_below(const char *cgdir, int depth) {
  char file[4200];
  snprintf(file, sizeof file, "%s/cgroup.procs", cgdir);
  FILE *f = fopen(file, "re");
  if (f != NULL) {
    int pid;
    while (fscanf(f, "%d", &pid) == 1) {
      if (pid > 0 && kill(pid, SIGKILL) < 0 && errno != ESRCH) { /* not ours to end: runc's kill would fail the same */ }
    }
    if (fclose(f) != 0) { /* read-only: nothing was lost */ }
  }
  if (depth == 0) return;
  DIR *d = opendir(cgdir);
  if (d == NULL) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
    char sub[4200];
    int n = snprintf(sub, sizeof sub, "%s/%s", cgdir, e->d_name);
    if (n > 0 && (size_t)n < sizeof sub) kill_procs_below(sub, depth - 1);
  }
  if (closedir(d) < 0) { /* read-only: nothing was lost */ }
}

/* Ends every process of the container's cgroup: v2 cgroup.kill; v1 freeze, SIGKILL each, thaw
   (a frozen process dies once thawed). 0 when done or the cgroup is gone already; -1 when
   runc must do it (no cgroup.kill before Linux 5.14, no freezer). */
static int kill_cgroup(void) {
  if (kill_dir[0] == '\0') return -1;
  char file[4200], state[64];
  if (!kill_v1) {
    snprintf(file, sizeof file, "%s/cgroup.kill", kill_dir);
    if (sv_write_text(file, "1") == 0) return 0;
    return errno == ENOENT && access(kill_dir, F_OK) < 0 && errno == ENOENT ? 0 : -1;
  }
  snprintf(file, sizeof file, "%s/freezer.state", kill_dir);
  if (sv_write_text(file, "FROZEN") < 0) return errno == ENOENT && access(kill_dir, F_OK) < 0 && errno == ENOENT ? 0 : -1;
  /* FREEZING until every task is frozen; one that never is (bounded: 2 s) is killed all the same. */
  for (int i = 0; i < 2000; i++) {
    if (sv_read_file(file, state, sizeof state) < 0 || strncmp(state, "FREEZING", 8) != 0) break;
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  kill_procs_below(kill_dir, 8);
  return sv_write_text(file, "THAWED") < 0 ? -1 : 0;
}

static void handle_request(struct client *c, char *line) {
  char why[512];
  unsigned w, h;
  if (strcmp(line, "start") == 0) {
    if (exec_mode) REPLY("error an exec'd process is started by its holder");
    if (exited) REPLY("error the container's process has exited");
    if (started) REPLY("ok %d", (int)proc_pid);
    if (direct_start) {
      if (open_exec_fifo(why, sizeof why) < 0) REPLY("error %s", why);
    } else {
      const char *args[] = {"start", id, NULL};
      if (runc_ok(args, -1, -1, -1, why, sizeof why) < 0) REPLY("error %s", why);
    }
    started = 1;
    REPLY("ok %d", (int)proc_pid);
  }
  if (sscanf(line, "resize %u %u", &w, &h) == 2) {
    if (master < 0) REPLY("ok");
    struct winsize ws = {.ws_row = (unsigned short)h, .ws_col = (unsigned short)w};
    if (ioctl(master, TIOCSWINSZ, &ws) < 0) REPLY("error resize the terminal: %s", strerror(errno));
    REPLY("ok");
  }
  int sig;
  char extra;
  if (sscanf(line, "kill %d%c", &sig, &extra) == 1) {
    if (sig <= 0 || sig > 64) REPLY("error %d is not a signal number", sig);
    /* Reaped (or never made): the pid may be another process's now. */
    if (exited || proc_pid <= 0) REPLY("gone");
    if (kill(proc_pid, sig) < 0) REPLY("error kill %d: %s", (int)proc_pid, strerror(errno));
    REPLY("ok");
  }
  if (strcmp(line, "closeio") == 0) {
    close_fd(&stdin_hold);
    REPLY("ok");
  }
  if (strncmp(line, "oom ", 4) == 0) {
    if (oom_fd < 0 && watch_oom(line + 4, why, sizeof why) < 0) REPLY("error %s", why);
    if (strcmp(line + 4, oom_file) != 0) REPLY("error already watching %.300s", oom_file);
    REPLY("ok %lld", oom_kills);
  }
  if (strcmp(line, "wait") == 0) {
    /* A waiter that comes later (a restarted tsbox) hears of the kills since the watch began. */
    if (oom_kills > oom_base) answer(c, "oom %lld", oom_kills);
    if (exited) REPLY("exited %s", exit_line);
    c->waiting = 1;
    return;
  }
  answer(c, "error unknown request: %.64s", line);
}

/* Reads what a client sent; handles each whole line. Returns 0 when the client is done. */
static int serve_client(struct client *c) {
  ssize_t n = recv(c->fd, c->buf + c->len, CLIENT_LINE - 1 - c->len, MSG_DONTWAIT);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  if (n == 0) return 0;
  c->len += (size_t)n;
  for (;;) {
    char *nl = memchr(c->buf, '\n', c->len);
    if (nl == NULL) break;
    *nl = '\0';
    handle_request(c, c->buf);
    size_t used = (size_t)(nl - c->buf) + 1;
    memmove(c->buf, nl + 1, c->len - used);
    c->len -= used;
  }
  return c->len < CLIENT_LINE - 1; /* a line too long for any request: drop the client */
}

static void accept_clients(void) {
  for (;;) {
    int fd = accept4(ctl_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return; /* EAGAIN: none left; any other error: the next poll tries again */
    if (nclients == MAX_CLIENTS) {
      close_fd(&fd);
      continue;
    }
    char *line = clients[nclients].buf != NULL ? clients[nclients].buf : client_lines[nclients];
    clients[nclients++] = (struct client){.fd = fd, .waiting = 0, .len = 0, .buf = line};
  }
}

/* One step of the tty relay in each direction that poll said is ready. */
static void relay(short master_ev, short in_ev, short out_ev) {
  if ((master_ev & (POLLIN | POLLHUP | POLLERR)) && out_len == 0 && !master_done) {
    ssize_t n = read(master, out_buf, sizeof out_buf);
    if (n > 0) out_len = relay_out >= 0 ? (size_t)n : 0; /* no stdout: the output is dropped */
    else if (n == 0 || (errno != EAGAIN && errno != EINTR)) master_done = 1; /* EIO: every slave end is closed */
  }
  if (out_len > 0 && (out_ev & POLLOUT)) {
    ssize_t n = write(relay_out, out_buf, out_len);
    if (n > 0) {
      memmove(out_buf, out_buf + n, out_len - (size_t)n);
      out_len -= (size_t)n;
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      out_len = 0; /* EPIPE cannot happen while we hold a reader; any other error drops it */
    }
  }
  if (relay_in >= 0 && (in_ev & (POLLIN | POLLHUP | POLLERR)) && in_len == 0) {
    ssize_t n = read(relay_in, in_buf, sizeof in_buf);
    if (n > 0) in_len = (size_t)n;
    else if (n == 0 || (errno != EAGAIN && errno != EINTR)) close_fd(&relay_in); /* every writer closed */
  }
  if (in_len > 0 && (master_ev & POLLOUT)) {
    ssize_t n = write(master, in_buf, in_len);
    if (n > 0) {
      memmove(in_buf, in_buf + n, in_len - (size_t)n);
      in_len -= (size_t)n;
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      in_len = 0;
    }
  }
}

static long long ms_since(const struct timespec *t) {
  struct timespec now;
  if (clock_gettime(CLOCK_MONOTONIC, &now) < 0) return DRAIN_MS; /* cannot fail; if it did, stop draining */
  return (now.tv_sec - t->tv_sec) * 1000LL + (now.tv_nsec - t->tv_nsec) / 1000000;
}

/* The container's rootfs, unmounted as its init ends, so that the Delete that follows finds it
   done. Only plain unmounts: a mount still busy (a process of the container still dying) is
   left, and Delete unmounts it, detaching it if it must. Nothing here can fail the exit. */
static void unmount_bundle_rootfs(void) {
  char path[PATH_MAX], root[PATH_MAX], why[PATH_MAX + 256];
  int n = snprintf(path, sizeof path, "%s/rootfs", bundle_dir);
  if (n < 0 || (size_t)n >= sizeof path || realpath(path, root) == NULL || strcmp(root, "/") == 0) return;
  if (sv_unmount_tree(root, 0, NULL, why, sizeof why) < 0) { /* Delete does it */ }
}

/* Serves the control socket and the relay until the process exits; returns its exit code. */
static int serve(int sigfd, int kill_all, const char *notify) {
  struct timespec drain_start = {0, 0};
  for (;;) {
    struct pollfd p[MAX_CLIENTS + 7];
    int np = 0;
    int i_sig = -1, i_ctl = -1, i_master = -1, i_in = -1, i_out = -1, i_oom = -1;
    if (!exited) {
      i_sig = np, p[np++] = (struct pollfd){sigfd, POLLIN, 0};
      i_ctl = np, p[np++] = (struct pollfd){ctl_fd, POLLIN, 0};
      if (oom_fd >= 0) i_oom = np, p[np++] = (struct pollfd){oom_fd, POLLIN, 0};
    }
    int base = np;
    for (int i = 0; i < nclients; i++) p[np++] = (struct pollfd){clients[i].fd, POLLIN, 0};
    if (master >= 0) {
      short ev = (out_len == 0 && !master_done ? POLLIN : 0) | (in_len > 0 ? POLLOUT : 0);
      /* A closed slave makes poll report POLLHUP whatever is asked: an fd of -1 is skipped. */
      i_master = np, p[np++] = (struct pollfd){ev == 0 ? -1 : master, ev, 0};
      if (relay_in >= 0 && in_len == 0) i_in = np, p[np++] = (struct pollfd){relay_in, POLLIN, 0};
      if (out_len > 0) i_out = np, p[np++] = (struct pollfd){relay_out, POLLOUT, 0};
    }
    int timeout = -1;
    if (exited) {
      long long left = DRAIN_MS - ms_since(&drain_start);
      if (master < 0 || (master_done && out_len == 0) || left <= 0) return 0;
      timeout = (int)left;
    }
    int r = poll(p, (nfds_t)np, timeout);
    if (r < 0) {
      if (errno == EINTR) continue;
      return 2;
    }
    if (master >= 0) relay(p[i_master].revents, i_in >= 0 ? p[i_in].revents : 0, i_out >= 0 ? p[i_out].revents : 0);
    for (int i = nclients - 1; i >= 0; i--) {
      if (p[base + i].revents != 0 && !serve_client(&clients[i])) drop_client(i);
    }
    if (i_oom >= 0 && (p[i_oom].revents & POLLIN)) oom_event();
    if (i_ctl >= 0 && (p[i_ctl].revents & POLLIN)) accept_clients();
    if (i_sig < 0 || !(p[i_sig].revents & POLLIN)) continue;

    struct signalfd_siginfo si;
    if (read(sigfd, &si, sizeof si) < 0 && errno != EAGAIN) return 2;
    /* Orphans reparented to the subreaper are reaped and forgotten, so the process's own
       status is never taken by a wait for any child (a failed wait: the next SIGCHLD tries
       again). Its exit time is taken while it is still a zombie. */
    if (sv_reap_others(proc_pid, NULL) != proc_pid) continue;
    struct sv_exit ended;
    sv_reap(proc_pid, &ended);
    if (kill_all && kill_cgroup() < 0) {
      /* No pid namespace of its own: the kernel ends nothing else when the init ends. runc
         ≤ 1.1 signals the cgroup's processes for --all; ≥ 1.2 does so for KILL by itself. */
      char why[512];
      const char *args[] = {"kill", "--all", id, "KILL", NULL};
      if (runc_ok(args, -1, -1, -1, why, sizeof why) < 0) {
        /* Recorded in runc.log; the exit is written all the same. */
      }
    }
    if (unmount_rootfs) unmount_bundle_rootfs();
    sv_exit_line(&ended, exit_line, sizeof exit_line);
    int rc = sv_record_exit(dir, &ended, notify, NULL);
    if (rc == 2) return 2;
    exited = 1;
    for (int i = nclients - 1; i >= 0; i--) {
      if (clients[i].waiting) answer(&clients[i], "exited %s", exit_line);
      drop_client(i);
    }
    close_fd(&ctl_fd);
    close_fd(&oom_fd);
    if (sv_unlink_bound(&ctl_bound, NULL) < 0) { /* the file is left; nothing listens on it */ }
    close_fd(&relay_in);
    if (clock_gettime(CLOCK_MONOTONIC, &drain_start) < 0) drain_start = (struct timespec){0, 0};
    if (rc != 0) return rc;
  }
}

/* ---- main ---------------------------------------------------------------------------- */

/* What the start takes from the command line. */
struct start_args {
  const char *bundle, *process, *in_path, *out_path, *err_path;
  int terminal;
};

static int start_and_answer(const struct start_args *a);

int holder_main(int argc, char **argv) {
  if (argc < 2 || (strcmp(argv[1], "create") != 0 && strcmp(argv[1], "exec") != 0)) {
    fprintf(stderr, "usage: tsbox-ctr create|exec --dir DIR --id ID --root R ... (see native/tsbox-ctr.c)\n");
    return 2;
  }
  exec_mode = strcmp(argv[1], "exec") == 0;
  sv_answer_undo(cleanup_created);
  const char *bundle = NULL, *process = NULL, *notify = NULL;
  const char *in_path = "", *out_path = "", *err_path = "";
  int terminal = 0, kill_all = 0;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--terminal") == 0) terminal = 1;
    else if (strcmp(a, "--systemd-cgroup") == 0) systemd_cgroup = 1;
    else if (strcmp(a, "--kill-all") == 0) kill_all = 1;
    else if (strcmp(a, "--direct-start") == 0) direct_start = 1;
    else if (strcmp(a, "--unmount-rootfs") == 0) unmount_rootfs = 1;
    else if (v == NULL) sv_fail("option %s needs a value", a);
    else if (strcmp(a, "--dir") == 0) dir = v, i++;
    else if (strcmp(a, "--bundle") == 0) bundle = v, i++;
    else if (strcmp(a, "--id") == 0) id = v, i++;
    else if (strcmp(a, "--root") == 0) root = v, i++;
    else if (strcmp(a, "--process") == 0) process = v, i++;
    else if (strcmp(a, "--stdin") == 0) in_path = v, i++;
    else if (strcmp(a, "--stdout") == 0) out_path = v, i++;
    else if (strcmp(a, "--stderr") == 0) err_path = v, i++;
    else if (strcmp(a, "--runc") == 0) runc_bin = v, i++;
    else if (strcmp(a, "--notify") == 0) notify = v, i++;
    else if (strcmp(a, "--kill-all-v2") == 0) kill_all = 1, kill_mount = v, kill_v1 = 0, i++;
    else if (strcmp(a, "--kill-all-freezer") == 0) kill_all = 1, kill_mount = v, kill_v1 = 1, i++;
    else sv_fail("unknown option %s", a);
  }
  if (dir == NULL || dir[0] != '/') sv_fail("--dir must be an absolute path");
  if (id == NULL || id[0] == '\0' || id[0] == '-') sv_fail("--id is required");
  if (root == NULL || root[0] != '/') sv_fail("--root must be an absolute path");
  if (!exec_mode && (bundle == NULL || bundle[0] != '/')) sv_fail("--bundle must be an absolute path");
  if (exec_mode && (process == NULL || process[0] != '/')) sv_fail("--process must be an absolute path");
  if (exec_mode && kill_all) sv_fail("--kill-all is for the container's init, not an exec");
  if (kill_mount != NULL && kill_mount[0] != '/') sv_fail("--kill-all-v2 and --kill-all-freezer take the hierarchy's absolute mount point");
  if (exec_mode && direct_start) sv_fail("--direct-start is for the container's init, not an exec");
  if (exec_mode && unmount_rootfs) sv_fail("--unmount-rootfs is for the container's init, not an exec");
  bundle_dir = bundle;
  const struct start_args start = {bundle, process, in_path, out_path, err_path, terminal};
  int sigfd = start_and_answer(&start);
  /* What only the start needed goes back: the holder keeps its steady state alone. */
  sv_shed();
  int rc = serve(sigfd, kill_all, notify);
  close_fd(&master);
  close_fd(&relay_out);
  close_fd(&stdin_hold);
  close_fd(&stdout_hold);
  close_fd(&stderr_hold);
  return exited ? rc : 2;
}

/*
 * The holder's start: runs runc (create, or exec), writes the records and answers; returns the
 * signalfd serve() reads. Not inlined: its frame (the start's buffers) is gone before the holder
 * waits out the rest of its life.
 */
static __attribute__((noinline)) int start_and_answer(const struct start_args *a) {
  const char *bundle = a->bundle, *process = a->process;
  const char *in_path = a->in_path, *out_path = a->out_path, *err_path = a->err_path;
  int terminal = a->terminal;
  /* The holder outlives tsbox and any terminal; stray signals must not end it. */
  if (sv_set_signals(sv_detached_signals, SIG_IGN) < 0) sv_fail("signal: %s", strerror(errno));
  /* Its own session (tsbox and tsbox-shim serve start it in one already: then EPERM). */
  if (setsid() < 0 && !(errno == EPERM && getsid(0) == getpid())) sv_fail("setsid: %s", strerror(errno));
  if (chdir("/") < 0) sv_fail("chdir /: %s", strerror(errno));
  /* runc create exits once the container is made: its init is then reparented here. */
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) sv_fail("prctl PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
  /* Named before any work: a tsbox restarted while runc works finds this holder by it (with
     the start time that makes the pid trustworthy) and ends it, rather than racing it. */
  const struct sv_process self = {getpid(), sv_start_time(getpid())};
  if (self.start == 0) sv_fail("read /proc/self/stat: %s", strerror(errno));
  if (sv_write_pids(dir, "holder", &self, 1, 1) < 0) sv_fail("write %s/holder: %s", dir, strerror(errno));
  sigset_t chld;
  if (sigemptyset(&chld) < 0 || sigaddset(&chld, SIGCHLD) < 0 || sigprocmask(SIG_BLOCK, &chld, NULL) < 0)
    sv_fail("block SIGCHLD: %s", strerror(errno));
  int sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) sv_fail("signalfd: %s", strerror(errno));

  /* The FIFOs, held as research §4.4 says: readers on stdout/stderr (no EPIPE while CRI is
     away), a writer on stdin (no EOF while CRI restarts), never a writer on stdout/stderr
     that outlives the start (CRI's Delete waits for EOF). */
  int proc_in = -1, proc_out = -1, proc_err = -1;
  if (in_path[0] != '\0') {
    int rd = open_fifo(in_path, O_WRONLY, &stdin_hold);
    if (terminal) {
      relay_in = rd;
    } else {
      if (set_nonblock(rd, 0) < 0) sv_fail("make %s blocking: %s", in_path, strerror(errno));
      proc_in = rd;
    }
  }
  if (out_path[0] != '\0') {
    stdout_hold = open_fifo(out_path, O_WRONLY, terminal ? &relay_out : &proc_out);
    if (terminal && set_nonblock(relay_out, 1) < 0) sv_fail("make %s non-blocking: %s", out_path, strerror(errno));
  }
  /* With a terminal, all output goes through the pty to stdout (as the runc shim). */
  if (err_path[0] != '\0' && !terminal) stderr_hold = open_fifo(err_path, O_WRONLY, &proc_err);

  char con_path[4096];
  struct sv_bound con_bound = {0};
  int con_fd = terminal ? listen_at("console.sock", con_path, sizeof con_path, &con_bound) : -1;
  ctl_fd = listen_at("ctl", ctl_path, sizeof ctl_path, &ctl_bound);

  char pid_path[4096], why[1024];
  path_in_dir(pid_path, sizeof pid_path, exec_mode ? "exec.pid" : "init.pid");
  if (unlink(pid_path) < 0 && errno != ENOENT) sv_fail("remove %s: %s", pid_path, strerror(errno));
  const char *args[16];
  int n = 0;
  if (exec_mode) {
    args[n++] = "exec", args[n++] = "--process", args[n++] = process, args[n++] = "--detach";
  } else {
    args[n++] = "create", args[n++] = "--bundle", args[n++] = bundle;
  }
  args[n++] = "--pid-file", args[n++] = pid_path;
  if (terminal) args[n++] = "--console-socket", args[n++] = con_path;
  args[n++] = id;
  args[n] = NULL;
  int code = run_runc(args, proc_in, proc_out, proc_err, why, sizeof why);
  /* From here on whatever runc made must go if the start fails. */
  created = code == 0;
  if (code != 0) {
    if (code > 0 && !last_runc_error(why, sizeof why)) snprintf(why, sizeof why, "runc %s exited with status %d", args[0], code);
    sv_fail("%s", why);
  }
  /* The process has its ends now: the holder keeps none of the ones it gave away. */
  if (proc_in >= 0 && close(proc_in) < 0) sv_fail("close %s: %s", in_path, strerror(errno));
  if (proc_out >= 0 && close(proc_out) < 0) sv_fail("close %s: %s", out_path, strerror(errno));
  if (proc_err >= 0 && close(proc_err) < 0) sv_fail("close %s: %s", err_path, strerror(errno));

  char pidtext[32];
  int pfd = open(pid_path, O_RDONLY | O_CLOEXEC);
  if (pfd < 0) sv_fail("open %s: %s", pid_path, strerror(errno));
  ssize_t pn;
  do pn = read(pfd, pidtext, sizeof pidtext - 1);
  while (pn < 0 && errno == EINTR);
  if (pn < 0) sv_fail("read %s: %s", pid_path, strerror(errno));
  if (close(pfd) < 0) sv_fail("close %s: %s", pid_path, strerror(errno));
  pidtext[pn] = '\0';
  char *end;
  long pid = strtol(pidtext, &end, 10);
  if (end == pidtext || pid <= 0) sv_fail("%s does not name a process: \"%s\"", pid_path, pidtext);
  proc_pid = (pid_t)pid;
  if (exec_mode) started = 1;
  if (kill_mount != NULL) locate_kill_cgroup(proc_pid);
  if (terminal) master = receive_master(con_fd, &con_bound);

  /* The process is ours (a zombie at worst, until we reap it): its stat is there. */
  const struct sv_process record[] = {self, {proc_pid, sv_start_time(proc_pid)}};
  if (record[1].start == 0) sv_fail("read /proc/%d/stat: %s", (int)proc_pid, strerror(errno));

  /* The answer goes to a copy of stdout; the holder's own stdio becomes /dev/null. */
  sv_answer_detach();
  /* "<holder-pid> <holder-start> <pid> <pid-start>"; not fsynced, as tsbox-shim's. */
  if (sv_write_pids(dir, "pid", record, 2, 1) < 0) sv_fail("write %s/pid: %s", dir, strerror(errno));
  /* Started through tsbox-shim serve's spawn: from its answer on, it outlives the request. */
  if (prctl(PR_SET_PDEATHSIG, 0) < 0) sv_fail("prctl PR_SET_PDEATHSIG: %s", strerror(errno));
  created = 0;
  sv_answer_ok(getpid(), proc_pid);
  return sigfd;
}
