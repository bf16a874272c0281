/*
 * relay: the ttrpc relay between containerd's connections to a pod's task socket and tsbox's
 * link to the pod (relay.h for the API; native/tsbox-shim.c runs it in each pod's supervisor).
 *
 * It knows ttrpc's framing (a 10-byte header: payload length u32, stream id u32, type u8,
 * flags u8, big-endian; payloads of 4 MiB at most, ttrpc's messageLengthMax) and nothing
 * else. Each request from containerd gets a stream id of the relay's own (odd, increasing) and
 * goes to tsbox over one connection tsbox opens to the link socket (a newer one replaces an
 * older one); each answer goes back to the connection and stream it came from.
 *
 * The private protocol (src/ttrpc/pod-link.ts) is ttrpc requests of the relay's own to a service
 * no client of the task socket may call (a client that names it is closed):
 *   Hello   the first frame on every new link connection, on stream id 1: its payload is the
 *           protocol's version in ASCII decimal. tsbox answers OK, or an error after which it
 *           closes the link.
 *   Cancel  a connection of containerd's has closed with calls unanswered: its payload is their
 *           stream ids (on the link) as 4-byte big-endian integers, so that tsbox ends them.
 * Answers to the relay's own requests match no call and are dropped. Requests not yet answered
 * are kept, and sent again after the Hello, in order and numbered from 3, to the next tsbox that
 * connects: containerd sees a slow answer, never a failure. tsbox's handlers give the same
 * answer to a request seen twice (src/tasks/tasks.ts).
 *
 * Every resource a client can make the relay hold is bounded: connections (past the bound the
 * one idle longest with no call waiting is closed), calls kept, bytes of frames not yet whole
 * (past the bound the connection holding the most is closed), the time a frame has to arrive
 * whole, answers a client leaves unread (past the bound it is not read until it reads them),
 * and requests tsbox leaves unread (past the bound no client is read until it reads them).
 * Idle, the loop sleeps without a timer: frames in progress or a resting listener arm one.
 *
 * The log: JSON lines as tsbox's logger (pino) writes them, appended to a file the relay opens;
 * past its bound the file is moved to <log>.1 (the previous copy replaced) and started again.
 */
#define _GNU_SOURCE
#include "relay.h"
#include "supervise.h"
#include "tsbox-contract.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ttrpc's frame header and largest message, HEADER_BYTES and MAX_MESSAGE_BYTES, and the bounds
   shared with tsbox's ttrpc server come from tsbox-contract.h (src/ttrpc/limits.ts). */
#define TYPE_REQUEST 1
#define TYPE_RESPONSE 2
#define TYPE_DATA 3

/* Connections from containerd at most (one per task of the pod, plus its reloads). */
#define MAX_CONNECTIONS 1024
/* Requests kept unanswered at most (Waits: one per container and exec). */
#define MAX_PENDING 16384
/*
 * Bytes of requests kept unanswered at most: containerd's are a few KiB (a Create with its
 * spec some tens), so sixteen maximal messages is far beyond any pod's, and a client cannot
 * make the relay keep 16 384 messages of 4 MiB while no tsbox reads them.
 */
#define MAX_PENDING_BYTES (16ull * MAX_MESSAGE_BYTES)
/*
 * The relay's stream ids on tsbox's connection must increase (ttrpc's rule); past this one the
 * connection to tsbox is closed and the next one starts again from 1 (about a year of calls).
 */
#define LAST_STREAM_ID 0xfffffff0ull
/* Requests tsbox may leave unread before no client is read: two maximal messages. */
#define MAX_LINK_QUEUED_BYTES (2u * MAX_MESSAGE_BYTES)
/* One buffer for every read: a pod's requests are a few KiB, and only its touched pages count. */
#define READ_CHUNK 16384
#define LISTEN_BACKLOG 511
/* A pod keeps a few calls: a small table, whose chains only an abuse makes long. */
#define PENDING_BUCKETS 256

static const char HELLO[] = POD_HELLO;
static const char CANCEL[] = POD_CANCEL;

static const struct relay_options *opts;

/* ---- time ---- */

/* Milliseconds on the monotonic clock: every deadline and idle time is measured on it. */
static int64_t now_ms(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0) abort(); /* cannot fail with this clock */
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- logging: JSON lines as pino writes them ---- */

static int log_fd = -1;
/* Bytes in the log: what it held when opened, and every line since (nobody else writes it). */
static unsigned long long log_size;
static unsigned long long log_max;
static int log_rotating;

struct line {
  size_t len;
  /* Lines are short: messages, numbers and a path or two; a longer one loses its tail. */
  char text[4096];
};

static void line_raw(struct line *l, const char *s, size_t n) {
  /* A line longer than its buffer loses its tail (paths are bounded well below). */
  if (n > sizeof l->text - 2 - l->len) n = sizeof l->text - 2 - l->len;
  memcpy(l->text + l->len, s, n);
  l->len += n;
}

static void line_str(struct line *l, const char *s) { line_raw(l, s, strlen(s)); }

/* Room kept after a field's value for the fields and message that follow it (all short). */
#define LINE_TAIL_BYTES 512

/*
 * A JSON string; one too long for the line is cut short (still a whole string), leaving
 * `keep` bytes after it, so that the line stays one JSON object.
 */
static void line_json_string(struct line *l, const char *s, size_t keep) {
  line_raw(l, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p != 0; p++) {
    /* An escape takes at most 6 bytes, the closing quote 1, line_raw keeps 2 back. */
    if (l->len + 6 + 1 + 2 + keep > sizeof l->text) break;
    char esc[8];
    if (*p == '"' || *p == '\\') {
      esc[0] = '\\';
      esc[1] = (char)*p;
      line_raw(l, esc, 2);
    } else if (*p == '\n') {
      line_raw(l, "\\n", 2);
    } else if (*p < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", *p);
      line_raw(l, esc, 6);
    } else {
      line_raw(l, (const char *)p, 1);
    }
  }
  line_raw(l, "\"", 1);
}

/* Starts a line at `level`: false when there is no log to write it to. */
static int log_begin(struct line *l, int level) {
  if (log_fd < 0) return 0;
  struct timespec ts;
  struct tm tm;
  if (clock_gettime(CLOCK_REALTIME, &ts) < 0 || gmtime_r(&ts.tv_sec, &tm) == NULL) abort(); /* cannot fail */
  int n = snprintf(l->text, sizeof l->text, "{\"level\":%d,\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"name\":\"tsbox\",\"component\":\"pod-relay\",\"pid\":%ld",
                   level, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, (long)getpid());
  l->len = (size_t)n;
  return 1;
}

static void log_field(struct line *l, const char *key, const char *value, size_t keep) {
  line_str(l, ",\"");
  line_str(l, key);
  line_str(l, "\":");
  line_json_string(l, value, keep);
}

