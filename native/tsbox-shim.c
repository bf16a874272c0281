/*
 * tsbox-shim: the per-sandbox supervisor.
 *
 * tsbox starts one shim per sandbox, detached in its own session. The shim forks the
 * sandbox's main process, which joins the sandbox's cgroups and network namespace and unshares
 * the namespaces it is told to (pid, ipc, uts, mount) on its side of the fork: the shim itself
 * stays in the host's namespaces and, with --home, leaves the pod's cgroup, so that it can run
 * what needs the host's mounts and can outlive the sandbox process. With a pid namespace that
 * child forks once more, the real sandbox process being pid 1 of the new namespace: the shim
 * is a child subreaper, so the sandbox process is its child for its whole life, and it alone
 * can read the real exit status. When the process ends the shim writes
 * "<status> <seconds> <nanoseconds>" to <dir>/exit atomically (temp file, fsync, rename, fsync
 * of the directory) and touches the notify file. That is what lets an exit code survive a
 * restart or a crash of tsbox. The records, the answer, the sockets and the unmount of a tree
 * are the supervision library's (supervise.h), which tsbox-ctr shares.
 *
 * Without --task-socket the shim then exits. With it (relay mode) the shim is also the pod's
 * relay (relay.c): it owns the pod's task socket and containerd's connections to it, and relays
 * their ttrpc calls to tsbox, which connects to --link; the private protocol between the two is
 * service POD_SERVICE, version POD_PROTOCOL_VERSION (relay.c, src/ttrpc/pod-link.ts). It goes on
 * serving after the sandbox process has ended (containerd may still call the pod's other tasks)
 * until tsbox ends it with SIGTERM, which it takes only once the sandbox process has ended: it
 * then removes its sockets and exits. Before that, SIGTERM is logged and ignored. Its log, JSON
 * lines, goes to --relay-log (moved to FILE.1 past --relay-log-max-bytes, 1 MiB by default).
 *
 * Protocol with tsbox, on the shim's stdout (a pipe), one line, then EOF:
 *   "ok <shim-pid> <sandbox-pid>\n"  the sandbox process runs (exec succeeded)
 *   "error <message>\n"              nothing runs; the shim exits 1
 * The shim also writes "<shim-pid> <sandbox-pid>\n" to <dir>/pid before it
 * answers, so a sandbox that runs always has a record naming it.
 *
 * Usage: tsbox-shim --dir DIR [--notify FILE] [--netns PATH] [--hostname NAME]
 *                   [--cgroup DIR]... [--home DIR]... [--hold] [--unshare pid,ipc,uts,mnt]
 *                   [--cwd DIR] [--sysctl KEY=VALUE]... [--shm PATH --shm-size BYTES]
 *                   [--log FILE] [--task-socket PATH --link PATH [--relay-log FILE]
 *                   [--relay-log-max-bytes N]] [-- ARGV...]
 * Without ARGV the sandbox process is the pause (tsbox-pause beside this program,
 * native/pause.c), which sleeps until it is signalled, reaps every orphan the pod's
 * containers leave to it (it is pid 1 of the pod's pid namespace), and exits 0 on
 * SIGTERM or SIGINT, as the Kubernetes pause does. Each namespace named by --unshare is the sandbox's
 * own; the others are the host's (a pod's NODE namespace modes). Sysctls are
 * written inside the sandbox's namespaces, before its process runs.
 *
 * Every system call is checked: a failure before the sandbox runs is answered as
 * "error <what>: <strerror>" (the call and its target named) and leaves no process (and, in
 * relay mode, no socket file) behind; the sandbox process reports its own set-up failures to
 * the shim through a pipe. After the answer the shim's exit status says how it ended: 0 exit
 * file written, 2 exit file not written, 3 exit file written but the notify file not.
 *
 * --hold makes the shim wait, before it forks, for one byte on its stdin: meanwhile tsbox has
 * systemd move it into the sandbox's scope, so the sandbox process starts there. EOF instead of
 * the byte means the start was given up: exit 1. --home names the cgroups (one per hierarchy)
 * the shim moves itself into once the sandbox process runs, so that only the sandbox stays in
 * the scope.
 *
 * --shm mounts the pod's /dev/shm (a tmpfs, mode 1777) at PATH before the fork, in the host's
 * mount namespace, where CRI bind-mounts it into containers. Helper modes for tsbox:
 *   tsbox-shim umount PATH    detaches whatever is mounted at PATH (at Stop); exit 0 on
 *                             success, else the reason on stderr and exit 1.
 *   tsbox-shim peer PATH      prints the pid of the process serving the unix socket at PATH
 *                             (SO_PEERCRED: a socket tsbox finds in use is named by its
 *                             owner); exit 0, or the reason on stderr and exit 1.
 *   tsbox-shim mount TARGET TYPE SOURCE [OPTION...]
 *                             mounts one of containerd's mounts (a task's rootfs) at TARGET
 *                             the way containerd's core/mount does: options that are mount
 *                             flags become flags, propagation options a second call, the rest
 *                             the data string; a read-only bind is remounted read-only; an
 *                             overlay whose options near a page has its lowerdirs made
 *                             relative to their common parent, which becomes the working
 *                             directory. Anything the helper mounted is undone when a later
 *                             step fails. Exit 0, or one line on stderr and exit 1.
 *   tsbox-shim umount-all PATH
 *                             unmounts everything at and below PATH (a task's rootfs at
 *                             Delete), deepest first, per /proc/self/mountinfo; a mount that is
 *                             busy is detached lazily and named on stdout ("detached PATH").
 *                             Nothing mounted, or no PATH, is success.
 *   tsbox-shim lock PATH      one tsbox per state directory: opens or creates PATH, takes
 *                             flock(LOCK_EX|LOCK_NB) on it and writes its parent's pid (the
 *                             daemon's) into it, then answers one line on stdout:
 *                               "ok"            the lock is held
 *                               "busy <pid>"    another daemon holds it ("busy unknown"
 *                                               when its pid cannot be read); exit 1. A
 *                                               holder whose daemon is dead is given up
 *                                               to 1 s to let go first.
 *                               "error <what>"  a call failed, named with its errno; exit 1
 *                             and holds the lock until its stdin (a pipe from the daemon)
 *                             reaches end of file, which the kernel makes happen when the
 *                             daemon exits however it ends; SIGHUP, SIGINT and SIGTERM are
 *                             ignored so the lock lasts exactly as long as the daemon.
 *   tsbox-shim serve          the modes umount, umount-all and mount kept running for tsbox,
 *                             so that each costs a fork of this small process, not a start of
 *                             a new one from tsbox. Requests on stdin, one at a time: "<argc>\n"
 *                             then argc arguments (the mode first), each ended by a NUL byte.
 *                             Each runs in a child of its own, whose stdout and stderr are
 *                             collected; the answer on stdout is "<status> <out-bytes>
 *                             <err-bytes>\n" and then those bytes, <status> being the child's
 *                             exit status (128+N when signal N ended it; 125 when it wrote
 *                             more than 4 MiB, the rest dropped). Exit 0 at end of
 *                             file on stdin; a request that is not one: its reason on stderr,
 *                             exit 2. One more request starts a process that goes on running
 *                             (a container's holder, a sandbox's supervisor):
 *                               spawn PROGRAM N ENV1..ENVN ARG...
 *                             runs the absolute PROGRAM with exactly those N "NAME=value"
 *                             pairs as its environment, in a session of its own, stdin
 *                             /dev/null, from /, and answers with what it wrote on stdout and
 *                             stderr until it closed both: status 0 once it ran (it goes on
 *                             running, or has ended since), 127 when it could not be run, 125
 *                             when the spawn itself failed. It is started with
 *                             PR_SET_PDEATHSIG = SIGKILL towards the request's child, which has
 *                             the same towards the serving process: a request ended for its
 *                             bound, or a serving process that dies, takes a program that has
 *                             not answered with it. A program that is to outlive the request
 *                             clears it before it answers (tsbox-ctr and this supervisor do);
 *                             one that does not is killed once it has closed its outputs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "holder.h"
#include "relay.h"
#include "supervise.h"
#include "tsbox-contract.h"

#define MAX_CGROUPS 16
#define MAX_SYSCTLS 128

/* The private protocol between tsbox and a pod's process: POD_SERVICE and POD_PROTOCOL_VERSION
   (tsbox-contract.h, from src/ttrpc/pod-link.ts). */
