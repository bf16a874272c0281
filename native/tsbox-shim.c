/*
 * tsbox-shim: the per-sandbox supervisor.
 *
 * tsbox starts one shim per sandbox, detached in its own session. The shim
 * joins the sandbox's cgroups and network namespace, unshares the namespaces
 * it is told to (pid, ipc, uts, mount), and forks the sandbox's main process
 * (pid 1 of its pid namespace). It is that process's parent for its whole life, so it
 * alone can read the real exit status: when the process ends it writes
 * "<status> <seconds> <nanoseconds>" to <dir>/exit atomically (temp file,
 * fsync, rename, fsync of the directory), touches the notify file, and exits.
 * That is what lets an exit code survive a restart or a crash of tsbox.
 *
 * Protocol with tsbox, on the shim's stdout (a pipe), one line, then EOF:
 *   "ok <shim-pid> <sandbox-pid>\n"  the sandbox process runs (exec succeeded)
 *   "error <message>\n"              nothing runs; the shim exits 1
 * The shim also writes "<shim-pid> <sandbox-pid>\n" to <dir>/pid before it
 * answers, so a sandbox that runs always has a record naming it.
 *
 * Usage: tsbox-shim --dir DIR [--notify FILE] [--netns PATH] [--hostname NAME]
 *                   [--cgroup DIR]... [--hold] [--unshare pid,ipc,uts,mnt] [--cwd DIR]
 *                   [--sysctl KEY=VALUE]... [--shm PATH --shm-size BYTES]
 *                   [--log FILE] [-- ARGV...]
 * Without ARGV the sandbox process is a built-in pause that sleeps until it is
 * signalled, reaps every orphan the pod's containers leave to it (it is pid 1
 * of the pod's pid namespace), and exits 0 on SIGTERM or SIGINT, as the
 * Kubernetes pause does. Each namespace named by --unshare is the sandbox's
 * own; the others are the host's (a pod's NODE namespace modes). Sysctls are
 * written inside the sandbox's namespaces, before its process runs.
 *
 * --hold makes the shim wait, before it joins anything or forks, for one byte on its
 * stdin: meanwhile tsbox has systemd move it into the sandbox's scope, so the sandbox
 * process starts there. EOF instead of the byte means the start was given up: exit 1.
 *
 * --shm mounts the pod's /dev/shm (a tmpfs, mode 1777) at PATH before anything is
 * unshared: it must live in the host's mount namespace, where CRI bind-mounts it into
 * containers. A helper mode undoes it for tsbox at Stop:
 *   tsbox-shim umount PATH    detaches whatever is mounted at PATH; exit 0 on success,
 *                             else the reason on stderr and exit 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CGROUPS 16
#define MAX_SYSCTLS 128

static const char *dir;
static char reply[1024];

static void fail(const char *fmt, ...) {
  va_list ap;
  int n = snprintf(reply, sizeof reply, "error ");
  va_start(ap, fmt);
  vsnprintf(reply + n, sizeof reply - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = strlen(reply);
  reply[len] = '\n';
  if (write(STDOUT_FILENO, reply, len + 1) < 0) { /* tsbox is gone: nobody to tell */ }
  _exit(1);
}

static int write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/*
 * Writes <dir>/<name> atomically (temp file, rename); `durable` also fsyncs the file and
 * the directory, so that it survives a crash of the machine, not only of tsbox.
 */
static int write_file_atomic(const char *name, const char *content, int durable) {
  char tmp[4096], path[4096];
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  if (write_all(fd, content, strlen(content)) < 0 || (durable && fsync(fd) < 0)) {
    close(fd);
    return -1;
  }
  close(fd);
  if (rename(tmp, path) < 0) return -1;
  if (!durable) return 0;
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return 0;
}

static void on_stop_signal(int sig) { _exit(sig == SIGTERM || sig == SIGINT ? 0 : 128 + sig); }

/* As pid 1 of the pod, the pause process inherits every orphan: reap them all. */
static void on_child(int sig) {
  (void)sig;
  int saved = errno;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

static void pause_forever(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  struct sigaction sc;
  memset(&sc, 0, sizeof sc);
  sc.sa_handler = on_child;
  sc.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sc, NULL);
  on_child(SIGCHLD);
  for (;;) pause();
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
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int rc = write_all(fd, eq + 1, strlen(eq + 1)) < 0 ? errno : 0;
  close(fd);
  return rc;
}

static int mount_shm(const char *path, unsigned long long bytes) {
  char data[64];
  snprintf(data, sizeof data, "mode=1777,size=%llu", bytes);
  return mount("shm", path, "tmpfs", MS_NOEXEC | MS_NOSUID | MS_NODEV, data);
}

