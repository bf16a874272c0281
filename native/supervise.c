/*
 * supervise: records, the answer to tsbox, unix sockets and the unmount of a tree, shared by
 * tsbox's supervising programs (supervise.h says what each part is for).
 */
#define _GNU_SOURCE
#include "supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- files ---- */

int sv_write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int sv_path(char *out, size_t size, const char *dir, const char *name) {
  int n = snprintf(out, size, "%s/%s", dir, name);
  if (n < 0) return -1;
  if ((size_t)n >= size) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return 0;
}

int sv_write_file_atomic(const char *dir, const char *name, const char *content, int durable) {
  char tmp[PATH_MAX], path[PATH_MAX], hidden[NAME_MAX + 2];
  if ((size_t)snprintf(hidden, sizeof hidden, ".%s.tmp", name) >= sizeof hidden) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (sv_path(tmp, sizeof tmp, dir, hidden) < 0 || sv_path(path, sizeof path, dir, name) < 0) return -1;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  if (sv_write_all(fd, content, strlen(content)) < 0 || (durable && fsync(fd) < 0)) {
    int saved = errno;
    (void)close(fd); /* the write already failed; errno says why */
    errno = saved;
    return -1;
  }
  if (close(fd) < 0) return -1;
  if (rename(tmp, path) < 0) return -1;
  if (!durable) return 0;
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -1;
  if (fsync(dfd) < 0) {
    int saved = errno;
    (void)close(dfd); /* the fsync already failed; errno says why */
    errno = saved;
    return -1;
  }
  return close(dfd);
}

int sv_write_text(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  if (sv_write_all(fd, text, strlen(text)) < 0) {
    int saved = errno;
    (void)close(fd); /* the write's error is the one to tell */
    errno = saved;
    return -1;
  }
  return close(fd);
}

ssize_t sv_read_file(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = 0;
  while (len + 1 < size) {
    ssize_t n = read(fd, buf + len, size - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int saved = errno;
      (void)close(fd); /* the read's error is the one to tell */
      errno = saved;
      return -1;
    }
    if (n == 0) break;
    len += (size_t)n;
  }
  if (close(fd) < 0) { /* read-only: nothing was lost */ }
  buf[len] = '\0';
  return (ssize_t)len;
}

int sv_touch(const char *path, const char **call) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (call != NULL) *call = "open";
    return -1;
  }
  if (close(fd) < 0) {
    if (call != NULL) *call = "close";
    return -1;
  }
  return 0;
}

/* ---- processes ---- */

int sv_read_stat(pid_t pid, char *buf, size_t size) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  return sv_read_file(path, buf, size) < 0 ? -1 : 0;
}

unsigned long long sv_start_time(pid_t pid) {
  char buf[1024];
  if (sv_read_stat(pid, buf, sizeof buf) < 0) return 0;
  /* The command name (field 2) may contain spaces and ')': fields count from the last ')'. */
  char *p = strrchr(buf, ')');
  if (p == NULL) {
    errno = EINVAL;
    return 0;
  }
  p++;
  for (int field = 2; field < 21 && p != NULL; field++) p = strchr(p + 1, ' ');
  if (p == NULL) {
    errno = EINVAL;
    return 0;
  }
  errno = 0;
  unsigned long long v = strtoull(p + 1, NULL, 10);
  if (v == 0 && errno == 0) errno = EINVAL;
  return v;
}

int sv_write_pids(const char *dir, const char *name, const struct sv_process *procs, size_t n, int with_start) {
  char line[256];
  size_t len = 0;
  for (size_t i = 0; i < n; i++) {
    int w = with_start ? snprintf(line + len, sizeof line - len, "%s%d %llu", i > 0 ? " " : "", (int)procs[i].pid, procs[i].start)
                       : snprintf(line + len, sizeof line - len, "%s%d", i > 0 ? " " : "", (int)procs[i].pid);
    if (w < 0 || (size_t)w + 2 > sizeof line - len) {
      errno = EOVERFLOW;
      return -1;
    }
    len += (size_t)w;
  }
  line[len++] = '\n';
  line[len] = '\0';
  return sv_write_file_atomic(dir, name, line, 0);
}