#define DECIMAL(n) #n
#define VERSION_TEXT(n) DECIMAL(n)
/*
 * The services a client of the task socket may not call: the pod's own, and the one the
 * node-wide task front of earlier builds spoke, which tsbox still serves on its links.
 */
static const char *const private_services[] = {POD_SERVICE, FORMER_FRONT_SERVICE, NULL};

static const char *dir;
/*
 * The processes a failed start takes down: the sandbox process once forked, and with a pid
 * namespace the child between the two until it has handed over the sandbox and been reaped.
 */
static pid_t child = 0, middle = 0;
/* Relay mode: the sockets are bound, and a failed start removes them. */
static int relay_bound;

static void take_down(pid_t *pid) {
  if (*pid <= 0) return;
  if (kill(*pid, SIGKILL) < 0 && errno != ESRCH) { /* already reported by the message below */ }
  while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR) {
  }
  *pid = 0;
}

/* What a failed start undoes before it answers (sv_fail): nothing may outlive it. */
static void undo_start(void) {
  take_down(&middle);
  take_down(&child);
  if (relay_bound) relay_unlink();
}

/* In the sandbox process before exec: tells the shim what failed (one atomic pipe write). */
static int errpipe_fd = -1;
static void child_fail(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (write(errpipe_fd, msg, strlen(msg)) < 0) { /* the shim is gone: nobody to tell */ }
  _exit(127);
}

/* The pause (native/pause.c), beside this program: what a sandbox without a command runs. */
static char pause_path[PATH_MAX] SV_OWN_PAGES; /* given back once the sandbox process runs */

/* Finds the pause program beside this one (/proc/self/exe: the supervisor's own file, whatever
   name it was run by); a start without it fails before anything runs. */
static void find_pause(void) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n < 0) sv_fail("readlink /proc/self/exe: %s", strerror(errno));
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (slash == NULL) sv_fail("/proc/self/exe is not a path: %s", self);
  *slash = '\0';
  int len = snprintf(pause_path, sizeof pause_path, "%s/%s", self, PAUSE_NAME);
  if (len < 0 || (size_t)len >= sizeof pause_path) sv_fail("the pause's path %s/%s is too long", self, PAUSE_NAME);
  if (access(pause_path, X_OK) < 0) sv_fail("the pause program %s: %s", pause_path, strerror(errno));
}

/* Writes VALUE to /proc/sys/KEY (dots become slashes); returns errno or 0. */
static int apply_sysctl(const char *pair) {
  const char *eq = strchr(pair, '=');
  if (eq == NULL || eq == pair) return EINVAL;
  char path[512];
  size_t klen = (size_t)(eq - pair);
  if (klen + 11 >= sizeof path) return ENAMETOOLONG;
  memcpy(path, "/proc/sys/", 10);
  for (size_t i = 0; i < klen; i++) path[10 + i] = pair[i] == '.' ? '/' : pair[i];
  path[10 + klen] = '\0';
  return sv_write_text(path, eq + 1) < 0 ? errno : 0;
}

static int mount_shm(const char *path, unsigned long long bytes) {
  char data[64];
  snprintf(data, sizeof data, "mode=1777,size=%llu", bytes);
  return mount("shm", path, "tmpfs", MS_NOEXEC | MS_NOSUID | MS_NODEV, data);
}

/* The lock helper's answer on stdout; exits 1 unless it is "ok". */
static void lock_answer(const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  size_t len = strlen(line);
  int ok = strcmp(line, "ok") == 0;
  line[len] = '\n';
  if (sv_write_all(STDOUT_FILENO, line, len + 1) < 0) _exit(1); /* the daemon is gone */
  if (!ok) _exit(1);
}

/* The pid a lock file names, or 0 while it names none (its holder has not written it yet). */
static long holder_pid(int fd) {
  char buf[32];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  char *end;
  long pid = strtol(buf, &end, 10);
  return end != buf && *end == '\n' && pid > 0 ? pid : 0;
}

static int lock_mode(const char *path) {
  if (sv_set_signals((const int[]){SIGHUP, SIGINT, SIGTERM, 0}, SIG_IGN) < 0) lock_answer("error signal: %s", strerror(errno));
  int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) lock_answer("error open %s: %s", path, strerror(errno));
  /* Busy: the holder writes its pid right after it takes the lock, and the helper of a daemon
     that has died lets go as soon as it sees its stdin close. Both take a moment. */
  for (int tries = 0; flock(fd, LOCK_EX | LOCK_NB) < 0; tries++) {
    if (errno != EWOULDBLOCK) lock_answer("error flock %s: %s", path, strerror(errno));
    long pid = holder_pid(fd);
    int settling = pid == 0 || (kill((pid_t)pid, 0) < 0 && errno == ESRCH);
    if (!settling || tries == 1000) {
      if (pid == 0) lock_answer("busy unknown");
      lock_answer("busy %ld", pid);
    }
    struct timespec ms = {0, 1000000};
    if (nanosleep(&ms, NULL) < 0 && errno != EINTR) lock_answer("error nanosleep: %s", strerror(errno));
  }
  /* Written over the old pid, then cut to length: a reader never sees an empty file. */
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%d\n", (int)getppid());
  ssize_t written = pwrite(fd, pid, (size_t)len, 0);
  if (written < 0) lock_answer("error write %s: %s", path, strerror(errno));
  if (written != len) lock_answer("error write %s: short write", path);
  if (ftruncate(fd, len) < 0) lock_answer("error truncate %s: %s", path, strerror(errno));
  lock_answer("ok");
  if (close(STDOUT_FILENO) < 0) return 1;
  /* Holds the lock (fd stays open) until the daemon's end of stdin closes. */
  char buf[64];
  for (;;) {
    ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n == 0) return 0;
    if (n < 0 && errno != EINTR) return 1; /* stdin is not the daemon's pipe: release at once */
  }
}

/* "No such file or directory (ENOENT)": the message and the errno's name. */
static const char *errno_text(int e) {
  static char text[128];
  const char *name = sv_errno_name(e);
  if (name != NULL) snprintf(text, sizeof text, "%s (%s)", strerror(e), name);
  else snprintf(text, sizeof text, "%s (errno %d)", strerror(e), e);
  return text;
}

/* containerd's mount option table (core/mount/mount_linux.go): each sets or clears a flag. */
struct mount_option {
  const char *name;
  int clear;
  unsigned long flag;
};

static const struct mount_option flag_options[] = {
    {"async", 1, MS_SYNCHRONOUS},     {"atime", 1, MS_NOATIME},         {"bind", 0, MS_BIND},
    {"dev", 1, MS_NODEV},             {"diratime", 1, MS_NODIRATIME},   {"dirsync", 0, MS_DIRSYNC},
    {"exec", 1, MS_NOEXEC},           {"mand", 0, MS_MANDLOCK},         {"noatime", 0, MS_NOATIME},
    {"nodev", 0, MS_NODEV},           {"nodiratime", 0, MS_NODIRATIME}, {"noexec", 0, MS_NOEXEC},
    {"nomand", 1, MS_MANDLOCK},       {"norelatime", 1, MS_RELATIME},   {"nostrictatime", 1, MS_STRICTATIME},
    {"nosuid", 0, MS_NOSUID},         {"rbind", 0, MS_BIND | MS_REC},   {"relatime", 0, MS_RELATIME},
    {"remount", 0, MS_REMOUNT},       {"ro", 0, MS_RDONLY},             {"rw", 1, MS_RDONLY},
    {"strictatime", 0, MS_STRICTATIME}, {"suid", 1, MS_NOSUID},         {"sync", 0, MS_SYNCHRONOUS},
    /* No flag: mount(8)'s placeholder, dropped (containerd would pass it on as data). */
    {"defaults", 0, 0},
};