static int helper_mode(int argc, char **argv) {
  if (strcmp(argv[1], "umount") == 0 && argc == 3) {
    if (umount2(argv[2], MNT_DETACH | UMOUNT_NOFOLLOW) < 0 && errno != EINVAL && errno != ENOENT) {
      fprintf(stderr, "unmount %s: %s\n", argv[2], strerror(errno));
      return 1;
    }
    return 0;
  }
  fprintf(stderr, "usage: tsbox-shim umount PATH\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc > 1 && argv[1][0] != '-') return helper_mode(argc, argv);
  const char *notify = NULL, *netns = NULL, *hostname = NULL, *cwd = "/", *logpath = NULL;
  const char *shm = NULL, *shm_size = NULL;
  const char *cgroups[MAX_CGROUPS];
  const char *sysctls[MAX_SYSCTLS];
  int ncgroups = 0, nsysctls = 0, unshare_flags = 0, hold = 0;
  char **cmd = NULL;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--") == 0) {
      if (i + 1 < argc) cmd = &argv[i + 1];
      break;
    } else if (strcmp(a, "--hold") == 0) {
      hold = 1;
    } else if (v == NULL) {
      fail("option %s needs a value", a);
    } else if (strcmp(a, "--dir") == 0) {
      dir = v, i++;
    } else if (strcmp(a, "--notify") == 0) {
      notify = v, i++;
    } else if (strcmp(a, "--netns") == 0) {
      netns = v, i++;
    } else if (strcmp(a, "--hostname") == 0) {
      hostname = v, i++;
    } else if (strcmp(a, "--cwd") == 0) {
      cwd = v, i++;
    } else if (strcmp(a, "--log") == 0) {
      logpath = v, i++;
    } else if (strcmp(a, "--unshare") == 0) {
      char list[64];
      snprintf(list, sizeof list, "%s", v);
      for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "pid") == 0) unshare_flags |= CLONE_NEWPID;
        else if (strcmp(tok, "ipc") == 0) unshare_flags |= CLONE_NEWIPC;
        else if (strcmp(tok, "uts") == 0) unshare_flags |= CLONE_NEWUTS;
        else if (strcmp(tok, "mnt") == 0) unshare_flags |= CLONE_NEWNS;
        else fail("unknown namespace %s in --unshare", tok);
      }
      i++;
    } else if (strcmp(a, "--shm") == 0) {
      shm = v, i++;
    } else if (strcmp(a, "--shm-size") == 0) {
      shm_size = v, i++;
    } else if (strcmp(a, "--sysctl") == 0) {
      if (nsysctls == MAX_SYSCTLS) fail("too many --sysctl options");
      sysctls[nsysctls++] = v, i++;
    } else if (strcmp(a, "--cgroup") == 0) {
      if (ncgroups == MAX_CGROUPS) fail("too many --cgroup options");
      cgroups[ncgroups++] = v, i++;
    } else {
      fail("unknown option %s", a);
    }
  }
  if (dir == NULL) fail("--dir is required");

  /* The shim must outlive terminals and tsbox itself; stray signals must not end it. */
  signal(SIGHUP, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  if (chdir("/") < 0) fail("chdir /: %s", strerror(errno));
  if (hold) {
    char go;
    ssize_t n;
    do n = read(STDIN_FILENO, &go, 1);
    while (n < 0 && errno == EINTR);
    if (n < 0) fail("read the go-ahead on stdin: %s", strerror(errno));
    if (n == 0) fail("the start was given up before the go-ahead");
  }

  /*
   * Joining a cgroup. On v1 the supervisor writes "0" (itself) to the hierarchy's tasks file:
   * it is single-threaded, so its one thread is the whole process, and a thread that moves
   * itself does not take the kernel's global threadgroup lock, whose writer side waits for an
   * RCU grace period (several ms on an idle node, for every pod). v2 has no tasks file outside
   * threaded subtrees: cgroup.procs with the pid.
   */
  char pidbuf[32];
  snprintf(pidbuf, sizeof pidbuf, "%d", (int)getpid());
  for (int i = 0; i < ncgroups; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tasks", cgroups[i]);
    const char *what = "0";
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
      snprintf(path, sizeof path, "%s/cgroup.procs", cgroups[i]);
      what = pidbuf;
      fd = open(path, O_WRONLY | O_CLOEXEC);
    }
    if (fd < 0 || write_all(fd, what, strlen(what)) < 0) fail("join cgroup %s: %s", cgroups[i], strerror(errno));
    close(fd);
  }
  if (shm != NULL) {
    char *end;
    unsigned long long bytes = shm_size == NULL ? 0 : strtoull(shm_size, &end, 10);
    if (shm_size == NULL || *end != '\0' || bytes == 0) fail("--shm needs --shm-size BYTES");
    if (mount_shm(shm, bytes) < 0) fail("mount tmpfs at %s: %s", shm, strerror(errno));
  }
  if (netns != NULL) {
    /* Non-blocking, and checked before setns: a FIFO or device named by a caller
       must fail the start, never hang it. */
    int fd = open(netns, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) fail("open network namespace %s: %s", netns, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) fail("%s is not a network namespace", netns);
    if (setns(fd, CLONE_NEWNET) < 0) fail("join network namespace %s: %s", netns, strerror(errno));
    close(fd);
  }
  if (unshare_flags != 0 && unshare(unshare_flags) < 0)
    fail("unshare namespaces: %s", strerror(errno));

  int errpipe[2];
  if (pipe2(errpipe, O_CLOEXEC) < 0) fail("pipe: %s", strerror(errno));
  int logfd = -1;
  if (logpath != NULL) {
    logfd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) fail("open log %s: %s", logpath, strerror(errno));
  }

  pid_t child = fork();
  if (child < 0) fail("fork: %s", strerror(errno));
  if (child == 0) {
    /* The sandbox process: its own process group, so tsbox can signal all of it. */
    close(errpipe[0]);
    setpgid(0, 0);
    if (unshare_flags & CLONE_NEWNS) {
      /* Mounts stay inside the sandbox; /proc shows the sandbox's own pid namespace. */
      mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
      if (unshare_flags & CLONE_NEWPID) mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    }
    if ((unshare_flags & CLONE_NEWUTS) && hostname != NULL && sethostname(hostname, strlen(hostname)) < 0) {
      int e = errno;
      (void)!write(errpipe[1], &e, sizeof e);
      _exit(127);
    }
    for (int i = 0; i < nsysctls; i++) {
      int e = apply_sysctl(sysctls[i]);
      if (e != 0) {
        /* The parent reports which one: the index travels after the errno. */
        int msg[2] = {e, i + 1};
        (void)!write(errpipe[1], msg, sizeof msg);
        _exit(127);
      }
    }
    int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, STDIN_FILENO);
    dup2(logfd >= 0 ? logfd : devnull, STDOUT_FILENO);
    dup2(logfd >= 0 ? logfd : devnull, STDERR_FILENO);
    if (devnull > STDERR_FILENO) close(devnull);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    if (cmd == NULL) {
      close(errpipe[1]); /* nothing to exec: tell the shim the sandbox runs */
      pause_forever();
    }
    if (chdir(cwd) < 0) {
      int e = errno;
      (void)!write(errpipe[1], &e, sizeof e);
      _exit(127);
    }
    execvp(cmd[0], cmd);
    int e = errno;
    (void)!write(errpipe[1], &e, sizeof e);
    _exit(127);
  }
  close(errpipe[1]);
  if (logfd >= 0) close(logfd);

  int msg[2] = {0, 0};
  ssize_t n;
  do n = read(errpipe[0], msg, sizeof msg);
  while (n < 0 && errno == EINTR);
  close(errpipe[0]);
  if (n > 0) {
    waitpid(child, NULL, 0);
    if (msg[1] > 0 && msg[1] <= nsysctls) fail("set sysctl %s: %s", sysctls[msg[1] - 1], strerror(msg[0]));
    if (cmd != NULL) fail("start %s: %s", cmd[0], strerror(msg[0]));
    fail("set up sandbox: %s", strerror(msg[0]));
  }

  char pids[64];
  snprintf(pids, sizeof pids, "%d %d\n", (int)getpid(), (int)child);
  /* Not fsynced: the pid file matters only while the processes it names run, and they do
     not outlive the machine; a crash of tsbox leaves it in the page cache. */
  if (write_file_atomic("pid", pids, 0) < 0) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    fail("write %s/pid: %s", dir, strerror(errno));
  }
  snprintf(reply, sizeof reply, "ok %s", pids);
  if (write_all(STDOUT_FILENO, reply, strlen(reply)) < 0) { /* tsbox reads the pid file instead */ }
  int devnull = open("/dev/null", O_RDWR);
  dup2(devnull, STDIN_FILENO);
  dup2(devnull, STDOUT_FILENO);
  dup2(devnull, STDERR_FILENO);
  if (devnull > STDERR_FILENO) close(devnull);

  int status;
  pid_t r;
  do r = waitpid(child, &status, 0);
  while (r < 0 && errno == EINTR);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  int code = 255;
  if (r == child && WIFEXITED(status)) code = WEXITSTATUS(status);
  else if (r == child && WIFSIGNALED(status)) code = 128 + WTERMSIG(status);

  char exitline[96];
  snprintf(exitline, sizeof exitline, "%d %lld %ld\n", code, (long long)now.tv_sec, now.tv_nsec);
  /* Durable: after a reboot it is the only record of how the sandbox ended. */
  if (write_file_atomic("exit", exitline, 1) < 0) return 2;
  if (notify != NULL) {
    int fd = open(notify, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
  }
  return 0;
}