void sv_reap(pid_t pid, struct sv_exit *out) {
  siginfo_t exited;
  int w;
  do w = waitid(P_PID, (id_t)pid, &exited, WEXITED | WNOWAIT);
  while (w < 0 && errno == EINTR);
  struct timespec now = {0, 0};
  if (w == 0 && clock_gettime(CLOCK_REALTIME, &now) < 0) now = (struct timespec){0, 0};
  int status;
  pid_t r;
  do r = waitpid(pid, &status, 0);
  while (r < 0 && errno == EINTR);
  if (w < 0 && clock_gettime(CLOCK_REALTIME, &now) < 0) now = (struct timespec){0, 0};
  out->status = 255;
  if (r == pid && WIFEXITED(status)) out->status = WEXITSTATUS(status);
  else if (r == pid && WIFSIGNALED(status)) out->status = 128 + WTERMSIG(status);
  out->at = now;
}

pid_t sv_reap_others(pid_t keep, const char **call) {
  for (;;) {
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) < 0) {
      if (errno == EINTR) continue;
      if (errno == ECHILD) return 0;
      if (call != NULL) *call = "waitid";
      return -1;
    }
    if (si.si_pid == 0) return 0;
    if (keep > 0 && si.si_pid == keep) return keep;
    /* An orphan the subreaper inherited: nobody waits for its status. */
    pid_t r;
    do r = waitpid(si.si_pid, NULL, 0);
    while (r < 0 && errno == EINTR);
    if (r < 0) {
      if (call != NULL) *call = "waitpid";
      return -1;
    }
  }
}

int sv_exit_line(const struct sv_exit *e, char *buf, size_t size) {
  return snprintf(buf, size, "%d %lld %ld", e->status, (long long)e->at.tv_sec, e->at.tv_nsec);
}

int sv_record_exit(const char *dir, const struct sv_exit *e, const char *notify, const char **call) {
  char line[112];
  int n = sv_exit_line(e, line, sizeof line - 1);
  line[n] = '\n';
  line[n + 1] = '\0';
  if (sv_write_file_atomic(dir, "exit", line, 1) < 0) {
    if (call != NULL) *call = "write";
    return 2;
  }
  if (notify != NULL && sv_touch(notify, call) < 0) return 3;
  return 0;
}

/* ---- signals ---- */

const int sv_detached_signals[] = {SIGHUP, SIGINT, SIGTERM, SIGPIPE, 0};

int sv_set_signals(const int *sigs, void (*handler)(int)) {
  for (; *sigs != 0; sigs++) {
    if (signal(*sigs, handler) == SIG_ERR) return -1;
  }
  return 0;
}

/* ---- the answer to tsbox ---- */

static char answer[2048];
/* Where the answer goes: stdout, or a copy of it once stdout is /dev/null. */
static int answer_fd = STDOUT_FILENO;
static void (*answer_undo)(void);

void sv_answer_undo(void (*undo)(void)) { answer_undo = undo; }

void sv_fail(const char *fmt, ...) {
  va_list ap;
  int n = snprintf(answer, sizeof answer, "error ");
  va_start(ap, fmt);
  vsnprintf(answer + n, sizeof answer - (size_t)n - 1, fmt, ap);
  va_end(ap);
  /* Its own failure or the start's: either way nothing may outlive the failed start. */
  if (answer_undo != NULL) answer_undo();
  size_t len = strlen(answer);
  answer[len] = '\n';
  if (write(answer_fd, answer, len + 1) < 0) { /* tsbox is gone: nobody to tell */ }
  _exit(1);
}

void sv_answer_detach(void) {
  answer_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (answer_fd < 0) {
    answer_fd = STDOUT_FILENO;
    sv_fail("dup stdout: %s", strerror(errno));
  }
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) sv_fail("open /dev/null: %s", strerror(errno));
  if (dup2(devnull, STDIN_FILENO) < 0 || dup2(devnull, STDOUT_FILENO) < 0 || dup2(devnull, STDERR_FILENO) < 0)
    sv_fail("dup2 /dev/null: %s", strerror(errno));
  if (devnull > STDERR_FILENO && close(devnull) < 0) sv_fail("close /dev/null: %s", strerror(errno));
}

void sv_answer_ok(pid_t self, pid_t pid) {
  int n = snprintf(answer, sizeof answer, "ok %d %d\n", (int)self, (int)pid);
  /* No undo from here: what was started runs, and tsbox reads the pid file if not this. */
  answer_undo = NULL;
  if (sv_write_all(answer_fd, answer, (size_t)n) < 0) { /* tsbox reads the pid file instead */ }
  if (close(answer_fd) < 0) { /* nothing reads the answer any more: nobody to tell */ }
}