/* Propagation is its own mount call; the r- forms take MS_REC for that call only. */
static const struct mount_option propagation_options[] = {
    {"private", 0, MS_PRIVATE}, {"rprivate", 0, MS_PRIVATE | MS_REC}, {"shared", 0, MS_SHARED},
    {"rshared", 0, MS_SHARED | MS_REC}, {"slave", 0, MS_SLAVE}, {"rslave", 0, MS_SLAVE | MS_REC},
    {"unbindable", 0, MS_UNBINDABLE}, {"runbindable", 0, MS_UNBINDABLE | MS_REC},
};

static const struct mount_option *find_option(const struct mount_option *table, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(table[i].name, name) == 0) return &table[i];
  return NULL;
}

#define LOWERDIR "lowerdir="

/*
 * containerd's answer to the one-page limit of mount(2)'s data: the overlay's lowerdirs (the
 * first lowerdir= option) made relative to the parent of their longest common prefix, which
 * the mount then runs in. Writes that directory to `dir` (dir[0] == 0 when nothing can be
 * compacted: one lowerdir, no absolute common parent other than /) and returns the index of
 * the lowerdir option, or -1.
 */
static int compact_lowerdirs(char **opts, int nopts, char *dir, size_t dirsize) {
  dir[0] = '\0';
  int idx = -1;
  for (int i = 0; i < nopts && idx < 0; i++)
    if (strncmp(opts[i], LOWERDIR, strlen(LOWERDIR)) == 0) idx = i;
  if (idx < 0) return -1;
  const char *list = opts[idx] + strlen(LOWERDIR);
  if (strchr(list, ':') == NULL) return -1;
  /* The common prefix of all the dirs, cut back to its last slash. */
  size_t common = strcspn(list, ":");
  for (const char *d = list; d != NULL; d = strchr(d, ':') != NULL ? strchr(d, ':') + 1 : NULL) {
    size_t n = 0;
    while (n < common && d[n] != ':' && d[n] != '\0' && d[n] == list[n]) n++;
    common = n;
  }
  while (common > 0 && list[common - 1] != '/') common--;
  if (list[0] != '/' || common <= 1 || common > dirsize) return -1;
  /* Every dir must keep a name of its own below the common directory. */
  for (const char *d = list; d != NULL; d = strchr(d, ':') != NULL ? strchr(d, ':') + 1 : NULL)
    if (d[common] == ':' || d[common] == '\0') return -1;
  memcpy(dir, list, common - 1);
  dir[common - 1] = '\0';
  return idx;
}

/* Appends `text` (and a separator before it unless first) to data; data has room (measured). */
static void append_data(char *data, size_t *len, const char *text, size_t n) {
  if (*len > 0) data[(*len)++] = ',';
  memcpy(data + *len, text, n);
  *len += n;
  data[*len] = '\0';
}

/*
 * tsbox-shim mount TARGET TYPE SOURCE [OPTION...]: what containerd's Mount.mount does for the
 * types tsbox takes (no loop devices, no id mapping: tsbox refuses those before it gets here).
 */
static int mount_mode(int argc, char **argv) {
  const char *target = argv[2], *type = argv[3], *source = argv[4];
  char **opts = argv + 5;
  int nopts = argc - 5;
  unsigned long flags = 0, propagation = 0;
  size_t size = 0, room = 1;
  /* Absolute, as the mount may run in the lowerdirs' parent directory. */
  if (target[0] != '/') {
    fprintf(stderr, "mount %s on %s: the target is not an absolute path\n", type, target);
    return 1;
  }
  for (int i = 0; i < nopts; i++) {
    const struct mount_option *f = find_option(flag_options, sizeof flag_options / sizeof *flag_options, opts[i]);
    const struct mount_option *p = find_option(propagation_options, sizeof propagation_options / sizeof *propagation_options, opts[i]);
    size += strlen(opts[i]);
    room += strlen(opts[i]) + 1;
    if (f != NULL) flags = f->clear ? flags & ~f->flag : flags | f->flag;
    else if (p != NULL) propagation |= p->flag;
  }
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 512) {
    fprintf(stderr, "mount %s on %s: sysconf(_SC_PAGESIZE) gave %ld\n", type, target, page);
    return 1;
  }
  /* containerd compacts when the options (counted without separators) reach a page less 512. */
  char dir[4096];
  int lower = -1;
  if (strcmp(type, "overlay") == 0 && size >= (size_t)page - 512) lower = compact_lowerdirs(opts, nopts, dir, sizeof dir);
  char *data = malloc(room);
  if (data == NULL) {
    fprintf(stderr, "mount %s on %s: malloc %zu bytes: %s\n", type, target, room, errno_text(errno));
    return 1;
  }
  size_t len = 0;
  data[0] = '\0';
  for (int i = 0; i < nopts; i++) {
    if (i == lower || find_option(flag_options, sizeof flag_options / sizeof *flag_options, opts[i]) != NULL ||
        find_option(propagation_options, sizeof propagation_options / sizeof *propagation_options, opts[i]) != NULL)
      continue;
    append_data(data, &len, opts[i], strlen(opts[i]));
  }
  if (lower >= 0) {
    /* lowerdir=a/fs:b/fs, last, as containerd puts it. */
    size_t cut = strlen(dir) + 1;
    append_data(data, &len, LOWERDIR, strlen(LOWERDIR));
    for (const char *d = opts[lower] + strlen(LOWERDIR); d != NULL;) {
      const char *end = strchr(d, ':');
      size_t n = end != NULL ? (size_t)(end - d) : strlen(d);
      memcpy(data + len, d + cut, n - cut);
      len += n - cut;
      if (end != NULL) data[len++] = ':';
      data[len] = '\0';
      d = end != NULL ? end + 1 : NULL;
    }
  }
  /* The kernel copies one page of data, its terminating NUL included. */
  if (len >= (size_t)page) {
    fprintf(stderr, "mount %s on %s: its data is %zu bytes%s%s, over the limit of %ld (one page less its NUL)\n", type, target, len,
            lower >= 0 ? " with the lowerdirs relative to " : "", lower >= 0 ? dir : "", page - 1);
    free(data);
    return 1;
  }
  if (lower >= 0 && chdir(dir) < 0) {
    fprintf(stderr, "mount %s on %s: chdir %s (the lowerdirs' common parent): %s\n", type, target, dir, errno_text(errno));
    free(data);
    return 1;
  }
  char why[2 * PATH_MAX + 256];
  int mounted = 0;
  why[0] = '\0';
  /* A remount that changes no data is only the calls below (containerd, moby/moby#34077). */
  if (!(flags & MS_REMOUNT) || len > 0) {
    if (mount(source, target, type, flags, len > 0 ? data : NULL) < 0) {
      snprintf(why, sizeof why, "mount type %s from %s on %s (flags 0x%lx%s%s): %s", type, source, target, flags, lower >= 0 ? ", in " : "",
               lower >= 0 ? dir : "", errno_text(errno));
    } else {
      mounted = !(flags & MS_REMOUNT);
    }
  }
  if (why[0] == '\0' && propagation != 0 && mount(NULL, target, NULL, propagation, NULL) < 0)
    snprintf(why, sizeof why, "mount propagation 0x%lx on %s: %s", propagation, target, errno_text(errno));
  /* The kernel ignores MS_RDONLY on a new bind: a read-only bind takes a second call. */
  if (why[0] == '\0' && (flags & (MS_BIND | MS_RDONLY)) == (MS_BIND | MS_RDONLY) &&
      mount(NULL, target, NULL, flags | MS_REMOUNT, NULL) < 0)
    snprintf(why, sizeof why, "remount read-only bind of %s on %s (flags 0x%lx): %s", source, target, flags | MS_REMOUNT, errno_text(errno));
  free(data);
  if (why[0] == '\0') return 0;
  if (mounted && umount2(target, UMOUNT_NOFOLLOW) < 0)
    fprintf(stderr, "%s; then unmount %s: %s\n", why, target, errno_text(errno));
  else
    fprintf(stderr, "%s\n", why);
  return 1;
}