static void log_str(struct line *l, const char *key, const char *value) { log_field(l, key, value, LINE_TAIL_BYTES); }

static void log_num(struct line *l, const char *key, long long value) {
  char num[32];
  snprintf(num, sizeof num, "%lld", value);
  line_str(l, ",\"");
  line_str(l, key);
  line_str(l, "\":");
  line_str(l, num);
}

/* Node's name for an errno ("ECONNRESET") and its text, as its errors carry them. */
static const char *errno_name(int e) {
  const char *name = sv_errno_name(e);
  return name != NULL ? name : "EUNKNOWN";
}

static void errno_text(int e, char *out, size_t size) {
  snprintf(out, size, "%s", strerror(e));
  if (out[0] >= 'A' && out[0] <= 'Z') out[0] = (char)(out[0] - 'A' + 'a');
}

/* An `err` as pino writes a Node system error: message, errno, code, syscall (and path). */
static void log_errno(struct line *l, int e, const char *syscall, const char *path) {
  char message[PATH_MAX + 256], text[128];
  errno_text(e, text, sizeof text);
  if (path != NULL) snprintf(message, sizeof message, "%s: %s, %s '%s'", errno_name(e), text, syscall, path);
  else snprintf(message, sizeof message, "%s %s", syscall, errno_name(e));
  line_str(l, ",\"err\":{\"type\":\"Error\"");
  log_str(l, "message", message);
  log_num(l, "errno", -e);
  log_str(l, "code", errno_name(e));
  log_str(l, "syscall", syscall);
  if (path != NULL) log_str(l, "path", path);
  line_str(l, "}");
}

static void rotate_log(void);

static void log_end(struct line *l, const char *msg) {
  log_field(l, "msg", msg, 0);
  /* Into the two bytes line_raw keeps back, so that a line cut short still ends the object and the line. */
  memcpy(l->text + l->len, "}\n", 2);
  l->len += 2;
  /* The log is written whole or dropped: a log that cannot take a line has nowhere to say so. */
  size_t off = 0;
  int tries = 0;
  while (off < l->len) {
    ssize_t n = write(log_fd, l->text + off, l->len - off);
    if (n >= 0) {
      off += (size_t)n;
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN && tries++ < 10) {
      struct pollfd p = {.fd = log_fd, .events = POLLOUT};
      if (poll(&p, 1, 100) < 0 && errno != EINTR) break; /* nothing to wait on: drop the rest */
      continue;
    }
    break;
  }
  log_size += off;
  if (log_size > log_max && !log_rotating) rotate_log();
}

static void log_msg(int level, const char *msg) {
  struct line l;
  if (log_begin(&l, level)) log_end(&l, msg);
}

void relay_log(int level, const char *msg, const char *key, long long value) {
  struct line l;
  if (!log_begin(&l, level)) return;
  if (key != NULL) log_num(&l, key, value);
  log_end(&l, msg);
}

void relay_log_errno(int level, const char *msg, int err, const char *syscall, const char *path) {
  struct line l;
  if (!log_begin(&l, level)) return;
  log_errno(&l, err, syscall, path);
  log_end(&l, msg);
}

/* Out of memory ends the process (as Node's would): nothing the relay holds can be trusted. */
static void out_of_memory(void) {
  log_msg(RELAY_FATAL, "pod relay out of memory");
  _exit(1);
}

/*
 * Opens (creates) the log for appending; -1 with errno. The descriptor keeps its number across
 * a rotation, so that nothing else needs to learn of it.
 */
static int open_log(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0600);
  if (fd < 0) return -1;
  struct stat st;
  int bad = fstat(fd, &st) < 0 ? errno : !S_ISREG(st.st_mode) ? EINVAL : 0;
  if (bad != 0) {
    (void)close(fd); /* the check already failed; `bad` says why */
    errno = bad;
    return -1;
  }
  if (log_fd >= 0) {
    if (dup3(fd, log_fd, O_CLOEXEC) < 0) {
      int saved = errno;
      (void)close(fd); /* the dup already failed; errno says why */
      errno = saved;
      return -1;
    }
    if (close(fd) < 0 && errno != EINTR) { /* the copy in log_fd is the one in use */ }
  } else {
    log_fd = fd;
  }
  log_size = (unsigned long long)st.st_size;
  return 0;
}

/*
 * Past its bound the log is moved to <log>.1 (the previous copy replaced) and a new one opened
 * in its place. A failure is logged (to the log as it is) and tried again at the next line past
 * the bound. A log someone removed is simply opened again.
 */
static void rotate_log(void) {
  char kept[PATH_MAX];
  unsigned long long bytes = log_size;
  const char *syscall = "rename", *path = opts->log_path;
  log_rotating = 1;
  if ((size_t)snprintf(kept, sizeof kept, "%s.1", opts->log_path) >= sizeof kept) {
    errno = ENAMETOOLONG;
    goto failed;
  }
  if (rename(opts->log_path, kept) < 0 && errno != ENOENT) goto failed;
  syscall = "open";
  if (open_log(opts->log_path) < 0) goto failed;
  struct line l;
  if (log_begin(&l, RELAY_INFO)) {
    log_str(&l, "path", opts->log_path);
    log_num(&l, "bytes", (long long)bytes);
    log_str(&l, "kept", kept);
    log_end(&l, "log file cut: what it held is in the kept copy");
  }
  log_rotating = 0;
  return;
failed:
  relay_log_errno(RELAY_WARN, "cannot cut the log file", errno, syscall, path);
  log_rotating = 0;
}

/* ---- byte queues ---- */

struct buf {
  unsigned char *data;
  size_t head; /* first byte not yet consumed */
  size_t len;  /* end of the bytes held */
  size_t cap;
};

static size_t buf_size(const struct buf *b) { return b->len - b->head; }

