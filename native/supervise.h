/*
 * supervise: the one implementation of what tsbox's supervising programs share, the pod's
 * supervisor (native/tsbox-shim.c) and a container's holder (native/tsbox-ctr.c). Each is the
 * parent of a process that outlives tsbox, and both write the same records, answer tsbox the
 * same way and own a unix socket:
 *
 *   records   files written atomically (temp file, rename; durable: fsync of the file and of
 *             its directory too); the pid records, "<pid> <pid>" or with each process's start
 *             time, "<pid> <start> ..." (field 22 of /proc/PID/stat, which makes a pid
 *             trustworthy); the exit record, "<status> <seconds> <nanoseconds>", the status being
 *             the exit code or 128 + the signal, the time that of the exit, taken while the
 *             process is still a zombie (waitid WNOWAIT), before it is reaped
 *   answer    the one line on stdout that ends a start: "ok <pid> <pid>", or "error <message>"
 *             after which nothing the start made is left and the program exits 1
 *   sockets   a unix socket claimed as tsbox claims its own: its directory made, a stale socket
 *             replaced, a live one or a file that is no socket refused, mode 0600 from its first
 *             moment, close-on-exec, non-blocking; removed later only while it is still the one
 *             bound
 *   mounts    everything at and below a directory unmounted, deepest first
 *
 * Every system call is checked: a function that fails returns -1 with errno set (and, where it
 * says so, the failed call's name), or fills a message naming the call, its target and errno.
 * Single-threaded programs only (the answer's state and the umask of a bind are the process's).
 */
#ifndef TSBOX_SUPERVISE_H
#define TSBOX_SUPERVISE_H

#include <stddef.h>
#include <sys/types.h>
#include <time.h>

/* ---- files ---- */

/* Writes all of `buf` to `fd`, across short writes and EINTR; 0, or -1 with errno. */
int sv_write_all(int fd, const void *buf, size_t len);

/* "<dir>/<name>" into `out`; 0, or -1 with errno ENAMETOOLONG when it does not fit. */
int sv_path(char *out, size_t size, const char *dir, const char *name);

/*
 * Writes <dir>/<name> atomically: <dir>/.<name>.tmp (mode 0600) written, then renamed over it;
 * `durable` also fsyncs the file before the rename and the directory after it, so that it
 * survives a crash of the machine, not only of tsbox. 0, or -1 with errno.
 */
int sv_write_file_atomic(const char *dir, const char *name, const char *content, int durable);

/* Writes `text` to the existing file `path` (a /proc or cgroup file); 0, or -1 with errno. */
int sv_write_text(const char *path, const char *text);

/* Reads at most size - 1 bytes of `path`, NUL-terminated; the length, or -1 with errno. */
ssize_t sv_read_file(const char *path, char *buf, size_t size);

/*
 * Creates `path` if it is not there (mode 0600), as a notice that an exit file was written;
 * 0, or -1 with errno and *call ("open" or "close") when `call` is given.
 */
int sv_touch(const char *path, const char **call);

/* ---- processes ---- */

/* /proc/PID/stat, NUL-terminated; 0, or -1 with errno (ENOENT or ESRCH: the process is gone). */
int sv_read_stat(pid_t pid, char *buf, size_t size);

/* Field 22 of /proc/PID/stat, the start time in clock ticks; 0 with errno on failure. */
unsigned long long sv_start_time(pid_t pid);

/* A process as the records name it: its pid, and its start time (0: not recorded). */
struct sv_process {
  pid_t pid;
  unsigned long long start;
};

/*
 * Writes the pid record <dir>/<name>: each process's pid, with its start time when
 * `with_start` ("<pid> <start> <pid> <start>\n"), else the pids alone ("<pid> <pid>\n").
 * Atomic, not durable: it matters only while the processes it names run, and they do not
 * outlive the machine. 0, or -1 with errno.
 */
int sv_write_pids(const char *dir, const char *name, const struct sv_process *procs, size_t n, int with_start);

/* How a process ended: its status (the exit code, 128 + the signal, 255 unknown) and when. */
struct sv_exit {
  int status;
  struct timespec at;
};

/*
 * Waits for the child `pid` to end (at once when it is a zombie already), takes the time while
 * it is still a zombie (waitid WNOWAIT), never later than the moment it is gone from /proc,
 * then reaps it. A wait that fails (it cannot for one's own child) takes the time after the
 * reap; a clock that fails (it cannot either) leaves the epoch.
 */
void sv_reap(pid_t pid, struct sv_exit *out);

/*
 * Reaps every child that has ended except `keep` (0: none kept), each looked at before it is
 * reaped (WNOWAIT) so that `keep`'s status is never taken by a wait for any child: the orphans
 * a subreaper inherits. Returns `keep` once it has ended (a zombie, not reaped: sv_reap it),
 * 0 when no other child has ended (or there is none), -1 with errno and *call ("waitid" or
 * "waitpid") when `call` is given.
 */