/*
 * tsbox-shim umount-all PATH. Plain umount first, as containerd's UnmountRecursive does. Where
 * containerd retries a busy mount for 2.5 s and then fails the Delete, this detaches it: a
 * task's rootfs is unmounted once its processes are gone, so whatever still holds it is
 * outside the task (an open file, a working directory), and a rootfs left mounted would keep
 * containerd from removing the bundle and would outlive the task with nobody to unmount it.
 */
static void print_detached(const char *path) {
  /* Told, not required: the mount is gone from here either way. */
  if (printf("detached %s\n", path) < 0) { /* nobody reads the note */ }
}

static int umount_all_mode(const char *path) {
  char root[PATH_MAX];
  if (realpath(path, root) == NULL) {
    if (errno == ENOENT) return 0;
    fprintf(stderr, "unmount everything at %s: realpath: %s\n", path, errno_text(errno));
    return 1;
  }
  if (strcmp(root, "/") == 0) {
    fprintf(stderr, "unmount everything at %s: refused, it is /\n", path);
    return 1;
  }
  char why[PATH_MAX + 256];
  if (sv_unmount_tree(root, 1, print_detached, why, sizeof why) == 0) return 0;
  fprintf(stderr, "%s\n", why);
  return 1;
}

static __attribute__((noinline)) int helper_mode(int argc, char **argv);

/* The most a request may carry (an overlay's options name every layer), and keep of an answer:
   SERVE_MAX_ARGS and SERVE_MAX_BYTES (tsbox-contract.h, from src/runtime/helper-service.ts). */

/* Appends what is readable on fd to *buf (at most `max` bytes kept); 0 at end of file. */
static ssize_t serve_drain(int fd, char **buf, size_t *len, size_t *cap, size_t max, int *cut) {
  char chunk[16384];
  ssize_t n = read(fd, chunk, sizeof chunk);
  if (n <= 0) return n;
  size_t keep = *len + (size_t)n > max ? max - *len : (size_t)n;
  if (keep < (size_t)n) *cut = 1;
  if (*len + keep > *cap) {
    size_t next = *cap == 0 ? 4096 : *cap;
    while (next < *len + keep) next *= 2;
    char *grown = realloc(*buf, next);
    if (grown == NULL) return -1;
    *buf = grown, *cap = next;
  }
  memcpy(*buf + *len, chunk, keep);
  *len += keep;
  return n;
}

/* Copies what is readable on `from` to `to`; 0 at end of file, -1 on failure. */
static int relay_chunk(int from, int to) {
  char chunk[16384];
  ssize_t n = read(from, chunk, sizeof chunk);
  if (n < 0) return errno == EINTR ? 1 : -1;
  if (n == 0) return 0;
  return sv_write_all(to, chunk, (size_t)n) < 0 ? -1 : 1;
}

/* The child of a `spawn` request: starts the program and passes on its stdout and stderr
   until it has closed both; the program is then left running (see the header). */
static int spawn_mode(int nargs, char **args) {
  if (nargs < 3 || args[1][0] != '/') {
    fprintf(stderr, "spawn needs an absolute program, the count of its environment's entries, the entries and its arguments\n");
    return 2;
  }
  char *end;
  errno = 0;
  long nenv = strtol(args[2], &end, 10);
  if (errno != 0 || end == args[2] || *end != '\0' || nenv < 0 || nenv > nargs - 3) {
    fprintf(stderr, "spawn: %.32s is not a count of environment entries (0 to %d)\n", args[2], nargs - 3);
    return 2;
  }
  static char *envp[SERVE_MAX_ARGS + 1] SV_OWN_PAGES, *argv[SERVE_MAX_ARGS + 1] SV_OWN_PAGES;
  for (long i = 0; i < nenv; i++) envp[i] = args[3 + i];
  envp[nenv] = NULL;
  int argc = 0;
  argv[argc++] = args[1];
  for (long i = 3 + nenv; i < nargs; i++) argv[argc++] = args[i];
  argv[argc] = NULL;
  /* The relay ends with the serving process (a serving process that dies, or is ended for a
     request's bound), and the program with the relay until it answers. */
  pid_t serving = getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) return fprintf(stderr, "spawn: prctl PR_SET_PDEATHSIG: %s\n", strerror(errno)), 125;
  if (getppid() != serving) return 125; /* the serving process is gone already: nobody wants it */
  /* out, err: the program's stdout and stderr; failed: written (then closed by exec) only when
     the program could not be run, so its status is waited for rather than guessed. */
  int out[2], err[2], failed[2];
  if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(failed, O_CLOEXEC) < 0)
    return fprintf(stderr, "spawn: pipe: %s\n", strerror(errno)), 125;
  pid_t relay = getpid();
  pid_t pid = fork();
  if (pid < 0) return fprintf(stderr, "spawn: fork: %s\n", strerror(errno)), 125;
  if (pid == 0) {
    const char *what = "";
    int code = 125;
    /* Ended with this relay until it answers; then it is on its own. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) what = "prctl PR_SET_PDEATHSIG";
    else if (getppid() != relay) _exit(125); /* the relay is gone already: nobody wants it */
    else if (setsid() < 0) what = "setsid";
    else if (chdir("/") < 0) what = "chdir /";
    else if (dup2(out[1], STDOUT_FILENO) < 0 || dup2(err[1], STDERR_FILENO) < 0) what = "dup2";
    else {
      sigset_t none;
      if (sigemptyset(&none) < 0 || sigprocmask(SIG_SETMASK, &none, NULL) < 0 || sv_set_signals((const int[]){SIGPIPE, 0}, SIG_DFL) < 0) {
        what = "reset signals";
      } else {
        execve(args[1], argv, envp);
        code = 127;
      }
    }
    int saved = errno;
    if (code == 127) fprintf(stderr, "cannot run %s: %s\n", args[1], strerror(saved));
    else fprintf(stderr, "spawn: %s: %s\n", what, strerror(saved));
    if (write(failed[1], "x", 1) < 0) { /* the relay is gone: nobody to tell */ }
    _exit(code);
  }
  if (close(out[1]) < 0 || close(err[1]) < 0 || close(failed[1]) < 0) return fprintf(stderr, "spawn: close: %s\n", strerror(errno)), 125;
  struct pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return fprintf(stderr, "spawn: poll: %s\n", strerror(errno)), 125;
    }
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      int r = relay_chunk(fds[i].fd, i == 0 ? STDOUT_FILENO : STDERR_FILENO);
      if (r < 0) return fprintf(stderr, "spawn: relay: %s\n", strerror(errno)), 125;
      if (r == 0) {
        if (close(fds[i].fd) < 0) return fprintf(stderr, "spawn: close: %s\n", strerror(errno)), 125;
        fds[i].fd = -1, open_fds--;
      }
    }
  }
  /* Its outputs are closed. Not run at all: its status is waited for. Run: it answered, and
     runs on (or has ended since, which its exit file, not this status, tells). */
  char byte;
  ssize_t n;
  do n = read(failed[0], &byte, 1);
  while (n < 0 && errno == EINTR);
  if (n < 0) return fprintf(stderr, "spawn: read: %s\n", strerror(errno)), 125;
  if (close(failed[0]) < 0) return fprintf(stderr, "spawn: close: %s\n", strerror(errno)), 125;
  if (n == 0) return 0;
  int status;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return fprintf(stderr, "spawn: waitpid %d: %s\n", (int)pid, strerror(errno)), 125;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Runs one request in a child and writes its answer; -1 when the answer cannot be given. */