static void buf_free(struct buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

/* Appends; the caller bounds what it appends. */
static void buf_append(struct buf *b, const void *bytes, size_t n) {
  if (b->len + n > b->cap && b->head > 0) {
    memmove(b->data, b->data + b->head, b->len - b->head);
    b->len -= b->head;
    b->head = 0;
  }
  if (b->len + n > b->cap) {
    size_t cap = b->cap < 4096 ? 4096 : b->cap;
    while (cap < b->len + n) cap *= 2;
    unsigned char *data = realloc(b->data, cap);
    if (data == NULL) out_of_memory();
    b->data = data;
    b->cap = cap;
  }
  memcpy(b->data + b->len, bytes, n);
  b->len += n;
}

/* Drops `n` bytes from the front; an emptied queue gives its memory back. */
static void buf_consume(struct buf *b, size_t n) {
  b->head += n;
  if (b->head == b->len) buf_free(b);
}

/* ---- frames ---- */

static void put_u32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/*
 * A byte stream split into frames, whatever the chunks (src/ttrpc/frame.ts, FrameDecoder). It
 * holds at most one frame in progress: its header, and its payload so far when the frame is
 * of the type its owner keeps (requests from containerd, answers from tsbox); a frame over
 * MAX_MESSAGE_BYTES or of an unknown type is "skipped": counted off as it goes by, never kept.
 */
struct decoder {
  unsigned char header[HEADER_BYTES];
  size_t header_fill;
  int current; /* a header is whole and its payload arriving */
  uint32_t length, stream_id;
  unsigned char type, flags;
  int skipping;
  int keeping;
  size_t received;
  unsigned char *frame; /* header and payload so far, when keeping */
  size_t cap;
};

/* Bytes held of the frame in progress, as FrameDecoder.buffered counts them. */
static size_t decoder_buffered(const struct decoder *d) {
  if (!d->current) return d->header_fill;
  return d->skipping ? 0 : HEADER_BYTES + d->received;
}

static int decoder_mid_frame(const struct decoder *d) { return d->header_fill > 0 || d->current; }

static void decoder_free(struct decoder *d) {
  free(d->frame);
  d->frame = NULL;
  d->cap = 0;
}

enum { SKIP_NONE, SKIP_OVERSIZED, SKIP_UNKNOWN_TYPE };

/*
 * What a decoder found. A whole frame: `frame` (header and payload, malloc'd, the receiver's
 * to keep or free) when the owner keeps its type, else NULL. A skipped one: `skipped` says why.
 */
struct decoded {
  int skipped;
  uint32_t length, stream_id;
  unsigned char type, flags;
  unsigned char *frame;
};

/* Returns 1 with *out set when a frame or a skip completes, 0 when the chunk is used up. */
static int decoder_next(struct decoder *d, int keep_type, const unsigned char *chunk, size_t n, size_t *at, struct decoded *out) {
  while (*at < n) {
    if (!d->current) {
      size_t take = HEADER_BYTES - d->header_fill;
      if (take > n - *at) take = n - *at;
      memcpy(d->header + d->header_fill, chunk + *at, take);
      d->header_fill += take;
      *at += take;
      if (d->header_fill < HEADER_BYTES) return 0;
      d->header_fill = 0;
      d->length = get_u32(d->header);
      d->stream_id = get_u32(d->header + 4);
      d->type = d->header[8];
      d->flags = d->header[9];
      int reason = d->length > MAX_MESSAGE_BYTES ? SKIP_OVERSIZED
                   : (d->type == TYPE_REQUEST || d->type == TYPE_RESPONSE || d->type == TYPE_DATA) ? SKIP_NONE
                                                                                                   : SKIP_UNKNOWN_TYPE;
      d->current = 1;
      d->skipping = reason != SKIP_NONE;
      d->keeping = !d->skipping && d->type == keep_type;
      d->received = 0;
      if (d->skipping) {
        *out = (struct decoded){.skipped = reason, .length = d->length, .stream_id = d->stream_id, .type = d->type, .flags = d->flags};
        if (d->length == 0) d->current = 0;
        return 1;
      }
      if (d->keeping) {
        /* Grown as the payload arrives: a header alone never costs its announced length. */
        size_t cap = HEADER_BYTES + (d->length < 4096 ? d->length : 4096);
        d->frame = malloc(cap);
        if (d->frame == NULL) out_of_memory();
        d->cap = cap;
        memcpy(d->frame, d->header, HEADER_BYTES);
      }
    }
    size_t take = d->length - d->received;
    if (take > n - *at) take = n - *at;
    if (d->keeping && take > 0) {
      size_t need = HEADER_BYTES + d->received + take;
      if (need > d->cap) {
        size_t cap = d->cap * 2;
        if (cap < need) cap = need;
        if (cap > HEADER_BYTES + (size_t)d->length) cap = HEADER_BYTES + d->length;
        unsigned char *frame = realloc(d->frame, cap);
        if (frame == NULL) out_of_memory();
        d->frame = frame;
        d->cap = cap;
      }
      memcpy(d->frame + HEADER_BYTES + d->received, chunk + *at, take);
    }
    d->received += take;
    *at += take;
    if (d->received < d->length) return 0;
    int skipped = d->skipping;
    d->current = 0;
    d->skipping = 0;
    d->received = 0;
    if (skipped) continue;
    *out = (struct decoded){.skipped = SKIP_NONE, .length = d->length, .stream_id = d->stream_id, .type = d->type, .flags = d->flags, .frame = d->keeping ? d->frame : NULL};
    d->frame = NULL;
    d->cap = 0;
    d->keeping = 0;
    return 1;
  }
  return 0;
}

/* ---- the ttrpc Request envelope ---- */

/*
 * A reader of protobuf's wire format that fails exactly where the decoder tsbox uses does
 * (@bufbuild/protobuf's BinaryReader under ts-proto's Request.decode, src/gen/ttrpc/request.ts):
 * a byte past the end reads as 0 and the read then fails, as its bounds check does after it.
 */
struct pb {
  const unsigned char *buf;
  uint64_t len, pos;
};

static unsigned pb_byte(struct pb *r) {
  uint64_t at = r->pos++;
  return at < r->len ? r->buf[at] : 0;
}

static int pb_in_bounds(const struct pb *r) { return r->pos <= r->len ? 0 : -1; }

static int pb_varint32(struct pb *r, uint32_t *out) {
  uint32_t result = 0;
  unsigned b = 0;
  for (int shift = 0; shift < 28; shift += 7) {
    b = pb_byte(r);
    result |= (uint32_t)(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = result;
      return pb_in_bounds(r);
    }
  }
  b = pb_byte(r);
  result |= (uint32_t)(b & 0x0f) << 28;
  for (int read = 5; (b & 0x80) != 0 && read < 10; read++) b = pb_byte(r);
  if ((b & 0x80) != 0) return -1;
  *out = result;
  return pb_in_bounds(r);
}

/* An int64 field read as a JavaScript number: one past ±(2^53 − 1) fails. */
static int pb_int64_safe(struct pb *r) {
  uint32_t lo = 0, hi = 0;
  unsigned b;
  for (int shift = 0; shift < 28; shift += 7) {
    b = pb_byte(r);
    lo |= (uint32_t)(b & 0x7f) << shift;
    if ((b & 0x80) == 0) goto done;
  }
  b = pb_byte(r);
  lo |= (uint32_t)(b & 0x0f) << 28;
  hi = (b & 0x70) >> 4;
  if ((b & 0x80) == 0) goto done;
  for (int shift = 3; shift <= 31; shift += 7) {
    b = pb_byte(r);
    hi |= (uint32_t)(b & 0x7f) << shift;
    if ((b & 0x80) == 0) goto done;
  }
  return -1;
done:
  if (pb_in_bounds(r) < 0) return -1;
  int64_t v = (int64_t)((uint64_t)hi << 32 | lo);
  const int64_t max_safe = 9007199254740991LL;
  return v > max_safe || v < -max_safe ? -1 : 0;
}

/* A length-delimited field: its bytes, or -1 past the end. */
static int pb_bytes(struct pb *r, uint64_t *start, uint64_t *len) {
  uint32_t n;
  if (pb_varint32(r, &n) < 0) return -1;
  *start = r->pos;
  *len = n;
  r->pos += n;
  return pb_in_bounds(r);
}

static int pb_tag(struct pb *r, uint32_t *field, uint32_t *wire) {
  uint64_t start = r->pos;
  uint32_t tag;
  if (pb_varint32(r, &tag) < 0) return -1;
  uint64_t read = r->pos - start;
  if (read > 5 || (read == 5 && r->buf[r->pos - 1] > 0x0f)) return -1;
  *field = tag >> 3;
  *wire = tag & 7;
  return *field == 0 || *wire > 5 ? -1 : 0;
}

/* Skips one field of wire type `wire`; `field` is the group's number to match, 0 for any. */
static int pb_skip(struct pb *r, uint32_t wire, uint32_t field, int depth) {
  uint32_t n, f, w;
  switch (wire) {
  case 0:
    while (pb_byte(r) & 0x80) {
    }
    break;
  case 1:
    r->pos += 8;
    break;
  case 5:
    r->pos += 4;
    break;
  case 2:
    if (pb_varint32(r, &n) < 0) return -1;
    r->pos += n;
    break;
  case 3:
    if (depth <= 0) return -1;
    for (;;) {
      if (pb_tag(r, &f, &w) < 0) return -1;
      if (w == 4) {
        if (field != 0 && f != field) return -1;
        break;
      }
      if (pb_skip(r, w, f, depth - 1) < 0) return -1;
    }
    break;
  default:
    return -1;
  }
  return pb_in_bounds(r);
}

/*
 * Reads one message up to `end`: a Request (its service's bytes in *service) or, nested, a
 * KeyValue. Returns -1 where ts-proto's decode throws.
 */
static int pb_message(struct pb *r, uint64_t end, int request, uint64_t *service, uint64_t *service_len) {
  while (r->pos < end) {
    uint32_t tag;
    uint64_t start, len;
    if (pb_varint32(r, &tag) < 0) return -1;
    uint32_t field = tag >> 3;
    if (request && tag == 10) {
      if (pb_bytes(r, service, service_len) < 0) return -1;
      continue;
    }
    if ((field == 1 && tag == 10) || (field == 2 && tag == 18) || (request && field == 3 && tag == 26)) {
      if (pb_bytes(r, &start, &len) < 0) return -1;
      continue;
    }
    if (request && tag == 32) {
      if (pb_int64_safe(r) < 0) return -1;
      continue;
    }
    if (request && tag == 42) {
      uint32_t n;
      if (pb_varint32(r, &n) < 0) return -1;
      if (pb_message(r, r->pos + n, 0, NULL, NULL) < 0) return -1;
      continue;
    }
    if ((tag & 7) == 4 || tag == 0) break;
    if (pb_skip(r, tag & 7, 0, 100) < 0) return -1;
  }
  return 0;
}

/*
 * True when a request's payload calls one of the private services: no client of the task
 * socket may, or it could end other clients' calls. What does not decode is not one (tsbox
 * answers it as the request it is not), so the same bytes are read as tsbox reads them.
 */
static int names_private_service(const unsigned char *payload, size_t len) {
  struct pb r = {.buf = payload, .len = len, .pos = 0};
  uint64_t service = 0, service_len = 0;
  if (pb_message(&r, len, 1, &service, &service_len) < 0) return 0;
  for (const char *const *s = opts->services; *s != NULL; s++)
    if (service_len == strlen(*s) && memcmp(payload + service, *s, service_len) == 0) return 1;
  return 0;
}

/* ---- connections ---- */

enum { KIND_TASK_LISTENER, KIND_LINK_LISTENER, KIND_CALLER, KIND_CLIENT, KIND_LINK };

struct endpoint {
  int kind;
  int fd;
};

struct pending;

/* One of containerd's connections to the task socket. */
struct client {
  struct endpoint ep;
  struct client *prev, *next; /* in the order they came */
  struct client *dead_next;
  struct decoder dec;
  size_t counted; /* its share of partial_bytes: the decoder's bytes at its last read */
  uint32_t last_stream_id;
  int64_t frame_started_at; /* 0 between frames */
  int64_t last_active;
  int paused; /* not read until it reads its answers */
  uint32_t events;
  struct buf out;
  struct pending *ids_head, *ids_tail; /* its calls kept */
  size_t nids;
  uint64_t kept_bytes; /* of its calls kept */
};

/* A request relayed to tsbox and not yet answered. */
struct pending {
  uint64_t id; /* the relay's stream id on tsbox's connection */
  struct client *conn;
  uint32_t stream_id; /* the client's */
  struct pending *prev, *next;           /* all, in the order of their ids */
  struct pending *conn_prev, *conn_next; /* the client's */
  struct pending *hash_next;
  size_t len;
  unsigned char *frame; /* as relayed: bytes 4–7 are the relay's stream id */
};

/* tsbox's connection to the link socket. */
struct link {
  struct endpoint ep;
  struct link *dead_next;
  struct decoder dec;
  uint32_t events;
  struct buf out;
};

/* A descriptor of the caller's, with what to run when it is readable. */
struct caller {
  struct endpoint ep;
  void (*ready)(void *arg);
  void *arg;
  struct caller *next; /* in `callers`: a record that only epoll's data pointed to would be lost */
};

static int epfd = -1;
static struct endpoint task_listener = {KIND_TASK_LISTENER, -1};
static struct endpoint link_listener = {KIND_LINK_LISTENER, -1};
static struct sv_bound task_bound, link_bound;
/* Kept open to be given up when descriptors run out, so that a connection can be refused. */
static int spare_fd = -1;
/* Listeners whose accept failed for want of resources: not watched until the next sweep. */
static int listeners_resting;
static int stopping, stop_code;

static unsigned char chunk[READ_CHUNK] SV_OWN_PAGES;
static struct client *clients_head, *clients_tail;
static size_t nclients;
static struct client *dead_clients;
static struct link *tsbox;
static struct link *dead_links;
static struct pending *pending_head, *pending_tail;
/* The descriptors relay_watch took, kept for the relay's whole life. */
static struct caller *callers;
static struct pending *pending_table[PENDING_BUCKETS];
static size_t npending;
static uint64_t pending_bytes;
static uint64_t next_id = 1;
static uint64_t partial_bytes;
/* tsbox leaves too many requests unread: no client is read until it reads them. */
static int link_full;

/* Sets what epoll reports for `ep`; -1 (logged) when the kernel refuses. */
static int watch(struct endpoint *ep, uint32_t events, int op) {
  struct epoll_event ev = {.events = events, .data.ptr = ep};
  if (epoll_ctl(epfd, op, ep->fd, &ev) == 0) return 0;
  relay_log_errno(RELAY_ERROR, "cannot watch a descriptor", errno, "epoll_ctl", NULL);
  return -1;
}

/*
 * A connection that cannot be watched as it must be would hang: it is shut down, and epoll
 * (which reports a hang-up whatever it was asked for) brings it to the loop, which closes it
 * as any connection whose peer went away. Closing it here could reenter the caller's walk.
 */
static void rewatch(struct endpoint *ep, uint32_t events) {
  if (watch(ep, events, EPOLL_CTL_MOD) == 0) return;
  if (shutdown(ep->fd, SHUT_RDWR) < 0) relay_log_errno(RELAY_ERROR, "cannot shut down a connection", errno, "shutdown", NULL);
}

static void link_close(struct link *b, const char *why_syscall, int err);

static uint32_t client_wanted(const struct client *c) {
  uint32_t events = 0;
  if (!c->paused && !link_full) events |= EPOLLIN;
  if (buf_size(&c->out) > 0) events |= EPOLLOUT;
  return events;
}

static void client_rewatch(struct client *c) {
  uint32_t events = client_wanted(c);
  if (events == c->events) return;
  c->events = events;
  rewatch(&c->ep, events);
}

/* A client not read now: its frame in progress cannot be blamed on it meanwhile. */
static int client_held(const struct client *c) { return c->paused || link_full; }

static struct pending **pending_slot(uint64_t id) { return &pending_table[(id >> 1) % PENDING_BUCKETS]; }

static void pending_hash_add(struct pending *p) {
  struct pending **slot = pending_slot(p->id);
  p->hash_next = *slot;
  *slot = p;
}

static void pending_hash_remove(struct pending *p) {
  for (struct pending **at = pending_slot(p->id); *at != NULL; at = &(*at)->hash_next) {
    if (*at == p) {
      *at = p->hash_next;
      return;
    }
  }
}

static struct pending *pending_find(uint64_t id) {
  for (struct pending *p = *pending_slot(id); p != NULL; p = p->hash_next)
    if (p->id == id) return p;
  return NULL;
}

/* Forgets a kept request everywhere: the table, the order, its client's list. */
static void pending_remove(struct pending *p) {
  pending_hash_remove(p);
  if (p->prev != NULL) p->prev->next = p->next;
  else pending_head = p->next;
  if (p->next != NULL) p->next->prev = p->prev;
  else pending_tail = p->prev;
  struct client *c = p->conn;
  if (p->conn_prev != NULL) p->conn_prev->conn_next = p->conn_next;
  else c->ids_head = p->conn_next;
  if (p->conn_next != NULL) p->conn_next->conn_prev = p->conn_prev;
  else c->ids_tail = p->conn_prev;
  c->nids--;
  c->kept_bytes -= p->len;
  npending--;
  pending_bytes -= p->len;
  free(p->frame);
  free(p);
}

/* Sends what `out` holds until the socket is full; -1 (errno set) when the connection failed. */
static int send_queued(int fd, struct buf *out) {
  while (buf_size(out) > 0) {
    ssize_t n = send(fd, out->data + out->head, buf_size(out), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return 0;
      return -1;
    }
    buf_consume(out, (size_t)n);
  }
  return 0;
}

static void link_rewatch(struct link *b) {
  uint32_t events = EPOLLIN | (buf_size(&b->out) > 0 ? EPOLLOUT : 0);
  if (events == b->events) return;
  b->events = events;
  rewatch(&b->ep, events);
}

static void set_link_full(int full) {
  if (full == link_full) return;
  link_full = full;
  int64_t now = now_ms();
  struct client *next;
  for (struct client *c = clients_head; c != NULL; c = next) {
    next = c->next;
    /* It could not send while it was not read: its frame's clock starts again. */
    if (!full && !c->paused && c->frame_started_at != 0) c->frame_started_at = now;
    client_rewatch(c);
  }
}

/* Writes what is queued for tsbox; returns -1 when the connection failed (it is closed). */
static int link_flush(struct link *b) {
  if (send_queued(b->ep.fd, &b->out) < 0) {
    link_close(b, "write", errno);
    return -1;
  }
  link_rewatch(b);
  if (buf_size(&b->out) <= MAX_LINK_QUEUED_BYTES && b == tsbox) set_link_full(0);
  return 0;
}

/* Sends bytes to tsbox (queued when its socket is full); past the bound no client is read. */
static void link_write(struct link *b, const void *bytes, size_t n) {
  int was_empty = buf_size(&b->out) == 0;
  buf_append(&b->out, bytes, n);
  if (was_empty && link_flush(b) < 0) return;
  if (buf_size(&b->out) > MAX_LINK_QUEUED_BYTES) set_link_full(1);
}

static void link_close(struct link *b, const char *why_syscall, int err) {
  if (b->ep.fd < 0) return;
  if (close(b->ep.fd) < 0 && errno != EINTR) { /* the descriptor is released whatever close says */ }
  b->ep.fd = -1;
  buf_free(&b->out);
  decoder_free(&b->dec);
  b->dead_next = dead_links;
  dead_links = b;
  if (tsbox == b) {
    tsbox = NULL;
    set_link_full(0);
  }
  struct line l;
  if (log_begin(&l, RELAY_INFO)) {
    if (why_syscall != NULL) log_errno(&l, err, why_syscall, NULL);
    log_num(&l, "pending", (long long)npending);
    log_end(&l, "tsbox disconnected: its unanswered calls wait for the next one");
  }
}

/* Appends a protobuf varint; returns its length (at most 5 for 32 bits). */
static size_t put_varint(unsigned char *p, uint32_t v) {
  size_t n = 0;
  for (;; v >>= 7) {
    p[n++] = (unsigned char)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    if (v < 0x80) return n;
  }
}

/*
 * A request of the relay's own to tsbox on stream `id`: a ttrpc Request (1 service, 2 method,
 * 3 payload) for the relay's service. The payload is `head` then, when `c` is given, the
 * stream ids of `c`'s kept calls, 4 bytes each, big-endian (a Cancel, src/ttrpc/pod-link.ts).
 */
static void send_own_request(struct link *b, uint64_t id, const char *method, const char *head, const struct client *c) {
  const char *service = opts->services[0];
  size_t service_len = strlen(service), method_len = strlen(method), head_len = strlen(head);
  size_t payload_len = head_len + (c != NULL ? 4 * c->nids : 0);
  unsigned char varint[5];
  size_t total = 1 + 5 + service_len + 1 + 5 + method_len + 1 + 5 + payload_len;
  unsigned char *frame = malloc(HEADER_BYTES + total);
  if (frame == NULL) out_of_memory();
  unsigned char *p = frame + HEADER_BYTES;
  *p++ = 0x0a;
  p += put_varint(p, (uint32_t)service_len);
  memcpy(p, service, service_len);
  p += service_len;
  *p++ = 0x12;
  p += put_varint(p, (uint32_t)method_len);
  memcpy(p, method, method_len);
  p += method_len;
  *p++ = 0x1a;
  size_t vlen = put_varint(varint, (uint32_t)payload_len);
  memcpy(p, varint, vlen);
  p += vlen;
  memcpy(p, head, head_len);
  p += head_len;
  for (const struct pending *q = c != NULL ? c->ids_head : NULL; q != NULL; q = q->conn_next) {
    put_u32(p, (uint32_t)q->id);
    p += 4;
  }
  size_t length = (size_t)(p - frame) - HEADER_BYTES;
  put_u32(frame, (uint32_t)length);
  put_u32(frame + 4, (uint32_t)id);
  frame[8] = TYPE_REQUEST;
  frame[9] = 0;
  link_write(b, frame, HEADER_BYTES + length);
  free(frame);
}

/* Forgets a client that is gone; tsbox ends its kept calls (a Wait would otherwise stay). */
static void client_close(struct client *c) {
  if (c->ep.fd < 0) return;
  if (close(c->ep.fd) < 0 && errno != EINTR) { /* the descriptor is released whatever close says */ }
  c->ep.fd = -1;
  partial_bytes -= c->counted;
  c->counted = 0;
  decoder_free(&c->dec);
  buf_free(&c->out);
  if (c->prev != NULL) c->prev->next = c->next;
  else clients_head = c->next;
  if (c->next != NULL) c->next->prev = c->prev;
  else clients_tail = c->prev;
  nclients--;
  c->dead_next = dead_clients;
  dead_clients = c;
  if (c->nids == 0) return;
  /* Its own stream id on tsbox's connection; the answer matches no kept call and is dropped. */
  if (tsbox != NULL && next_id <= LAST_STREAM_ID) {
    uint64_t id = next_id;
    next_id += 2;
    send_own_request(tsbox, id, CANCEL, "", c);
  }
  while (c->ids_head != NULL) pending_remove(c->ids_head);
}

/* Writes what is queued for a client; a client drained of its answers is read again. */
static void client_flush(struct client *c) {
  if (send_queued(c->ep.fd, &c->out) < 0) {
    /* containerd went away mid-answer: its connection ends, as at its close. */
    client_close(c);
    return;
  }
  if (c->paused && buf_size(&c->out) == 0) {
    c->paused = 0;
    /* It could not send while it was not read: its frame's clock starts again. */
    if (c->frame_started_at != 0) c->frame_started_at = now_ms();
  }
  client_rewatch(c);
}

/*
 * An answer to containerd (writeBounded, src/ttrpc/peer.ts): a client that leaves more than
 * MAX_QUEUED_OUTPUT_BYTES unread is not read either until it has read them all.
 */
static void client_answer(struct client *c, const unsigned char *frame, size_t n) {
  c->last_active = now_ms();
  int was_empty = buf_size(&c->out) == 0;
  buf_append(&c->out, frame, n);
  if (was_empty) {
    client_flush(c);
    if (c->ep.fd < 0) return;
  }
  if (!c->paused && buf_size(&c->out) > MAX_QUEUED_OUTPUT_BYTES) {
    c->paused = 1;
    client_rewatch(c);
  }
}

/* Closes the connection idle longest that has no call waiting; 0 when there is none. */
static int evict_idle(void) {
  struct client *victim = NULL;
  for (struct client *c = clients_head; c != NULL; c = c->next) {
    if (c->nids > 0) continue;
    if (victim == NULL || c->last_active < victim->last_active) victim = c;
  }
  if (victim == NULL) return 0;
  client_close(victim);
  return 1;
}

static void shed_partial(void) {
  struct client *largest = NULL;
  for (struct client *c = clients_head; c != NULL; c = c->next)
    if (largest == NULL || decoder_buffered(&c->dec) > decoder_buffered(&largest->dec)) largest = c;
  if (largest == NULL) return;
  relay_log(RELAY_WARN, "task socket: closing the connection holding the most bytes of unfinished frames", "bytes", (long long)decoder_buffered(&largest->dec));
  client_close(largest);
}

static void warn_protocol(const char *msg, const char *k1, long long v1, const char *k2, long long v2) {
  struct line l;
  if (!log_begin(&l, RELAY_WARN)) return;
  log_num(&l, k1, v1);
  if (k2 != NULL) log_num(&l, k2, v2);
  log_end(&l, msg);
}

/*
 * Room for one more kept call of `bytes`: past the bound on calls or on their bytes, the
 * connection keeping the most (calls, or bytes) is closed, as for unfinished frames, so that a
 * client piling up calls loses its own connection, not containerd's. Returns -1 when that is
 * `c`'s own.
 */
static int make_room(struct client *c, uint64_t bytes) {
  while (npending >= MAX_PENDING || pending_bytes + bytes > MAX_PENDING_BYTES) {
    int by_count = npending >= MAX_PENDING;
    struct client *most = NULL;
    for (struct client *o = clients_head; o != NULL; o = o->next)
      if (most == NULL || (by_count ? o->nids > most->nids : o->kept_bytes > most->kept_bytes)) most = o;
    /* The sender's own (with this call) outweighs every other's, or nobody else keeps any. */
    if (most == NULL || most == c || (by_count ? most->nids < c->nids + 1 : most->kept_bytes < c->kept_bytes + bytes)) {
      warn_protocol("task socket: closing a connection that broke the bound on calls", "streamId", (long long)c->last_stream_id, "pending", (long long)npending);
      return -1;
    }
    warn_protocol(by_count ? "task socket: closing the connection keeping the most calls" : "task socket: closing the connection keeping the most bytes of calls", "calls", (long long)most->nids,
                  "bytes", (long long)most->kept_bytes);
    client_close(most);
  }
  return 0;
}

/* One whole request from a client; returns -1 when the client was closed for it. */
static int client_request(struct client *c, const struct decoded *d) {
  if (d->stream_id % 2 != 1 || d->stream_id <= c->last_stream_id) {
    warn_protocol("task socket: closing a connection that broke the protocol or the bound on calls", "streamId", d->stream_id, "pending", (long long)npending);
    free(d->frame);
    client_close(c);
    return -1;
  }
  if (make_room(c, HEADER_BYTES + (uint64_t)d->length) < 0) {
    free(d->frame);
    client_close(c);
    return -1;
  }
  if (names_private_service(d->frame + HEADER_BYTES, d->length)) {
    warn_protocol("task socket: closing a connection that called the relay's own service", "streamId", d->stream_id, NULL, 0);
    free(d->frame);
    client_close(c);
    return -1;
  }
  c->last_stream_id = d->stream_id;
  /* Out of stream ids on tsbox's connection: a new one renumbers (link_accept). */
  if (next_id > LAST_STREAM_ID && tsbox != NULL) link_close(tsbox, NULL, 0);
  struct pending *p = calloc(1, sizeof *p);
  if (p == NULL) out_of_memory();
  p->id = next_id;
  next_id += 2;
  p->conn = c;
  p->stream_id = d->stream_id;
  p->frame = d->frame;
  p->len = HEADER_BYTES + d->length;
  put_u32(p->frame + 4, (uint32_t)p->id);
  p->prev = pending_tail;
  if (pending_tail != NULL) pending_tail->next = p;
  else pending_head = p;
  pending_tail = p;
  p->conn_prev = c->ids_tail;
  if (c->ids_tail != NULL) c->ids_tail->conn_next = p;
  else c->ids_head = p;
  c->ids_tail = p;
  c->nids++;
  c->kept_bytes += p->len;
  npending++;
  pending_bytes += p->len;
  pending_hash_add(p);
  if (tsbox != NULL) link_write(tsbox, p->frame, p->len);
  return 0;
}

static void client_readable(struct client *c) {
  ssize_t n = read(c->ep.fd, chunk, sizeof chunk);
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN) return;
    /* A reset: containerd's connection ends, as at its close. */
    client_close(c);
    return;
  }
  if (n == 0) {
    client_close(c);
    return;
  }
  int64_t now = now_ms();
  c->last_active = now;
  size_t at = 0;
  struct decoded d;
  /* Frames are acted on as they complete; the chunk's bytes past a closing one are dropped. */
  while (decoder_next(&c->dec, TYPE_REQUEST, chunk, (size_t)n, &at, &d)) {
    if (d.skipped != SKIP_NONE) {
      /* A frame over ttrpc's limit or of a type it does not know: not containerd's. */
      struct line l;
      if (log_begin(&l, RELAY_WARN)) {
        log_str(&l, "reason", d.skipped == SKIP_OVERSIZED ? "oversized" : "unknown type");
        log_num(&l, "bytes", d.length);
        log_end(&l, "task socket: closing a connection that broke the protocol");
      }
      client_close(c);
      return;
    }
    if (d.type != TYPE_REQUEST) continue;
    if (client_request(c, &d) < 0) return;
    if (c->ep.fd < 0) return;
  }
  size_t buffered = decoder_buffered(&c->dec);
  partial_bytes += buffered - c->counted;
  c->counted = buffered;
  c->frame_started_at = decoder_mid_frame(&c->dec) ? (c->frame_started_at != 0 ? c->frame_started_at : now) : 0;
  if (partial_bytes > MAX_PARTIAL_FRAME_BYTES) shed_partial();
}