/* ---- errors ---- */

const char *sv_errno_name(int e) {
  switch (e) {
#define NAME(x) \
  case x: \
    return #x;
    NAME(EPERM) NAME(ENOENT) NAME(ESRCH) NAME(EINTR) NAME(EIO) NAME(ENXIO) NAME(E2BIG) NAME(ENOEXEC)
    NAME(EBADF) NAME(ECHILD) NAME(EAGAIN) NAME(ENOMEM) NAME(EACCES) NAME(EFAULT) NAME(EBUSY)
    NAME(EEXIST) NAME(EXDEV) NAME(ENODEV) NAME(ENOTDIR) NAME(EISDIR) NAME(EINVAL) NAME(ENFILE)
    NAME(EMFILE) NAME(ENOTTY) NAME(ETXTBSY) NAME(EFBIG) NAME(ENOSPC) NAME(ESPIPE) NAME(EROFS)
    NAME(EMLINK) NAME(EPIPE) NAME(EDOM) NAME(ERANGE) NAME(EDEADLK) NAME(ENAMETOOLONG) NAME(ENOLCK)
    NAME(ENOSYS) NAME(ENOTEMPTY) NAME(ELOOP) NAME(ENOMSG) NAME(EOVERFLOW) NAME(EBADFD) NAME(ENOTSOCK)
    NAME(EDESTADDRREQ) NAME(EMSGSIZE) NAME(EPROTOTYPE) NAME(ENOPROTOOPT) NAME(EPROTONOSUPPORT)
    NAME(EOPNOTSUPP) NAME(EAFNOSUPPORT) NAME(EADDRINUSE) NAME(EADDRNOTAVAIL) NAME(ENETDOWN)
    NAME(ENETUNREACH) NAME(ECONNABORTED) NAME(ECONNRESET) NAME(ENOBUFS) NAME(EISCONN) NAME(ENOTCONN)
    NAME(ETIMEDOUT) NAME(ECONNREFUSED) NAME(EHOSTUNREACH) NAME(EALREADY) NAME(EINPROGRESS)
    NAME(ESTALE) NAME(EDQUOT) NAME(ECANCELED) NAME(EOWNERDEAD) NAME(EPROTO)
#undef NAME
    default:
      return NULL;
  }
}

/* ---- memory ---- */

/* The lowest address of the main thread's stack ("[stack]" in /proc/self/maps); 0 if unknown.
   Its own buffer is dead once it returns (not inlined: its frame is below the caller's). */
static __attribute__((noinline)) uintptr_t stack_low(void) {
  char maps[4096];
  ssize_t n = sv_read_file("/proc/self/maps", maps, sizeof maps);
  if (n <= 0) return 0;
  const char *tag = strstr(maps, " [stack]");
  if (tag == NULL) return 0;
  const char *line = tag;
  while (line > maps && line[-1] != '\n') line--;
  char *end;
  unsigned long long low = strtoull(line, &end, 16);
  return end == line || *end != '-' ? 0 : (uintptr_t)low;
}

void sv_shed(void) {
  /* Free chunks of the heap go back (glibc keeps them otherwise). */
#ifdef __GLIBC__
  (void)malloc_trim(0); /* 1 when it gave some back, 0 when there was none: both fine */
#endif /* musl's allocator gives freed pages back by itself */
  long page = sysconf(_SC_PAGESIZE);
  uintptr_t low = stack_low();
  if (page <= 0 || low == 0) return;
  /* The frames below this one are done with; a page below it stays for the calls to come
     (sv_release's and madvise's own frames among them). */
  volatile char here = 0;
  uintptr_t top = ((uintptr_t)&here & ~((uintptr_t)page - 1)) - (uintptr_t)page;
  if (top > low) sv_release((void *)low, top - low);
}

void sv_release(void *buf, size_t len) {
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) return;
  uintptr_t mask = (uintptr_t)page - 1;
  uintptr_t from = ((uintptr_t)buf + mask) & ~mask, to = ((uintptr_t)buf + len) & ~mask;
  if (to <= from) return;
  if (madvise((void *)from, to - from, MADV_DONTNEED) < 0) { /* the pages stay: more memory, nothing lost */ }
}

/* ---- unix sockets ---- */