static int serve_one(char **args, int nargs) {
  int out[2], err[2];
  /* A failure here ends the serving process (its caller exits): nothing to close. */
  if (pipe2(out, O_CLOEXEC) < 0) return fprintf(stderr, "serve: pipe: %s\n", strerror(errno)), -1;
  if (pipe2(err, O_CLOEXEC) < 0) return fprintf(stderr, "serve: pipe: %s\n", strerror(errno)), -1;
  pid_t pid = fork();
  if (pid < 0) return fprintf(stderr, "serve: fork: %s\n", strerror(errno)), -1;
  if (pid == 0) {
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || dup2(null, STDIN_FILENO) < 0 || dup2(out[1], STDOUT_FILENO) < 0 || dup2(err[1], STDERR_FILENO) < 0) _exit(125);
    /* The serving process's ends, and the copies: the request's child keeps only 0, 1 and 2. */
    if (close(out[0]) < 0 || close(err[0]) < 0 || close(out[1]) < 0 || close(err[1]) < 0 || close(null) < 0) _exit(125);
    char *argv[SERVE_MAX_ARGS + 2];
    argv[0] = "tsbox-shim";
    for (int i = 0; i < nargs; i++) argv[i + 1] = args[i];
    argv[nargs + 1] = NULL;
    int rc = strcmp(args[0], "spawn") == 0 ? spawn_mode(nargs, args) : helper_mode(nargs + 1, argv);
    if (fflush(stdout) != 0 || fflush(stderr) != 0) _exit(125);
    _exit(rc);
  }
  if (close(out[1]) < 0 || close(err[1]) < 0) return fprintf(stderr, "serve: close: %s\n", strerror(errno)), -1;
  char *text[2] = {NULL, NULL};
  size_t len[2] = {0, 0}, cap[2] = {0, 0};
  struct pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2, failed = 0, cut[2] = {0, 0};
  while (open_fds > 0 && !failed) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "serve: poll: %s\n", strerror(errno));
      failed = 1;
      break;
    }
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t n = serve_drain(fds[i].fd, &text[i], &len[i], &cap[i], SERVE_MAX_BYTES, &cut[i]);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fprintf(stderr, "serve: read: %s\n", strerror(errno)), failed = 1;
      if (n <= 0) {
        if (close(fds[i].fd) < 0) fprintf(stderr, "serve: close: %s\n", strerror(errno)), failed = 1;
        fds[i].fd = -1, open_fds--;
      }
    }
  }
  if (failed) {
    /* The child may be blocked writing to a pipe no one reads any more: it goes first. */
    if (kill(pid, SIGKILL) < 0 && errno != ESRCH) fprintf(stderr, "serve: kill %d: %s\n", (int)pid, strerror(errno));
    for (int i = 0; i < 2; i++)
      if (fds[i].fd >= 0 && close(fds[i].fd) < 0) fprintf(stderr, "serve: close: %s\n", strerror(errno));
  }
  int status;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return fprintf(stderr, "serve: waitpid %d: %s\n", (int)pid, strerror(errno)), -1;
  }
  if (failed) return -1;
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  /* Output past the bound was read and dropped: the answer must not pass for whole. */
  if (cut[0] || cut[1]) code = 125;
  char head[64];
  int hlen = snprintf(head, sizeof head, "%d %zu %zu\n", code, len[0], len[1]);
  int rc = sv_write_all(STDOUT_FILENO, head, (size_t)hlen) < 0 || (len[0] > 0 && sv_write_all(STDOUT_FILENO, text[0], len[0]) < 0) ||
                   (len[1] > 0 && sv_write_all(STDOUT_FILENO, text[1], len[1]) < 0)
               ? -1
               : 0;
  if (rc < 0) fprintf(stderr, "serve: write the answer: %s\n", strerror(errno));
  free(text[0]);
  free(text[1]);
  return rc;
}

static int serve_mode(void) {
  /* tsbox gone: its end of stdout is closed, and a write fails with EPIPE rather than killing. */
  if (sv_set_signals((const int[]){SIGPIPE, 0}, SIG_IGN) < 0) return fprintf(stderr, "serve: signal: %s\n", strerror(errno)), 1;
  char *line = NULL, *args[SERVE_MAX_ARGS];
  size_t line_cap = 0;
  /* args[0] to args[held - 1] are allocated (getdelim), whether the request was whole or not. */
  long held = 0;
  int code;
  for (;;) {
    errno = 0;
    ssize_t n = getline(&line, &line_cap, stdin);
    if (n < 0) {
      /* end of file: tsbox is done with it */
      code = errno != 0 ? (fprintf(stderr, "serve: read a request: %s\n", strerror(errno)), 1) : 0;
      break;
    }
    char *end;
    long nargs = strtol(line, &end, 10);
    if (end == line || *end != '\n' || nargs < 1 || nargs > SERVE_MAX_ARGS) {
      fprintf(stderr, "serve: a request must begin with its argument count (1 to %d) and a newline\n", SERVE_MAX_ARGS);
      code = 2;
      break;
    }
    size_t total = 0;
    int whole = 1;
    for (long i = 0; i < nargs && whole; i++) {
      size_t cap = 0;
      args[i] = NULL;
      held = i + 1;
      errno = 0;
      ssize_t got = getdelim(&args[i], &cap, '\0', stdin);
      if (got <= 0 || args[i][got - 1] != '\0' || (total += (size_t)got) > SERVE_MAX_BYTES) {
        fprintf(stderr, "serve: argument %ld of %ld: %s\n", i + 1, nargs, errno != 0 ? strerror(errno) : got > 0 ? "the request is too large" : "missing (end of file)");
        whole = 0;
      }
    }
    if (!whole) {
      code = 2;
      break;
    }
    int known = strcmp(args[0], "mount") == 0 || strcmp(args[0], "umount") == 0 || strcmp(args[0], "umount-all") == 0 ||
                strcmp(args[0], "spawn") == 0;
    int rc;
    if (known) {
      rc = serve_one(args, (int)nargs);
    } else {
      char said[256];
      int slen = snprintf(said, sizeof said, "serve: %.64s is not a mode it runs (mount, umount, umount-all, spawn)\n", args[0]);
      char head[64];
      int hlen = snprintf(head, sizeof head, "2 0 %d\n", slen);
      rc = sv_write_all(STDOUT_FILENO, head, (size_t)hlen) < 0 || sv_write_all(STDOUT_FILENO, said, (size_t)slen) < 0 ? -1 : 0;
    }
    for (long i = 0; i < held; i++) free(args[i]);
    held = 0;
    if (rc < 0) {
      code = 1;
      break;
    }
  }
  for (long i = 0; i < held; i++) free(args[i]);
  free(line);
  return code;
}

/* Prints the pid of the process serving the unix socket at `path` (SO_PEERCRED): exit 0, or the
   reason on stderr and exit 1 (nobody serves it: ECONNREFUSED or ENOENT). */
static int peer_mode(const char *path) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) {
    fprintf(stderr, "connect %s: %s\n", path, strerror(ENAMETOOLONG));
    return 1;
  }
  memcpy(addr.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    fprintf(stderr, "socket: %s\n", strerror(errno));
    return 1;
  }
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
    fprintf(stderr, "connect %s: %s\n", path, strerror(errno));
    if (close(fd) < 0) { /* the reason above is what matters */ }
    return 1;
  }
  if (close(fd) < 0) {
    fprintf(stderr, "close: %s\n", strerror(errno));
    return 1;
  }
  printf("%d\n", (int)cred.pid);
  return fflush(stdout) == 0 ? 0 : 1;
}

static int helper_mode(int argc, char **argv) {
  if (strcmp(argv[1], "serve") == 0 && argc == 2) return serve_mode();
  if (strcmp(argv[1], "peer") == 0 && argc == 3) return peer_mode(argv[2]);
  if (strcmp(argv[1], "umount") == 0 && argc == 3) {
    if (umount2(argv[2], MNT_DETACH | UMOUNT_NOFOLLOW) < 0 && errno != EINVAL && errno != ENOENT) {
      fprintf(stderr, "unmount %s: %s\n", argv[2], strerror(errno));
      return 1;
    }
    return 0;
  }
  if (strcmp(argv[1], "lock") == 0 && argc == 3) return lock_mode(argv[2]);
  if (strcmp(argv[1], "mount") == 0 && argc >= 5) return mount_mode(argc, argv);
  if (strcmp(argv[1], "umount-all") == 0 && argc == 3) return umount_all_mode(argv[2]);
  fprintf(stderr, "usage: tsbox-shim umount PATH | tsbox-shim umount-all PATH | tsbox-shim mount TARGET TYPE SOURCE [OPTION...] | tsbox-shim lock PATH | tsbox-shim peer PATH | tsbox-shim serve\n");
  return 2;
}

/* ---- the sandbox process ---- */