/*
 * A listener whose accept fails (out of descriptors or memory) would be ready again at once:
 * it is not watched until the next sweep, so that the relay does not spin meanwhile.
 */
static void rest_listener(struct endpoint *ep) {
  if (watch(ep, 0, EPOLL_CTL_MOD) == 0) listeners_resting = 1;
}

static void client_accept(void) {
  for (;;) {
    int fd = accept4(task_listener.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN) return;
      if ((errno == EMFILE || errno == ENFILE) && spare_fd >= 0) {
        /* Out of descriptors: the spare one takes the connection only to refuse it. */
        relay_log_errno(RELAY_WARN, "task socket: connection refused, no descriptor left", errno, "accept", NULL);
        (void)close(spare_fd); /* released whatever close says */
        int refused = accept4(task_listener.fd, NULL, NULL, SOCK_CLOEXEC);
        if (refused >= 0) (void)close(refused); /* refused on purpose */
        spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (refused < 0) return;
        continue;
      }
      relay_log_errno(RELAY_WARN, "task socket: accept failed", errno, "accept", NULL);
      rest_listener(&task_listener);
      return;
    }
    if (nclients >= MAX_CONNECTIONS && !evict_idle()) {
      warn_protocol("task socket: connection refused, every one carries a call", "max", MAX_CONNECTIONS, NULL, 0);
      if (close(fd) < 0 && errno != EINTR) { /* refused whatever close says */ }
      continue;
    }
    struct client *c = calloc(1, sizeof *c);
    if (c == NULL) out_of_memory();
    c->ep.kind = KIND_CLIENT;
    c->ep.fd = fd;
    c->last_active = now_ms();
    c->events = client_wanted(c);
    if (watch(&c->ep, c->events, EPOLL_CTL_ADD) < 0) {
      if (close(fd) < 0 && errno != EINTR) { /* refused whatever close says */ }
      free(c);
      continue;
    }
    c->prev = clients_tail;
    if (clients_tail != NULL) clients_tail->next = c;
    else clients_head = c;
    clients_tail = c;
    nclients++;
  }
}