int sv_fail_errno(char *err, size_t errlen, const char *call, const char *path) {
  snprintf(err, errlen, "%s %s: %s", call, path, strerror(errno));
  return -1;
}

/* mkdir -p of `path`'s directory, mode 0755 for what it makes. */
static int make_parent(const char *path, char *err, size_t errlen) {
  char dir[PATH_MAX];
  if ((size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir) {
    errno = ENAMETOOLONG;
    return sv_fail_errno(err, errlen, "mkdir", path);
  }
  char *slash = strrchr(dir, '/');
  if (slash == NULL || slash == dir) return 0; /* the working directory, or the root */
  *slash = 0;
  for (char *p = dir + 1;; p++) {
    if (*p != '/' && *p != 0) continue;
    char saved = *p;
    *p = 0;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return sv_fail_errno(err, errlen, "mkdir", dir);
    *p = saved;
    if (saved == 0) break;
  }
  struct stat st;
  if (stat(dir, &st) < 0) return sv_fail_errno(err, errlen, "stat", dir);
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return sv_fail_errno(err, errlen, "mkdir", dir);
  }
  return 0;
}

static int socket_address(const char *path, struct sockaddr_un *addr) {
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  if (strlen(path) >= sizeof addr->sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(addr->sun_path, path, strlen(path));
  return 0;
}

/*
 * 1 when a server answers at `path`: it accepts, or is too busy to accept yet (still a live
 * server); 0 when refused or anything else (nobody serves there); -1 with errno when it cannot
 * be asked.
 */
static int socket_live(const char *path) {
  struct sockaddr_un addr;
  if (socket_address(path, &addr) < 0) return -1;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int live = connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0 || errno == EINPROGRESS || errno == EAGAIN;
  if (close(fd) < 0 && errno != EINTR) { /* a probe: released whatever close says */ }
  return live;
}

int sv_listen(const char *path, int backlog, struct sv_bound *b, char *err, size_t errlen) {
  *b = (struct sv_bound){.path = path};
  if (make_parent(path, err, errlen) < 0) return -1;
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      snprintf(err, errlen, "%s exists and is not a socket; refusing to replace it", path);
      return -1;
    }
    int live = socket_live(path);
    if (live < 0) return sv_fail_errno(err, errlen, "connect", path);
    if (live) {
      snprintf(err, errlen, "another server is already listening on %s", path);
      return -1;
    }
    if (unlink(path) < 0 && errno != ENOENT) return sv_fail_errno(err, errlen, "unlink", path);
  } else if (errno != ENOENT) {
    return sv_fail_errno(err, errlen, "lstat", path);
  }
  struct sockaddr_un addr;
  if (socket_address(path, &addr) < 0) return sv_fail_errno(err, errlen, "bind", path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return sv_fail_errno(err, errlen, "socket", path);
  /* Nobody but its owner reaches it from its first moment, not only once chmod ran. */
  mode_t old = umask(0177);
  int bound = bind(fd, (struct sockaddr *)&addr, sizeof addr);
  int e = errno;
  umask(old);
  const char *failed = NULL;
  if (bound < 0) {
    errno = e;
    failed = "bind";
  } else if (lstat(path, &st) < 0) {
    failed = "lstat";
  } else {
    /* Known by its inode from here: whatever fails next, it is removed below. */
    *b = (struct sv_bound){.path = path, .dev = st.st_dev, .ino = st.st_ino, .made = 1};
    if (listen(fd, backlog) < 0) failed = "listen";
    else if (chmod(path, 0600) < 0) failed = "chmod";
  }
  if (failed == NULL) return fd;
  sv_fail_errno(err, errlen, failed, path);
  (void)close(fd); /* the socket is abandoned whatever close says */
  if (sv_unlink_bound(b, NULL) < 0) { /* the reason above is the one to tell */ }
  return -1;
}

int sv_unlink_bound(struct sv_bound *b, const char **call) {
  if (!b->made) return 0;
  b->made = 0;
  struct stat st;
  if (lstat(b->path, &st) < 0) {
    if (errno == ENOENT) return 0;
    if (call != NULL) *call = "lstat";
    return -1;
  }
  /* Another server's since: it is not this program's to remove. */
  if (st.st_dev != b->dev || st.st_ino != b->ino) return 0;
  if (unlink(b->path) < 0 && errno != ENOENT) {
    if (call != NULL) *call = "unlink";
    return -1;
  }
  return 0;
}

/* ---- mounts ---- */