pid_t sv_reap_others(pid_t keep, const char **call);

/* "<status> <seconds> <nanoseconds>", the exit record's line without its newline; its length. */
int sv_exit_line(const struct sv_exit *e, char *buf, size_t size);

/*
 * Records an exit: <dir>/exit, the exit line and a newline, written atomically and durably
 * (after a reboot it is the only record of how the process ended), then the notice `notify`
 * (NULL: none) touched. Returns the supervising program's exit status: 0 both done, 2 the exit
 * file not written, 3 the notice not touched; errno and *call tell why.
 */
int sv_record_exit(const char *dir, const struct sv_exit *e, const char *notify, const char **call);

/* ---- signals ---- */

/* What a detached supervising program ignores (0-ended): SIGHUP, SIGINT, SIGTERM, SIGPIPE. */
extern const int sv_detached_signals[];

/* An errno's name ("ENOENT"), whatever the C library; NULL for one not in the table. */
const char *sv_errno_name(int e);

/* Sets the disposition of each of `sigs` (0-ended); 0, or -1 with errno. */
int sv_set_signals(const int *sigs, void (*handler)(int));

/* ---- the answer to tsbox ---- */

/* Run by sv_fail before it answers: undoes whatever the start has made so far. */
void sv_answer_undo(void (*undo)(void));

/*
 * Fails the start: "error <message>\n" on the answer's descriptor (stdout, or its copy once
 * sv_answer_detach ran), after the undo; then exit 1.
 */
__attribute__((noreturn, format(printf, 1, 2))) void sv_fail(const char *fmt, ...);

/*
 * From here the answer goes to a copy of stdout (close-on-exec) and the program's own stdin,
 * stdout and stderr are /dev/null, so that nothing it runs later holds tsbox's pipe. Fails the
 * start when it cannot.
 */
void sv_answer_detach(void);

/* Answers "ok <self> <pid>\n" and closes the answer's descriptor; tsbox gone is nobody's loss. */
void sv_answer_ok(pid_t self, pid_t pid);

/* ---- memory ---- */

/*
 * Called once a long-lived program has started and is about to wait for the rest of its life:
 * gives back what the start touched and no longer needs (free heap pages, the stack below the
 * caller's frame), so that a pod's processes hold only their steady state. Nothing is lost when
 * the kernel refuses: the pages just stay.
 */
void sv_shed(void);

/* Gives back the whole pages of a buffer that holds nothing needed any more (it reads as
   zeros afterwards); best effort, as sv_shed. */
void sv_release(void *buf, size_t len);

/*
 * For a large static buffer that only some runs touch, or only at their start: on pages of its
 * own, so that the small state every run keeps never shares a page with it (the build sorts the
 * statics by alignment, which gathers the small ones).
 */
#define SV_OWN_PAGES __attribute__((aligned(4096)))

/* ---- unix sockets ---- */

/* A socket file sv_listen bound, known by its inode so that only it is ever removed. */
struct sv_bound {
  const char *path;
  dev_t dev;
  ino_t ino;
  int made;
};

/*
 * Listens on `path` (a stream socket; `path` must outlive `b`): its directory made (0755), a
 * socket file nobody serves replaced, one somebody serves or anything that is not a socket
 * refused; mode 0600 from its first moment; close-on-exec, non-blocking. Returns the
 * descriptor, or -1 with the reason in `err` ("bind /x/y: Address already in use", "another
 * server is already listening on /x", "/x exists and is not a socket; refusing to replace it"),
 * having removed what it made.
 */
int sv_listen(const char *path, int backlog, struct sv_bound *b, char *err, size_t errlen);

/*
 * Removes the socket file `b` names while it is still the one bound (a file another server has
 * bound since is not touched), once. 0, or -1 with errno and *call ("lstat" or "unlink").
 */
int sv_unlink_bound(struct sv_bound *b, const char **call);

/* "<call> <path>: <strerror(errno)>" into `err`; returns -1. */
int sv_fail_errno(char *err, size_t errlen, const char *call, const char *path);

/* ---- mounts ---- */

/*
 * Unmounts everything at and below `root` (a real path, not "/"), deepest first, per
 * /proc/self/mountinfo, plain umount first as containerd's UnmountRecursive does. In rounds: a
 * busy mount may be busy only with a mount below it that another mount stacked on top hid until
 * now, so it waits for the next round. With `detach`, a busy mount is detached lazily once a
 * whole round unmounted nothing (`detached`, if given, is told its path); without, that ends the
 * work. The round limit guards against mounts that keep appearing under `root`. 0 once nothing
 * is mounted there; -1 with the reason in `why`.
 */
int sv_unmount_tree(const char *root, int detach, void (*detached)(const char *path), char *why, size_t whysize);

#endif