/* tsbox's answers, each to the client and stream it answers. */
static void link_readable(struct link *b) {
  ssize_t n = read(b->ep.fd, chunk, sizeof chunk);
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN) return;
    link_close(b, "read", errno);
    return;
  }
  if (n == 0) {
    link_close(b, NULL, 0);
    return;
  }
  size_t at = 0;
  struct decoded d;
  while (decoder_next(&b->dec, TYPE_RESPONSE, chunk, (size_t)n, &at, &d)) {
    if (d.skipped != SKIP_NONE || d.frame == NULL) continue;
    /* An answer to the relay's own Hello or Cancel matches no kept call: dropped. */
    struct pending *p = pending_find(d.stream_id);
    if (p == NULL) {
      free(d.frame);
      continue;
    }
    struct client *c = p->conn;
    put_u32(d.frame + 4, p->stream_id);
    pending_remove(p);
    client_answer(c, d.frame, HEADER_BYTES + d.length);
    free(d.frame);
    if (b->ep.fd < 0) return;
  }
}

static void link_accept(void) {
  for (;;) {
    int fd = accept4(link_listener.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN) return;
      relay_log_errno(RELAY_WARN, "link socket: accept failed", errno, "accept", NULL);
      rest_listener(&link_listener);
      return;
    }
    /* A newer tsbox replaces an older connection (one that has not noticed its end yet). */
    if (tsbox != NULL) link_close(tsbox, NULL, 0);
    struct link *b = calloc(1, sizeof *b);
    if (b == NULL) out_of_memory();
    b->ep.kind = KIND_LINK;
    b->ep.fd = fd;
    b->events = EPOLLIN;
    if (watch(&b->ep, b->events, EPOLL_CTL_ADD) < 0) {
      if (close(fd) < 0 && errno != EINTR) { /* refused whatever close says */ }
      free(b);
      continue;
    }
    tsbox = b;
    /* A new connection numbers its streams from 1: the Hello first, then the kept requests in
       the order they came, then new ones. The table is rebuilt under the new ids. */
    memset(pending_table, 0, sizeof pending_table);
    next_id = 3;
    size_t replayed = 0;
    for (struct pending *p = pending_head; p != NULL; p = p->next) {
      p->id = next_id;
      next_id += 2;
      put_u32(p->frame + 4, (uint32_t)p->id);
      pending_hash_add(p);
      replayed++;
    }
    send_own_request(b, 1, HELLO, opts->hello, NULL);
    for (struct pending *p = pending_head; p != NULL && tsbox == b; p = p->next) link_write(b, p->frame, p->len);
    relay_log(RELAY_INFO, "tsbox connected", "replayed", (long long)replayed);
  }
}