/* /proc/self/mountinfo, whole, NUL-terminated; NULL with errno on failure. */
static char *read_mountinfo(void) {
  int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  size_t size = 65536, len = 0;
  char *buf = malloc(size);
  for (;;) {
    if (buf == NULL) break;
    ssize_t n = read(fd, buf + len, size - len - 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      free(buf);
      buf = NULL;
      break;
    }
    len += (size_t)n;
    if (n == 0) {
      buf[len] = '\0';
      break;
    }
    if (len + 1 == size) {
      char *bigger = realloc(buf, size *= 2);
      if (bigger == NULL) free(buf);
      buf = bigger;
    }
  }
  int saved = errno;
  if (close(fd) < 0 && buf != NULL) {
    saved = errno;
    free(buf);
    buf = NULL;
  }
  errno = saved;
  return buf;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo: decoded in place. */
static void unescape_octal(char *s) {
  char *out = s;
  for (; *s != '\0'; s++) {
    if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
      *out++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
      s += 3;
    } else {
      *out++ = *s;
    }
  }
  *out = '\0';
}

struct mount_point {
  const char *path;
  size_t order;
};

/* Deepest first; at one path the later mount (the top of the stack) first. */
static int deepest_first(const void *a, const void *b) {
  const struct mount_point *x = a, *y = b;
  size_t lx = strlen(x->path), ly = strlen(y->path);
  if (lx != ly) return lx < ly ? 1 : -1;
  return x->order < y->order ? 1 : -1;
}

int sv_unmount_tree(const char *root, int detach, void (*detached)(const char *path), char *why, size_t whysize) {
  size_t rootlen = strlen(root);
  int lazy = 0;
  char left[PATH_MAX];
  left[0] = '\0';
  for (int round = 0; round < 64; round++) {
    char *info = read_mountinfo();
    if (info == NULL) {
      snprintf(why, whysize, "unmount everything at %s: read /proc/self/mountinfo: %s", root, strerror(errno));
      return -1;
    }
    size_t count = 0, cap = 16;
    struct mount_point *points = malloc(cap * sizeof *points);
    char *save = NULL;
    for (char *line = strtok_r(info, "\n", &save); line != NULL && points != NULL; line = strtok_r(NULL, "\n", &save)) {
      /* id parent major:minor root MOUNTPOINT options ... */
      char *field = line;
      for (int i = 0; i < 4 && field != NULL; i++) field = strchr(field, ' ') != NULL ? strchr(field, ' ') + 1 : NULL;
      if (field == NULL) continue;
      char *end = strchr(field, ' ');
      if (end != NULL) *end = '\0';
      unescape_octal(field);
      if (strncmp(field, root, rootlen) != 0 || (field[rootlen] != '\0' && field[rootlen] != '/')) continue;
      if (count == cap) {
        struct mount_point *more = realloc(points, (cap *= 2) * sizeof *points);
        if (more == NULL) free(points);
        points = more;
        if (points == NULL) break;
      }
      points[count].path = field;
      points[count].order = count;
      count++;
    }
    if (points == NULL) {
      snprintf(why, whysize, "unmount everything at %s: malloc: %s", root, strerror(ENOMEM));
      free(info);
      return -1;
    }
    if (count == 0) {
      free(points);
      free(info);
      return 0;
    }
    qsort(points, count, sizeof *points, deepest_first);
    int progress = 0;
    for (size_t i = 0; i < count; i++) {
      const char *p = points[i].path;
      if (umount2(p, UMOUNT_NOFOLLOW) == 0) {
        progress = 1;
        continue;
      }
      if (errno == EINVAL || errno == ENOENT || (errno == EBUSY && !lazy)) {
        snprintf(left, sizeof left, "%s", p);
        continue;
      }
      if (errno == EBUSY && umount2(p, MNT_DETACH | UMOUNT_NOFOLLOW) == 0) {
        progress = 1;
        if (detached != NULL) detached(p);
        continue;
      }
      snprintf(why, whysize, "unmount %s: %s", p, strerror(errno));
      free(points);
      free(info);
      return -1;
    }
    free(points);
    free(info);
    if (!progress && !detach) {
      snprintf(why, whysize, "unmount everything at %s: %s is busy", root, left);
      return -1;
    }
    lazy = !progress;
  }
  snprintf(why, whysize, "unmount everything at %s: %s is still mounted after 64 rounds", root, left);
  return -1;
}