/* What the supervisor is asked to do, from its command line. */
static struct {
  const char *notify, *netns, *hostname, *cwd, *logpath, *shm, *shm_size;
  const char *cgroups[MAX_CGROUPS], *homes[MAX_CGROUPS], *sysctls[MAX_SYSCTLS];
  int ncgroups, nhomes, nsysctls, unshare_flags, hold;
  char **cmd;
  const char *task_socket, *link, *relay_log, *relay_log_max;
} opt = {.cwd = "/"};

/*
 * Moves the calling process into the cgroup directory `cgroup`; -1 with errno. On v1 "0" (the
 * caller) goes to the hierarchy's tasks file: the caller is single-threaded, so its one thread
 * is the whole process, and a thread that moves itself does not take the kernel's global
 * threadgroup lock, whose writer side waits for an RCU grace period (several ms on an idle
 * node, for every pod). v2 has no tasks file outside threaded subtrees: "0" to cgroup.procs.
 */
static int join_cgroup(const char *cgroup) {
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/cgroup.procs", cgroup) >= sizeof path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  snprintf(path, sizeof path, "%s/tasks", cgroup);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    snprintf(path, sizeof path, "%s/cgroup.procs", cgroup);
    fd = open(path, O_WRONLY | O_CLOEXEC);
  }
  if (fd < 0) return -1;
  if (sv_write_all(fd, "0", 1) < 0) {
    int saved = errno;
    (void)close(fd); /* the write already failed; errno says why */
    errno = saved;
    return -1;
  }
  return close(fd);
}

/* Closes every descriptor from `from` up except `keep`; -1 with errno. */
static int close_from(unsigned from, unsigned keep) {
  /* close_range(2) by number: not every C library has the wrapper (Linux 5.9 has the call). */
  if (keep > from && syscall(SYS_close_range, from, keep - 1, 0) < 0) return -1;
  return (int)syscall(SYS_close_range, keep >= from ? keep + 1 : from, ~0u, 0);
}

/*
 * The sandbox process, in its namespaces and cgroups: its own process group, private mounts
 * and its /proc, host name, sysctls, stdio, a clean signal state; then the command, or the
 * built-in pause. Every failure goes to the supervisor through the error pipe.
 */
static void run_sandbox(int logfd) {
  /* Its own process group, so tsbox can signal all of it. */
  if (setpgid(0, 0) < 0) child_fail("setpgid: %s", strerror(errno));
  if (opt.unshare_flags & CLONE_NEWNS) {
    /* Mounts stay inside the sandbox (a /proc mounted while / is shared would appear on the
       host); /proc shows the sandbox's own pid namespace. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) child_fail("mount / MS_REC|MS_PRIVATE: %s", strerror(errno));
    if ((opt.unshare_flags & CLONE_NEWPID) && mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
      child_fail("mount proc at /proc: %s", strerror(errno));
  }
  if ((opt.unshare_flags & CLONE_NEWUTS) && opt.hostname != NULL && sethostname(opt.hostname, strlen(opt.hostname)) < 0)
    child_fail("set hostname %s: %s", opt.hostname, strerror(errno));
  for (int i = 0; i < opt.nsysctls; i++) {
    int e = apply_sysctl(opt.sysctls[i]);
    if (e != 0) child_fail("set sysctl %s: %s", opt.sysctls[i], strerror(e));
  }
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) child_fail("open /dev/null: %s", strerror(errno));
  int out = logfd >= 0 ? logfd : devnull;
  const char *out_name = logfd >= 0 ? opt.logpath : "/dev/null";
  /* dup2 clears close-on-exec on the copies: 0, 1 and 2 survive the exec. */
  if (dup2(devnull, STDIN_FILENO) < 0) child_fail("dup2 /dev/null to stdin: %s", strerror(errno));
  if (dup2(out, STDOUT_FILENO) < 0) child_fail("dup2 %s to stdout: %s", out_name, strerror(errno));
  if (dup2(out, STDERR_FILENO) < 0) child_fail("dup2 %s to stderr: %s", out_name, strerror(errno));
  sigset_t none;
  if (sigemptyset(&none) < 0 || sigprocmask(SIG_SETMASK, &none, NULL) < 0) child_fail("sigprocmask: %s", strerror(errno));
  if (sv_set_signals(sv_detached_signals, SIG_DFL) < 0) child_fail("signal: %s", strerror(errno));
  if (opt.cmd == NULL) {
    /* The pause keeps only its stdio and, until it runs, the error pipe (the pod's sockets are
       close-on-exec; nothing else is left to it either). The exec closes the error pipe, which
       tells the shim the sandbox runs. */
    if (close_from(STDERR_FILENO + 1, (unsigned)errpipe_fd) < 0) child_fail("close_range: %s", strerror(errno));
    /* It names the sandbox's directory, as the supervisor does: ps tells whose pause it is. */
    char *const argv[] = {(char *)PAUSE_NAME, (char *)dir, NULL};
    char *const envp[] = {NULL};
    /* The signals the pause acts on are blocked across the exec (a mask survives it): one sent
       as soon as the shim hears the sandbox runs waits for the pause, rather than killing it. */
    sigset_t pause_set;
    if (sigemptyset(&pause_set) < 0 || sigaddset(&pause_set, SIGTERM) < 0 || sigaddset(&pause_set, SIGINT) < 0 || sigaddset(&pause_set, SIGCHLD) < 0 ||
        sigprocmask(SIG_BLOCK, &pause_set, NULL) < 0)
      child_fail("sigprocmask for the pause: %s", strerror(errno));
    execve(pause_path, argv, envp);
    child_fail("start the pause %s: %s", pause_path, strerror(errno));
  }
  if (chdir(opt.cwd) < 0) child_fail("chdir %s: %s", opt.cwd, strerror(errno));
  execvp(opt.cmd[0], opt.cmd);
  child_fail("start %s: %s", opt.cmd[0], strerror(errno));
}

/*
 * The child of the supervisor: joins the pod's cgroups and network namespace and unshares the
 * pod's namespaces, in that order (the cgroup first, so that all it does is counted there).
 * With a new pid namespace, whose pid 1 must be a child of this one, it forks the sandbox
 * process, tells the supervisor its pid through `pidpipe`, and exits: the supervisor, a
 * subreaper, becomes the sandbox's parent. Without one it is the sandbox process itself.
 */
static void start_child(int errpipe[2], int pidpipe[2], int logfd) {
  errpipe_fd = errpipe[1];
  if (close(errpipe[0]) < 0) child_fail("close: %s", strerror(errno));
  if (pidpipe[0] >= 0 && close(pidpipe[0]) < 0) child_fail("close: %s", strerror(errno));
  for (int i = 0; i < opt.ncgroups; i++)
    if (join_cgroup(opt.cgroups[i]) < 0) child_fail("join cgroup %s: %s", opt.cgroups[i], strerror(errno));
  if (opt.netns != NULL) {
    /* Non-blocking, and checked before setns: a FIFO or device named by a caller
       must fail the start, never hang it. */
    int fd = open(opt.netns, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) child_fail("open network namespace %s: %s", opt.netns, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) child_fail("stat network namespace %s: %s", opt.netns, strerror(errno));
    if (!S_ISREG(st.st_mode)) child_fail("%s is not a network namespace", opt.netns);
    if (setns(fd, CLONE_NEWNET) < 0) child_fail("join network namespace %s: %s", opt.netns, strerror(errno));
    if (close(fd) < 0) child_fail("close network namespace %s: %s", opt.netns, strerror(errno));
  }
  if (opt.unshare_flags != 0 && unshare(opt.unshare_flags) < 0) child_fail("unshare namespaces: %s", strerror(errno));
  if (!(opt.unshare_flags & CLONE_NEWPID)) run_sandbox(logfd);
  pid_t sandbox = fork();
  if (sandbox < 0) child_fail("fork the sandbox process: %s", strerror(errno));
  if (sandbox == 0) {
    if (close(pidpipe[1]) < 0) child_fail("close: %s", strerror(errno));
    run_sandbox(logfd);
  }
  if (sv_write_all(pidpipe[1], (const char *)&sandbox, sizeof sandbox) < 0) {
    int e = errno;
    /* The supervisor cannot learn which process to wait for: the sandbox must not run. */
    if (kill(sandbox, SIGKILL) < 0) child_fail("tell the sandbox process's pid: %s; then kill it: %s", strerror(e), strerror(errno));
    child_fail("tell the sandbox process's pid: %s", strerror(e));
  }
  _exit(0);
}

/* ---- the sandbox's end ---- */

/*
 * The sandbox process has ended, or is about to: takes the time of its exit while it is still a
 * zombie (WNOWAIT), never later than the moment it is gone from /proc; reaps it; writes the
 * exit file durably and touches the notice. Returns the shim's exit status: 0, 2 when the exit
 * file could not be written, 3 when the notice could not be touched.
 */
static int record_exit(pid_t sandbox) {
  struct sv_exit exited;
  sv_reap(sandbox, &exited);
  const char *call = NULL;
  int rc = sv_record_exit(dir, &exited, opt.notify, &call);
  int saved = errno;
  if (rc == 2) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/exit", dir);
    relay_log_errno(RELAY_ERROR, "cannot write the sandbox's exit file", saved, call, path);
    return 2;
  }
  relay_log(RELAY_INFO, "sandbox process exited; its exit file is written", "status", exited.status);
  /* tsbox's poll of the supervisor finds the exit */
  if (rc == 3) relay_log_errno(RELAY_WARN, "cannot touch the exit notice", saved, call, opt.notify);
  return rc;
}