/* Closes clients that left a frame half-sent for FRAME_ARRIVAL_MS while they were read. */
static void check_frames(int64_t now) {
  struct client *next;
  for (struct client *c = clients_head; c != NULL; c = next) {
    next = c->next;
    if (!client_held(c) && c->frame_started_at != 0 && now - c->frame_started_at >= FRAME_ARRIVAL_MS) client_close(c);
  }
}

static void free_dead(void) {
  while (dead_clients != NULL) {
    struct client *c = dead_clients;
    dead_clients = c->dead_next;
    free(c);
  }
  while (dead_links != NULL) {
    struct link *b = dead_links;
    dead_links = b->dead_next;
    free(b);
  }
}

/* ---- start-up ---- */

/*
 * Listens on `path` as src/transport/socket.ts prepares and claims a socket (sv_listen: its
 * directory made, a stale socket replaced, a live one or a non-socket refused; mode 0600), and
 * watches it.
 */
static int listen_on(struct endpoint *ep, struct sv_bound *b, const char *path, char *err, size_t errlen) {
  int fd = sv_listen(path, LISTEN_BACKLOG, b, err, errlen);
  if (fd < 0) return -1;
  ep->fd = fd;
  if (watch(ep, EPOLLIN, EPOLL_CTL_ADD) < 0) return sv_fail_errno(err, errlen, "epoll_ctl", path);
  return 0;
}

