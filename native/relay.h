/*
 * relay: the ttrpc relay between containerd's connections to a task socket and tsbox's link.
 *
 * The process that owns the task socket owns containerd's connections to it, so that a restart
 * of tsbox, planned or a crash, breaks none of them (containerd's ttrpc client never redials).
 * tsbox connects to the link socket; every request from containerd goes to tsbox over that one
 * connection on a stream id of the relay's own, and every answer back to the connection and
 * stream it came from. Requests not yet answered are kept and sent again to the next tsbox that
 * connects. native/relay.c describes the protocol and the bounds.
 *
 * One relay per process: the state is the library's own, single-threaded, driven by relay_run.
 */
#ifndef TSBOX_RELAY_H
#define TSBOX_RELAY_H

#include <stddef.h>

/* Bytes the log may reach before it is moved to <log>.1 and started again, unless told. */
#define RELAY_LOG_MAX_BYTES (1024ull * 1024)
/* The smallest bound a caller may set on the log. */
#define RELAY_LOG_MIN_BYTES 1024ull

struct relay_options {
  /* containerd's Task API socket, and the socket tsbox connects to. */
  const char *task_socket;
  const char *link_socket;
  /* JSON lines, as tsbox's logger (pino) writes them, appended here; NULL: no log. */
  const char *log_path;
  /* Past it the log is moved to <log>.1 and started again; 0: RELAY_LOG_MAX_BYTES. */
  unsigned long long log_max_bytes;
  /*
   * Services no client of the task socket may call (a client naming one is closed), NULL-ended.
   * The first is the relay's own: its requests to tsbox, Hello and Cancel, name it.
   */
  const char *const *services;
  /* The payload of the Hello that opens every link connection: the protocol's version. */
  const char *hello;
};

/* Log levels, as pino numbers them. */
enum { RELAY_INFO = 30, RELAY_WARN = 40, RELAY_ERROR = 50, RELAY_FATAL = 60 };

/*
 * Opens the log and binds both sockets: each socket's directory is made, a socket file nobody
 * serves is replaced, one somebody serves or anything that is not a socket is refused; mode
 * 0600 from the first moment; close-on-exec, non-blocking. Returns 0, or -1 with the reason in
 * `err` ("bind /x/y: Address already in use", "another server is already listening on /x",
 * "/x exists and is not a socket; refusing to replace it"), having released and removed
 * whatever it had made. `o` and the strings it points to must outlive the relay.
 */
int relay_listen(const struct relay_options *o, char *err, size_t errlen);

/*
 * Adds `fd` to the loop: `ready(arg)` runs whenever it is readable. Returns 0, or -1 with
 * errno (the epoll_ctl's).
 */
int relay_watch(int fd, void (*ready)(void *arg), void *arg);

/*
 * Serves until relay_stop; returns the code given to it, or -1 when the loop itself cannot
 * wait any more (logged). Out of memory ends the process (exit 1, logged).
 */
int relay_run(void);

/* Makes relay_run return `code` once the events in hand are handled. */
void relay_stop(int code);

/* Removes both socket files, each only while it is still the socket relay_listen bound. */
void relay_unlink(void);

/* A log line: `msg`, with one number (`key` NULL: none). */
void relay_log(int level, const char *msg, const char *key, long long value);

/* A log line for a failed call: `msg`, and the error as Node reports it (errno, call, path). */
void relay_log_errno(int level, const char *msg, int err, const char *syscall, const char *path);

#endif