/* ---- relay mode ---- */

/* The sandbox process while it runs; 0 once its end is recorded. */
static pid_t sandbox_pid;
/* The shim's exit status once the sandbox's end is recorded (record_exit); -1 before. */
static int ended_status = -1;
static int signals_fd = -1;

/* Reaps every child that has ended: the sandbox with its exit recorded, orphans silently. */
static void reap_children(void) {
  for (;;) {
    const char *call = NULL;
    pid_t ended = sv_reap_others(sandbox_pid, &call);
    if (ended < 0) {
      relay_log_errno(RELAY_ERROR, strcmp(call, "waitid") == 0 ? "cannot wait for the pod's processes" : "cannot reap an orphaned process", errno, call, NULL);
      return;
    }
    if (ended == 0) return;
    ended_status = record_exit(sandbox_pid);
    sandbox_pid = 0;
  }
}

/* SIGCHLD and SIGTERM, read from the signalfd by the relay's loop. */
static void on_signals(void *arg) {
  (void)arg;
  for (;;) {
    struct signalfd_siginfo si;
    ssize_t n = read(signals_fd, &si, sizeof si);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) relay_log_errno(RELAY_ERROR, "cannot read the signals", errno, "read", "signalfd");
    if (n != (ssize_t)sizeof si) return;
    /* A sandbox that has just ended is recorded before a SIGTERM is judged. */
    reap_children();
    if (si.ssi_signo != SIGTERM) continue;
    if (ended_status < 0) {
      relay_log(RELAY_INFO, "SIGTERM ignored: the sandbox process runs", "sandboxPid", sandbox_pid);
      continue;
    }
    relay_log(RELAY_INFO, "SIGTERM: the pod's process ends; its sockets are removed", NULL, 0);
    relay_unlink();
    relay_stop(ended_status);
    return;
  }
}

/*
 * Serves the pod's task socket for as long as tsbox wants it, and records the sandbox's end
 * when it comes. Returns the shim's exit status.
 */
static int run_relay(pid_t sandbox) {
  sandbox_pid = sandbox;
  /* Room for every connection it admits (as Node allows itself the hard limit); after the fork,
     so that the sandbox process keeps the limit it was given. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
    relay_log_errno(RELAY_WARN, "cannot raise the limit on descriptors", errno, "getrlimit", "RLIMIT_NOFILE");
  } else if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0) relay_log_errno(RELAY_WARN, "cannot raise the limit on descriptors", errno, "setrlimit", "RLIMIT_NOFILE");
  }
  /* Buffers of 128 KiB and more (frames on their way, answers queued) are mapped and given
     back whole when freed: glibc's moving threshold would otherwise keep what an attack made
     the relay hold in its heap for good. */
#ifdef __GLIBC__
  if (mallopt(M_MMAP_THRESHOLD, 128 * 1024) == 0) relay_log_errno(RELAY_WARN, "cannot set the heap's mapping threshold", EINVAL, "mallopt", "M_MMAP_THRESHOLD");
#endif /* musl maps large buffers and gives them back whole by itself */
  /* A sandbox that ended before the signalfd was watched. */
  reap_children();
  int rc = relay_run();
  if (rc >= 0) return rc;
  /* The loop cannot wait any more: nobody serves the sockets, and the exit is still owed. */
  relay_unlink();
  if (sandbox_pid > 0) return record_exit(sandbox_pid);
  return ended_status;
}

/* ---- the supervisor ---- */

/*
 * The supervisor's start, up to its answer: returns the sandbox process's pid. Not inlined: its
 * frame (the start's buffers) is gone before the supervisor waits out the rest of its life.
 */