/* Undoes what a failed relay_listen made, so that nothing of it is left. */
static void release_all(void) {
  relay_unlink();
  int *fds[] = {&task_listener.fd, &link_listener.fd, &spare_fd, &epfd, &log_fd};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
    if (*fds[i] >= 0 && close(*fds[i]) < 0 && errno != EINTR) { /* released whatever close says */ }
    *fds[i] = -1;
  }
}

int relay_listen(const struct relay_options *o, char *err, size_t errlen) {
  opts = o;
  log_max = o->log_max_bytes != 0 ? o->log_max_bytes : RELAY_LOG_MAX_BYTES;
  if (o->log_path != NULL && open_log(o->log_path) < 0) return sv_fail_errno(err, errlen, "open", o->log_path);
  epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) {
    sv_fail_errno(err, errlen, "epoll_create1", "epoll");
    release_all();
    return -1;
  }
  spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (spare_fd < 0) {
    sv_fail_errno(err, errlen, "open", "/dev/null");
    release_all();
    return -1;
  }
  if (listen_on(&link_listener, &link_bound, o->link_socket, err, errlen) < 0 || listen_on(&task_listener, &task_bound, o->task_socket, err, errlen) < 0) {
    release_all();
    return -1;
  }
  /* A log that is already past its bound is cut now rather than at its next line. */
  if (log_size > log_max) rotate_log();
  struct line l;
  if (log_begin(&l, RELAY_INFO)) {
    log_str(&l, "taskSocket", o->task_socket);
    log_str(&l, "link", o->link_socket);
    log_end(&l, "pod relay listening");
  }
  return 0;
}

int relay_watch(int fd, void (*ready)(void *arg), void *arg) {
  struct caller *w = calloc(1, sizeof *w);
  if (w == NULL) return -1;
  w->ep = (struct endpoint){KIND_CALLER, fd};
  w->ready = ready;
  w->arg = arg;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &w->ep};
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
    int saved = errno;
    free(w);
    errno = saved;
    return -1;
  }
  w->next = callers;
  callers = w;
  return 0;
}

void relay_stop(int code) {
  stopping = 1;
  stop_code = code;
}

static void unlink_bound(struct sv_bound *b) {
  const char *call = NULL;
  if (sv_unlink_bound(b, &call) < 0) relay_log_errno(RELAY_WARN, "cannot remove a socket file", errno, call, b->path);
}

void relay_unlink(void) {
  unlink_bound(&task_bound);
  unlink_bound(&link_bound);
}

int relay_run(void) {
  int64_t next_sweep = 0;
  struct epoll_event events[64];
  while (!stopping) {
    /* A timer only while a frame is in progress or a listener rests: an idle pod sleeps. */
    int timeout = -1;
    if (partial_bytes > 0 || listeners_resting) {
      int64_t now = now_ms();
      if (next_sweep == 0) next_sweep = now + SWEEP_MS;
      timeout = next_sweep > now ? (int)(next_sweep - now) : 0;
    }
    int n = epoll_wait(epfd, events, 64, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      relay_log_errno(RELAY_FATAL, "pod relay cannot wait for its connections", errno, "epoll_wait", NULL);
      return -1;
    }
    for (int i = 0; i < n; i++) {
      struct endpoint *ep = events[i].data.ptr;
      uint32_t ev = events[i].events;
      if (ep->fd < 0) continue; /* closed earlier in this batch */
      switch (ep->kind) {
      case KIND_TASK_LISTENER:
        client_accept();
        break;
      case KIND_LINK_LISTENER:
        link_accept();
        break;
      case KIND_CALLER: {
        struct caller *w = (struct caller *)ep;
        w->ready(w->arg);
        break;
      }
      case KIND_CLIENT: {
        struct client *c = (struct client *)ep;
        if (ev & EPOLLOUT) client_flush(c);
        if (c->ep.fd >= 0 && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
          if (ev & EPOLLIN || !(ev & EPOLLOUT)) client_readable(c);
        }
        break;
      }
      case KIND_LINK: {
        struct link *b = (struct link *)ep;
        if ((ev & EPOLLOUT) && link_flush(b) < 0) break;
        if (b->ep.fd >= 0 && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) link_readable(b);
        break;
      }
      }
    }
    free_dead();
    int64_t now = next_sweep != 0 ? now_ms() : 0;
    if (next_sweep != 0 && now >= next_sweep) {
      next_sweep = 0;
      check_frames(now);
      if (listeners_resting) {
        listeners_resting = 0;
        if (watch(&task_listener, EPOLLIN, EPOLL_CTL_MOD) < 0 || watch(&link_listener, EPOLLIN, EPOLL_CTL_MOD) < 0) listeners_resting = 1;
      }
      free_dead();
    }
  }
  return stop_code;
}