static __attribute__((noinline)) pid_t start_supervisor(int argc, char **argv) {
  sv_answer_undo(undo_start);

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--") == 0) {
      if (i + 1 < argc) opt.cmd = &argv[i + 1];
      break;
    } else if (strcmp(a, "--hold") == 0) {
      opt.hold = 1;
    } else if (v == NULL) {
      sv_fail("option %s needs a value", a);
    } else if (strcmp(a, "--dir") == 0) {
      dir = v, i++;
    } else if (strcmp(a, "--notify") == 0) {
      opt.notify = v, i++;
    } else if (strcmp(a, "--netns") == 0) {
      opt.netns = v, i++;
    } else if (strcmp(a, "--hostname") == 0) {
      opt.hostname = v, i++;
    } else if (strcmp(a, "--cwd") == 0) {
      opt.cwd = v, i++;
    } else if (strcmp(a, "--log") == 0) {
      opt.logpath = v, i++;
    } else if (strcmp(a, "--unshare") == 0) {
      char list[64];
      snprintf(list, sizeof list, "%s", v);
      for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "pid") == 0) opt.unshare_flags |= CLONE_NEWPID;
        else if (strcmp(tok, "ipc") == 0) opt.unshare_flags |= CLONE_NEWIPC;
        else if (strcmp(tok, "uts") == 0) opt.unshare_flags |= CLONE_NEWUTS;
        else if (strcmp(tok, "mnt") == 0) opt.unshare_flags |= CLONE_NEWNS;
        else sv_fail("unknown namespace %s in --unshare", tok);
      }
      i++;
    } else if (strcmp(a, "--shm") == 0) {
      opt.shm = v, i++;
    } else if (strcmp(a, "--shm-size") == 0) {
      opt.shm_size = v, i++;
    } else if (strcmp(a, "--sysctl") == 0) {
      if (opt.nsysctls == MAX_SYSCTLS) sv_fail("too many --sysctl options");
      opt.sysctls[opt.nsysctls++] = v, i++;
    } else if (strcmp(a, "--cgroup") == 0) {
      if (opt.ncgroups == MAX_CGROUPS) sv_fail("too many --cgroup options");
      opt.cgroups[opt.ncgroups++] = v, i++;
    } else if (strcmp(a, "--home") == 0) {
      if (opt.nhomes == MAX_CGROUPS) sv_fail("too many --home options");
      opt.homes[opt.nhomes++] = v, i++;
    } else if (strcmp(a, "--task-socket") == 0) {
      opt.task_socket = v, i++;
    } else if (strcmp(a, "--link") == 0) {
      opt.link = v, i++;
    } else if (strcmp(a, "--relay-log") == 0) {
      opt.relay_log = v, i++;
    } else if (strcmp(a, "--relay-log-max-bytes") == 0) {
      opt.relay_log_max = v, i++;
    } else {
      sv_fail("unknown option %s", a);
    }
  }
  if (dir == NULL) sv_fail("--dir is required");
  int relay_mode = opt.task_socket != NULL || opt.link != NULL;
  if (relay_mode && (opt.task_socket == NULL || opt.link == NULL)) sv_fail("--task-socket and --link go together");
  if (!relay_mode && (opt.relay_log != NULL || opt.relay_log_max != NULL)) sv_fail("--relay-log and --relay-log-max-bytes need --task-socket and --link");
  unsigned long long relay_log_max = 0;
  if (opt.relay_log_max != NULL) {
    char *end;
    errno = 0;
    relay_log_max = strtoull(opt.relay_log_max, &end, 10);
    if (errno != 0 || end == opt.relay_log_max || *end != '\0' || opt.relay_log_max[0] == '-' || relay_log_max < RELAY_LOG_MIN_BYTES)
      sv_fail("--relay-log-max-bytes must be a whole number of bytes, at least %llu", RELAY_LOG_MIN_BYTES);
  }
  unsigned long long shm_bytes = 0;
  if (opt.shm != NULL) {
    char *end;
    shm_bytes = opt.shm_size == NULL ? 0 : strtoull(opt.shm_size, &end, 10);
    if (opt.shm_size == NULL || *end != '\0' || shm_bytes == 0) sv_fail("--shm needs --shm-size BYTES");
  }

  if (opt.cmd == NULL) find_pause();
  /* The shim must outlive terminals and tsbox itself; stray signals must not end it. */
  if (sv_set_signals(sv_detached_signals, SIG_IGN) < 0) sv_fail("signal: %s", strerror(errno));
  if (chdir("/") < 0) sv_fail("chdir /: %s", strerror(errno));
  if (opt.hold) {
    char go;
    ssize_t n;
    do n = read(STDIN_FILENO, &go, 1);
    while (n < 0 && errno == EINTR);
    if (n < 0) sv_fail("read the go-ahead on stdin: %s", strerror(errno));
    if (n == 0) sv_fail("the start was given up before the go-ahead");
  }
  /* In the host's mount namespace, which the shim never leaves. */
  if (opt.shm != NULL && mount_shm(opt.shm, shm_bytes) < 0) sv_fail("mount tmpfs at %s: %s", opt.shm, strerror(errno));

  /* The relay keeps pointing at these for its whole life. */
  static struct relay_options relay;
  if (relay_mode) {
    relay = (struct relay_options){
        .task_socket = opt.task_socket,
        .link_socket = opt.link,
        .log_path = opt.relay_log,
        .log_max_bytes = relay_log_max,
        .services = private_services,
        .hello = VERSION_TEXT(POD_PROTOCOL_VERSION),
    };
    char why[PATH_MAX + 128];
    if (relay_listen(&relay, why, sizeof why) < 0) sv_fail("%s", why);
    relay_bound = 1;
    /* Blocked before the fork, so that no SIGCHLD is lost before the signalfd reads them; the
       sandbox process clears its mask before it runs. */
    sigset_t mask;
    if (sigemptyset(&mask) < 0 || sigaddset(&mask, SIGCHLD) < 0 || sigaddset(&mask, SIGTERM) < 0 || sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
      sv_fail("sigprocmask SIGCHLD|SIGTERM: %s", strerror(errno));
    signals_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (signals_fd < 0) sv_fail("signalfd SIGCHLD|SIGTERM: %s", strerror(errno));
    if (relay_watch(signals_fd, on_signals, NULL) < 0) sv_fail("epoll_ctl signalfd: %s", strerror(errno));
  }
  /* The sandbox process of a new pid namespace is a grandchild: it must come back to the shim
     when the child between them exits. So must orphans of the pod's, which the relay reaps. */
  if (((opt.unshare_flags & CLONE_NEWPID) || relay_mode) && prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
    sv_fail("prctl PR_SET_CHILD_SUBREAPER: %s", strerror(errno));

  int errpipe[2], pidpipe[2] = {-1, -1};
  if (pipe2(errpipe, O_CLOEXEC) < 0) sv_fail("pipe: %s", strerror(errno));
  if ((opt.unshare_flags & CLONE_NEWPID) && pipe2(pidpipe, O_CLOEXEC) < 0) sv_fail("pipe: %s", strerror(errno));
  int logfd = -1;
  if (opt.logpath != NULL) {
    logfd = open(opt.logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) sv_fail("open log %s: %s", opt.logpath, strerror(errno));
  }

  pid_t forked = fork();
  if (forked < 0) sv_fail("fork: %s", strerror(errno));
  if (forked == 0) start_child(errpipe, pidpipe, logfd);
  if (opt.unshare_flags & CLONE_NEWPID) middle = forked;
  else child = forked;
  if (close(errpipe[1]) < 0) sv_fail("close: %s", strerror(errno));
  if (pidpipe[1] >= 0 && close(pidpipe[1]) < 0) sv_fail("close: %s", strerror(errno));
  if (logfd >= 0 && close(logfd) < 0) sv_fail("close log %s: %s", opt.logpath, strerror(errno));

  if (middle > 0) {
    /* The sandbox process's pid, or nothing when the child failed before it forked it. */
    pid_t sandbox = 0;
    size_t got = 0;
    while (got < sizeof sandbox) {
      ssize_t n = read(pidpipe[0], (char *)&sandbox + got, sizeof sandbox - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) sv_fail("read the sandbox process's pid: %s", strerror(errno));
      if (n == 0) break;
      got += (size_t)n;
    }
    if (close(pidpipe[0]) < 0) sv_fail("close: %s", strerror(errno));
    if (got == sizeof sandbox) child = sandbox;
    /* Reaped: from here the sandbox process is the shim's child (the shim is a subreaper). */
    int status;
    pid_t r;
    do r = waitpid(middle, &status, 0);
    while (r < 0 && errno == EINTR);
    if (r < 0) sv_fail("waitpid %d: %s", (int)middle, strerror(errno));
    middle = 0;
    if (got != sizeof sandbox && !(WIFEXITED(status) && WEXITSTATUS(status) == 127))
      sv_fail("the child that starts the sandbox process ended (%s %d) before it told its pid", WIFSIGNALED(status) ? "signal" : "status",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  }

  char msg[1024];
  ssize_t n;
  do n = read(errpipe[0], msg, sizeof msg - 1);
  while (n < 0 && errno == EINTR);
  if (n < 0) sv_fail("read from the sandbox process: %s", strerror(errno));
  if (n > 0) {
    msg[n] = '\0';
    sv_fail("%s", msg);
  }
  if (close(errpipe[0]) < 0) sv_fail("close: %s", strerror(errno));
  /* The sandbox process runs: the shim leaves the pod's cgroup for its own. */
  for (int i = 0; i < opt.nhomes; i++)
    if (join_cgroup(opt.homes[i]) < 0) sv_fail("join home cgroup %s: %s", opt.homes[i], strerror(errno));

  /* From here the shim's own stdio is /dev/null; the answer goes to a copy of stdout. */
  sv_answer_detach();

  /* "<shim-pid> <sandbox-pid>"; not fsynced: a crash of tsbox leaves it in the page cache. */
  const struct sv_process pids[] = {{getpid(), 0}, {child, 0}};
  if (sv_write_pids(dir, "pid", pids, 2, 0) < 0) sv_fail("write %s/pid: %s", dir, strerror(errno));
  /* Started through `serve`'s spawn: from its answer on, it outlives the request. */
  if (prctl(PR_SET_PDEATHSIG, 0) < 0) sv_fail("prctl PR_SET_PDEATHSIG: %s", strerror(errno));
  /* The sandbox runs: from here a failure is the exit status's to tell, not the answer's. */
  pid_t sandbox = child;
  child = 0;
  relay_bound = 0;
  sv_answer_ok(getpid(), sandbox);
  return sandbox;
}

int main(int argc, char **argv) {
  const char *slash = argc > 0 ? strrchr(argv[0], '/') : NULL;
  if (argc > 0 && strcmp(slash == NULL ? argv[0] : slash + 1, HOLDER_NAME) == 0) return holder_main(argc, argv);
  if (argc > 1 && argv[1][0] != '-') return helper_mode(argc, argv);
  pid_t sandbox = start_supervisor(argc, argv);
  /* What only the start needed goes back: the pod's process keeps its steady state alone. */
  sv_release(pause_path, sizeof pause_path);
  sv_shed();
  if (opt.task_socket != NULL) return run_relay(sandbox);
  return record_exit(sandbox);
}
