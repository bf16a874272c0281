/*
 * tsbox-front: the task front.
 *
 * The process that owns the Task API socket and containerd's connections to it, so that a
 * restart of tsbox — planned or a crash — breaks none of them. containerd's ttrpc client
 * never redials, and CRI takes a broken Wait for the container's exit: whoever holds those
 * connections must outlive tsbox. tsbox starts it, detached in a session of its own, when
 * none answers on the backend socket (src/tasks/serve.ts).
 *
 * Usage: tsbox-front --listen TASK_SOCKET --backend BACKEND_SOCKET [--pid-file FILE]
 *                    [--log-level LEVEL] [--log-file FILE [--log-max-bytes N] [--log-check-ms N]]
 *
 * It knows ttrpc's framing (a 10-byte header: payload length u32, stream id u32, type u8,
 * flags u8, big-endian; payloads of 4 MiB at most, ttrpc's messageLengthMax) and nothing
 * else. Each request from containerd gets a stream id of the front's own (odd, increasing)
 * and goes to tsbox over one connection tsbox opens to the backend socket (a newer one
 * replaces an older one); each answer goes back to the connection and stream it came from.
 * Requests not yet answered are kept, and sent again, in order and numbered from 1, to the
 * next tsbox that connects: containerd sees a slow answer, never a failure. tsbox's handlers
 * give the same answer to a request seen twice (src/tasks/tasks.ts). When a connection of
 * containerd's closes with calls unanswered, tsbox is told with a request of the front's own,
 * tsbox.front.v1.Front/Cancel, whose payload is their stream ids as 4-byte big-endian
 * integers (src/ttrpc/front-link.ts); a client that names that service itself is closed.
 *
 * Every resource a client can make the front hold is bounded: connections (past the bound the
 * one idle longest with no call waiting is closed), calls kept, bytes of frames not yet whole
 * (past the bound the connection holding the most is closed), the time a frame has to arrive
 * whole, answers a client leaves unread (past the bound it is not read until it reads them),
 * and requests tsbox leaves unread (past the bound no client is read until it reads them).
 *
 * Both sockets are made as tsbox makes its own (src/transport/socket.ts): their directory is
 * created, a socket file nobody serves is replaced, one somebody serves or anything that is
 * not a socket is an error; mode 0600. The pid file is written once both listen.
 *
 * It logs JSON lines on stdout, as tsbox's logger (pino) writes them. tsbox points stdout at
 * <state>/task-front.log, opened for appending, and names that file with --log-file: past
 * --log-max-bytes (8 MiB by default, at least 1024) it is copied to FILE.1 and cut to nothing,
 * checked at start and every --log-check-ms (60 000 by default, at least 10). SIGHUP and
 * SIGINT are ignored (logged); SIGTERM ends it, exit 0. It exits 1 when it cannot start (the
 * reason logged at level fatal), 2 on a command line it does not take.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ttrpc's frame header and largest message (src/ttrpc/limits.ts). */
#define HEADER_BYTES 10
#define MAX_MESSAGE_BYTES (4u * 1024 * 1024)
#define TYPE_REQUEST 1
#define TYPE_RESPONSE 2
#define TYPE_DATA 3

/* Connections from containerd at most (one per task, plus its reloads). */
#define MAX_FRONT_CONNECTIONS 1024
/* Requests kept unanswered at most (Waits: one per container and exec). */
#define MAX_PENDING 16384
/*
 * Bytes of requests kept unanswered at most: containerd's are a few KiB (a Create with its
 * spec some tens), so sixteen maximal messages is far beyond any node's, and a client cannot
 * make the front keep 16 384 messages of 4 MiB while no tsbox reads them.
 */
#define MAX_PENDING_BYTES (16ull * MAX_MESSAGE_BYTES)
/*
 * The front's stream ids on tsbox's connection must increase (ttrpc's rule); past this one the
 * connection to tsbox is closed and the next one starts again from 1 (about a year of calls).
 */
#define LAST_STREAM_ID 0xfffffff0ull
/* Bytes of frames not yet whole over all clients; past it the one holding most is closed. */
#define MAX_PARTIAL_FRAME_BYTES (8ull * MAX_MESSAGE_BYTES)
/* Time a frame has to arrive whole once its first byte came; containerd's come in one write. */
#define FRAME_ARRIVAL_MS 10000
/* Answers a client may leave unread before it is not read either (src/ttrpc/peer.ts). */
#define MAX_QUEUED_OUTPUT_BYTES (1024u * 1024)
/* Requests tsbox may leave unread before no client is read: two maximal messages. */
#define MAX_BACKEND_QUEUED_BYTES (2u * MAX_MESSAGE_BYTES)
/* How often frame deadlines are checked: a tenth of the deadline. */
#define SWEEP_MS 1000
#define READ_CHUNK 65536
#define LISTEN_BACKLOG 511
#define PENDING_BUCKETS 4096

static const char FRONT_SERVICE[] = "tsbox.front.v1.Front";
static const char FRONT_CANCEL[] = "Cancel";

/* ---- time ---- */

/* Milliseconds on the monotonic clock: every deadline and idle time is measured on it. */
static int64_t now_ms(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0) abort(); /* cannot fail with this clock */
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- logging: JSON lines as pino writes them ---- */

enum { LEVEL_TRACE = 10, LEVEL_DEBUG = 20, LEVEL_INFO = 30, LEVEL_WARN = 40, LEVEL_ERROR = 50, LEVEL_FATAL = 60, LEVEL_SILENT = 1000 };
static int log_level = LEVEL_INFO;

struct line {
  char text[8192];
  size_t len;
  int level;
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

/* Starts a line at `level`: false when the level is not logged. */
static int log_begin(struct line *l, int level) {
  if (level < log_level) return 0;
  struct timespec ts;
  struct tm tm;
  if (clock_gettime(CLOCK_REALTIME, &ts) < 0 || gmtime_r(&ts.tv_sec, &tm) == NULL) abort(); /* cannot fail */
  l->len = 0;
  l->level = level;
  int n = snprintf(l->text, sizeof l->text, "{\"level\":%d,\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"name\":\"tsbox\",\"component\":\"task-front\"",
                   level, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
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
  const char *name = strerrorname_np(e);
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

static void log_end(struct line *l, const char *msg) {
  log_field(l, "msg", msg, 0);
  /* Into the two bytes line_raw keeps back, so that a line cut short still ends the object and the line. */
  memcpy(l->text + l->len, "}\n", 2);
  l->len += 2;
  /* The log is written whole or dropped: a log that cannot take a line has nowhere to say so. */
  size_t off = 0;
  int tries = 0;
  while (off < l->len) {
    ssize_t n = write(STDOUT_FILENO, l->text + off, l->len - off);
    if (n >= 0) {
      off += (size_t)n;
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN && tries++ < 10) {
      struct pollfd p = {.fd = STDOUT_FILENO, .events = POLLOUT};
      if (poll(&p, 1, 100) < 0 && errno != EINTR) return; /* nothing to wait on: drop the line */
      continue;
    }
    return;
  }
}

static void log_msg(int level, const char *msg) {
  struct line l;
  if (log_begin(&l, level)) log_end(&l, msg);
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

/* Appends; the caller bounds what it appends. Out of memory ends the front (as Node's would). */
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
    if (data == NULL) {
      log_msg(LEVEL_FATAL, "task front out of memory");
      _exit(1);
    }
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
        if (d->frame == NULL) {
          log_msg(LEVEL_FATAL, "task front out of memory");
          _exit(1);
        }
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
        if (frame == NULL) {
          log_msg(LEVEL_FATAL, "task front out of memory");
          _exit(1);
        }
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
 * True when a request's payload calls the front's own service: no client of the task socket
 * may, or it could end other clients' calls. What does not decode is not one (tsbox answers
 * it as the request it is not), so the same bytes are read as tsbox reads them.
 */
static int names_front_service(const unsigned char *payload, size_t len) {
  struct pb r = {.buf = payload, .len = len, .pos = 0};
  uint64_t service = 0, service_len = 0;
  if (pb_message(&r, len, 1, &service, &service_len) < 0) return 0;
  return service_len == sizeof FRONT_SERVICE - 1 && memcmp(payload + service, FRONT_SERVICE, service_len) == 0;
}

/* ---- connections ---- */

enum { KIND_TASK_LISTENER, KIND_BACKEND_LISTENER, KIND_SIGNALS, KIND_CLIENT, KIND_BACKEND };

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
  uint64_t id; /* the front's stream id on tsbox's connection */
  struct client *conn;
  uint32_t stream_id; /* the client's */
  struct pending *prev, *next;           /* all, in the order of their ids */
  struct pending *conn_prev, *conn_next; /* the client's */
  struct pending *hash_next;
  size_t len;
  unsigned char *frame; /* as relayed: bytes 4–7 are the front's stream id */
};

/* tsbox's connection to the backend socket. */
struct backend {
  struct endpoint ep;
  struct backend *dead_next;
  struct decoder dec;
  uint32_t events;
  struct buf out;
};

static int epfd = -1;
static struct endpoint task_listener = {KIND_TASK_LISTENER, -1};
static struct endpoint backend_listener = {KIND_BACKEND_LISTENER, -1};
static struct endpoint signals = {KIND_SIGNALS, -1};
/* Kept open to be given up when descriptors run out, so that a connection can be refused. */
static int spare_fd = -1;
/* Listeners whose accept failed for want of resources: not watched until the next sweep. */
static int listeners_resting;

static struct client *clients_head, *clients_tail;
static size_t nclients;
static struct client *dead_clients;
static struct backend *tsbox;
static struct backend *dead_backends;
static struct pending *pending_head, *pending_tail;
static struct pending *pending_table[PENDING_BUCKETS];
static size_t npending;
static uint64_t pending_bytes;
static uint64_t next_id = 1;
static uint64_t partial_bytes;
/* tsbox leaves too many requests unread: no client is read until it reads them. */
static int backend_full;

static void watch(struct endpoint *ep, uint32_t events, int op) {
  struct epoll_event ev = {.events = events, .data.ptr = ep};
  if (epoll_ctl(epfd, op, ep->fd, &ev) < 0) {
    struct line l;
    if (log_begin(&l, LEVEL_FATAL)) {
      log_errno(&l, errno, "epoll_ctl", NULL);
      log_end(&l, "task front cannot watch a descriptor");
    }
    _exit(1);
  }
}

static uint32_t client_wanted(const struct client *c) {
  uint32_t events = 0;
  if (!c->paused && !backend_full) events |= EPOLLIN;
  if (buf_size(&c->out) > 0) events |= EPOLLOUT;
  return events;
}

static void client_rewatch(struct client *c) {
  uint32_t events = client_wanted(c);
  if (events == c->events) return;
  c->events = events;
  watch(&c->ep, events, EPOLL_CTL_MOD);
}

/* A client not read now: its frame in progress cannot be blamed on it meanwhile. */
static int client_held(const struct client *c) { return c->paused || backend_full; }

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

static void backend_close(struct backend *b, const char *why_syscall, int err);

static void backend_rewatch(struct backend *b) {
  uint32_t events = EPOLLIN | (buf_size(&b->out) > 0 ? EPOLLOUT : 0);
  if (events == b->events) return;
  b->events = events;
  watch(&b->ep, events, EPOLL_CTL_MOD);
}

static void set_backend_full(int full) {
  if (full == backend_full) return;
  backend_full = full;
  int64_t now = now_ms();
  for (struct client *c = clients_head; c != NULL; c = c->next) {
    /* It could not send while it was not read: its frame's clock starts again. */
    if (!full && !c->paused && c->frame_started_at != 0) c->frame_started_at = now;
    client_rewatch(c);
  }
}

/* Writes what is queued for tsbox; returns -1 when the connection failed (it is closed). */
static int backend_flush(struct backend *b) {
  if (send_queued(b->ep.fd, &b->out) < 0) {
    backend_close(b, "write", errno);
    return -1;
  }
  backend_rewatch(b);
  if (buf_size(&b->out) <= MAX_BACKEND_QUEUED_BYTES && b == tsbox) set_backend_full(0);
  return 0;
}

/* Sends bytes to tsbox (queued when its socket is full); past the bound no client is read. */
static void backend_write(struct backend *b, const void *bytes, size_t n) {
  int was_empty = buf_size(&b->out) == 0;
  buf_append(&b->out, bytes, n);
  if (was_empty && backend_flush(b) < 0) return;
  if (buf_size(&b->out) > MAX_BACKEND_QUEUED_BYTES) set_backend_full(1);
}

static void backend_close(struct backend *b, const char *why_syscall, int err) {
  if (b->ep.fd < 0) return;
  if (why_syscall != NULL) {
    struct line l;
    if (log_begin(&l, LEVEL_DEBUG)) {
      log_errno(&l, err, why_syscall, NULL);
      log_end(&l, "tsbox connection error");
    }
  }
  if (close(b->ep.fd) < 0 && errno != EINTR) { /* the descriptor is released whatever close says */ }
  b->ep.fd = -1;
  buf_free(&b->out);
  decoder_free(&b->dec);
  b->dead_next = dead_backends;
  dead_backends = b;
  if (tsbox == b) {
    tsbox = NULL;
    set_backend_full(0);
  }
  struct line l;
  if (log_begin(&l, LEVEL_INFO)) {
    log_num(&l, "pending", (long long)npending);
    log_end(&l, "tsbox disconnected: its unanswered calls wait for the next one");
  }
}

/* The request telling tsbox that the calls on `c`'s kept stream ids are abandoned (front-link.ts). */
static void send_cancel(struct backend *b, uint64_t id, const struct client *c) {
  size_t ids_len = 4 * c->nids;
  unsigned char varint[5];
  size_t vlen = 0;
  for (size_t v = ids_len;; v >>= 7) {
    varint[vlen++] = (unsigned char)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    if (v < 0x80) break;
  }
  size_t payload_len = 2 + (sizeof FRONT_SERVICE - 1) + 2 + (sizeof FRONT_CANCEL - 1) + 1 + vlen + ids_len;
  unsigned char *frame = malloc(HEADER_BYTES + payload_len);
  if (frame == NULL) {
    log_msg(LEVEL_FATAL, "task front out of memory");
    _exit(1);
  }
  unsigned char *p = frame;
  put_u32(p, (uint32_t)payload_len);
  put_u32(p + 4, (uint32_t)id);
  p[8] = TYPE_REQUEST;
  p[9] = 0;
  p += HEADER_BYTES;
  *p++ = 0x0a;
  *p++ = sizeof FRONT_SERVICE - 1;
  memcpy(p, FRONT_SERVICE, sizeof FRONT_SERVICE - 1);
  p += sizeof FRONT_SERVICE - 1;
  *p++ = 0x12;
  *p++ = sizeof FRONT_CANCEL - 1;
  memcpy(p, FRONT_CANCEL, sizeof FRONT_CANCEL - 1);
  p += sizeof FRONT_CANCEL - 1;
  *p++ = 0x1a;
  memcpy(p, varint, vlen);
  p += vlen;
  for (const struct pending *q = c->ids_head; q != NULL; q = q->conn_next) {
    put_u32(p, (uint32_t)q->id);
    p += 4;
  }
  backend_write(b, frame, HEADER_BYTES + payload_len);
  free(frame);
}

/* Forgets a client that is gone; tsbox ends its kept calls (a Wait would otherwise stay). */
static void client_close(struct client *c) {
  if (c->ep.fd < 0) return;
  if (close(c->ep.fd) < 0 && errno != EINTR) { /* the descriptor is released whatever close says */ }
  c->ep.fd = -1;
  partial_bytes -= c->counted;
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
    send_cancel(tsbox, id, c);
  }
  while (c->ids_head != NULL) pending_remove(c->ids_head);
}

static void client_error(struct client *c, const char *syscall, int err) {
  struct line l;
  if (log_begin(&l, LEVEL_DEBUG)) {
    log_errno(&l, err, syscall, NULL);
    log_end(&l, "containerd connection error");
  }
  client_close(c);
}

/* Writes what is queued for a client; a client drained of its answers is read again. */
static void client_flush(struct client *c) {
  if (send_queued(c->ep.fd, &c->out) < 0) {
    client_error(c, "write", errno);
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
  struct line l;
  if (log_begin(&l, LEVEL_WARN)) {
    log_num(&l, "bytes", (long long)decoder_buffered(&largest->dec));
    log_end(&l, "task socket: closing the connection holding the most bytes of unfinished frames");
  }
  client_close(largest);
}

static void warn_protocol(const char *msg, const char *k1, long long v1, const char *k2, long long v2) {
  struct line l;
  if (!log_begin(&l, LEVEL_WARN)) return;
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
  if (names_front_service(d->frame + HEADER_BYTES, d->length)) {
    warn_protocol("task socket: closing a connection that called the front's own service", "streamId", d->stream_id, NULL, 0);
    free(d->frame);
    client_close(c);
    return -1;
  }
  c->last_stream_id = d->stream_id;
  /* Out of stream ids on tsbox's connection: a new one renumbers (backend_accept). */
  if (next_id > LAST_STREAM_ID && tsbox != NULL) backend_close(tsbox, NULL, 0);
  struct pending *p = calloc(1, sizeof *p);
  if (p == NULL) {
    log_msg(LEVEL_FATAL, "task front out of memory");
    _exit(1);
  }
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
  if (tsbox != NULL) backend_write(tsbox, p->frame, p->len);
  return 0;
}

static void client_readable(struct client *c) {
  static unsigned char chunk[READ_CHUNK];
  ssize_t n = read(c->ep.fd, chunk, sizeof chunk);
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN) return;
    client_error(c, "read", errno);
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
      if (log_begin(&l, LEVEL_WARN)) {
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
 * it is not watched until the next sweep, so that the front does not spin meanwhile.
 */
static void rest_listener(struct endpoint *ep) {
  watch(ep, 0, EPOLL_CTL_MOD);
  listeners_resting = 1;
}

static void client_accept(void) {
  for (;;) {
    int fd = accept4(task_listener.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN) return;
      if ((errno == EMFILE || errno == ENFILE) && spare_fd >= 0) {
        /* Out of descriptors: the spare one takes the connection only to refuse it. */
        struct line l;
        if (log_begin(&l, LEVEL_WARN)) {
          log_errno(&l, errno, "accept", NULL);
          log_end(&l, "task socket: connection refused, no descriptor left");
        }
        (void)close(spare_fd); /* released whatever close says */
        int refused = accept4(task_listener.fd, NULL, NULL, SOCK_CLOEXEC);
        if (refused >= 0) (void)close(refused); /* refused on purpose */
        spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (refused < 0) return;
        continue;
      }
      struct line l;
      if (log_begin(&l, LEVEL_WARN)) {
        log_errno(&l, errno, "accept", NULL);
        log_end(&l, "task socket: accept failed");
      }
      rest_listener(&task_listener);
      return;
    }
    if (nclients >= MAX_FRONT_CONNECTIONS && !evict_idle()) {
      warn_protocol("task socket: connection refused, every one carries a call", "max", MAX_FRONT_CONNECTIONS, NULL, 0);
      if (close(fd) < 0 && errno != EINTR) { /* refused whatever close says */ }
      continue;
    }
    struct client *c = calloc(1, sizeof *c);
    if (c == NULL) {
      log_msg(LEVEL_FATAL, "task front out of memory");
      _exit(1);
    }
    c->ep.kind = KIND_CLIENT;
    c->ep.fd = fd;
    c->last_active = now_ms();
    c->prev = clients_tail;
    if (clients_tail != NULL) clients_tail->next = c;
    else clients_head = c;
    clients_tail = c;
    nclients++;
    c->events = client_wanted(c);
    watch(&c->ep, c->events, EPOLL_CTL_ADD);
  }
}

/* tsbox's answers, each to the client and stream it answers. */
static void backend_readable(struct backend *b) {
  static unsigned char chunk[READ_CHUNK];
  ssize_t n = read(b->ep.fd, chunk, sizeof chunk);
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN) return;
    backend_close(b, "read", errno);
    return;
  }
  if (n == 0) {
    backend_close(b, NULL, 0);
    return;
  }
  size_t at = 0;
  struct decoded d;
  while (decoder_next(&b->dec, TYPE_RESPONSE, chunk, (size_t)n, &at, &d)) {
    if (d.skipped != SKIP_NONE || d.frame == NULL) continue;
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

static void backend_accept(void) {
  for (;;) {
    int fd = accept4(backend_listener.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN) return;
      struct line l;
      if (log_begin(&l, LEVEL_WARN)) {
        log_errno(&l, errno, "accept", NULL);
        log_end(&l, "backend socket: accept failed");
      }
      rest_listener(&backend_listener);
      return;
    }
    /* A newer tsbox replaces an older connection (one that has not noticed its end yet). */
    if (tsbox != NULL) backend_close(tsbox, NULL, 0);
    struct backend *b = calloc(1, sizeof *b);
    if (b == NULL) {
      log_msg(LEVEL_FATAL, "task front out of memory");
      _exit(1);
    }
    b->ep.kind = KIND_BACKEND;
    b->ep.fd = fd;
    b->events = EPOLLIN;
    watch(&b->ep, b->events, EPOLL_CTL_ADD);
    tsbox = b;
    /* A new connection numbers its streams from 1: the kept requests go first, in the order
       they came, then new ones. The table is rebuilt under the new ids. */
    memset(pending_table, 0, sizeof pending_table);
    next_id = 1;
    size_t replayed = 0;
    for (struct pending *p = pending_head; p != NULL; p = p->next) {
      p->id = next_id;
      next_id += 2;
      put_u32(p->frame + 4, (uint32_t)p->id);
      pending_hash_add(p);
      replayed++;
    }
    for (struct pending *p = pending_head; p != NULL && tsbox == b; p = p->next) backend_write(b, p->frame, p->len);
    struct line l;
    if (log_begin(&l, LEVEL_INFO)) {
      log_num(&l, "replayed", (long long)replayed);
      log_end(&l, "tsbox connected");
    }
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

/* ---- the log file ---- */

static const char *log_path;
static unsigned long long log_max_bytes = 8ull * 1024 * 1024;
static unsigned long long log_check_ms = 60000;

/* Copies `from` to `to` (created with `mode`, replaced when there); -1 with errno and the call. */
static int copy_file(const char *from, const char *to, mode_t mode, const char **syscall, const char **path) {
  int in = open(from, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (in < 0) {
    *syscall = "open";
    *path = from;
    return -1;
  }
  int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (out < 0) {
    *syscall = "open";
    *path = to;
    int saved = errno;
    (void)close(in); /* the open already failed; errno says why */
    errno = saved;
    return -1;
  }
  static char chunk[READ_CHUNK];
  int rc = 0;
  for (;;) {
    ssize_t n = read(in, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *syscall = "read";
      *path = from;
      rc = -1;
      break;
    }
    if (n == 0) break;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = write(out, chunk + off, (size_t)(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        *syscall = "write";
        *path = to;
        rc = -1;
        break;
      }
      off += w;
    }
    if (rc < 0) break;
  }
  int saved = errno;
  if (rc == 0 && fchmod(out, mode) < 0) {
    *syscall = "fchmod";
    *path = to;
    saved = errno;
    rc = -1;
  }
  (void)close(in); /* read only */
  if (close(out) < 0 && rc == 0) {
    *syscall = "close";
    *path = to;
    saved = errno;
    rc = -1;
  }
  errno = saved;
  return rc;
}

/*
 * Keeps the log (stdout, a file opened for appending) under log_max_bytes: past it the file is
 * copied to <path>.1 (the previous copy replaced) and cut to nothing; appends go on at its new
 * end. A check that fails is logged and tried again at the next one.
 */
static void check_log(void) {
  struct line l;
  struct stat st;
  const char *syscall = "stat", *path = log_path;
  char kept[PATH_MAX];
  if (stat(log_path, &st) < 0) goto failed;
  if ((unsigned long long)st.st_size <= log_max_bytes) return;
  if (!S_ISREG(st.st_mode)) return; /* not a file to cut */
  if ((size_t)snprintf(kept, sizeof kept, "%s.1", log_path) >= sizeof kept) {
    errno = ENAMETOOLONG;
    path = log_path;
    goto failed;
  }
  if (copy_file(log_path, kept, st.st_mode & 07777, &syscall, &path) < 0) goto failed;
  if (ftruncate(STDOUT_FILENO, 0) < 0) {
    syscall = "ftruncate";
    path = NULL;
    goto failed;
  }
  if (log_begin(&l, LEVEL_INFO)) {
    log_str(&l, "path", log_path);
    log_num(&l, "bytes", (long long)st.st_size);
    log_str(&l, "kept", kept);
    log_end(&l, "log file cut: what it held is in the kept copy");
  }
  return;
failed:
  /* Gone: someone removed the log; nothing to cut (writes go to the unlinked file). */
  if (errno == ENOENT || errno == ESRCH) return;
  int e = errno;
  if (log_begin(&l, LEVEL_WARN)) {
    log_errno(&l, e, syscall, path);
    log_str(&l, "path", log_path);
    log_end(&l, "cannot cut the log file");
  }
}

/* ---- start-up ---- */

/* Why the front cannot start: logged at level fatal, exit 1. */
static void start_failed_errno(int e, const char *syscall, const char *path) {
  char text[128], message[PATH_MAX + 256];
  errno_text(e, text, sizeof text);
  snprintf(message, sizeof message, "task front cannot start: %s: %s, %s '%s'", errno_name(e), text, syscall, path);
  struct line l;
  if (log_begin(&l, LEVEL_FATAL)) {
    log_errno(&l, e, syscall, path);
    log_end(&l, message);
  }
  exit(1);
}

static void start_failed_precondition(const char *what) {
  char message[PATH_MAX + 256];
  snprintf(message, sizeof message, "task front cannot start: %s", what);
  struct line l;
  if (log_begin(&l, LEVEL_FATAL)) {
    line_str(&l, ",\"err\":{\"type\":\"TsboxError\"");
    log_str(&l, "message", what);
    log_str(&l, "kind", "FailedPrecondition");
    log_str(&l, "name", "TsboxError");
    line_str(&l, "}");
    log_end(&l, message);
  }
  exit(1);
}

/* mkdir -p of `path`'s directory, mode 0755 for what it makes. */
static void make_parent(const char *path) {
  char dir[PATH_MAX];
  if ((size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir) start_failed_errno(ENAMETOOLONG, "mkdir", path);
  char *slash = strrchr(dir, '/');
  if (slash == NULL) return;
  if (slash == dir) return; /* the root */
  *slash = 0;
  for (char *p = dir + 1;; p++) {
    if (*p != '/' && *p != 0) continue;
    char saved = *p;
    *p = 0;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) start_failed_errno(errno, "mkdir", dir);
    *p = saved;
    if (saved == 0) break;
  }
  struct stat st;
  if (stat(dir, &st) < 0) start_failed_errno(errno, "stat", dir);
  if (!S_ISDIR(st.st_mode)) start_failed_errno(ENOTDIR, "mkdir", dir);
}

static void socket_address(const char *path, struct sockaddr_un *addr) {
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  if (strlen(path) >= sizeof addr->sun_path) start_failed_errno(ENAMETOOLONG, "bind", path);
  memcpy(addr->sun_path, path, strlen(path));
}

/*
 * True when a server answers at `path` within 1 s: it accepts, or is too busy to accept yet
 * (still a live server). Refused or anything else: nobody serves there.
 */
static int socket_live(const char *path) {
  struct sockaddr_un addr;
  socket_address(path, &addr);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) start_failed_errno(errno, "socket", path);
  int live = 0;
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) {
    live = 1;
  } else if (errno == EINPROGRESS || errno == EAGAIN) {
    live = 1;
  }
  if (close(fd) < 0 && errno != EINTR) { /* a probe: released whatever close says */ }
  return live;
}

/*
 * Listens on `path` as src/transport/socket.ts prepares and claims a socket: its directory
 * made, a stale socket replaced, a live one or a non-socket refused; mode 0600.
 */
static void listen_on(struct endpoint *ep, const char *path) {
  make_parent(path);
  struct stat st;
  if (lstat(path, &st) == 0) {
    char what[PATH_MAX + 128];
    if (!S_ISSOCK(st.st_mode)) {
      snprintf(what, sizeof what, "%s exists and is not a socket; refusing to replace it", path);
      start_failed_precondition(what);
    }
    if (socket_live(path)) {
      snprintf(what, sizeof what, "another server is already listening on %s", path);
      start_failed_precondition(what);
    }
    if (unlink(path) < 0 && errno != ENOENT) start_failed_errno(errno, "unlink", path);
  } else if (errno != ENOENT) {
    start_failed_errno(errno, "lstat", path);
  }
  struct sockaddr_un addr;
  socket_address(path, &addr);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) start_failed_errno(errno, "socket", path);
  /* Nobody but root reaches it from its first moment, not only once chmod ran. */
  mode_t old = umask(0177);
  int bound = bind(fd, (struct sockaddr *)&addr, sizeof addr);
  int e = errno;
  umask(old);
  if (bound < 0) start_failed_errno(e, "bind", path);
  if (listen(fd, LISTEN_BACKLOG) < 0) start_failed_errno(errno, "listen", path);
  if (chmod(path, 0600) < 0) start_failed_errno(errno, "chmod", path);
  ep->fd = fd;
  watch(ep, EPOLLIN, EPOLL_CTL_ADD);
}

static void write_pid_file(const char *path) {
  char text[32];
  int n = snprintf(text, sizeof text, "%ld\n", (long)getpid());
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) start_failed_errno(errno, "open", path);
  for (int off = 0; off < n;) {
    ssize_t w = write(fd, text + off, (size_t)(n - off));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) start_failed_errno(errno, "write", path);
    off += (int)w;
  }
  if (close(fd) < 0) start_failed_errno(errno, "close", path);
}

/* ---- the command line ---- */

static const char USAGE[] = "usage: tsbox-front --listen TASK_SOCKET --backend BACKEND_SOCKET [--pid-file FILE] [--log-level LEVEL] [--log-file FILE [--log-max-bytes N] [--log-check-ms N]]\n";

static void usage_error(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "tsbox-front: %s\n%s", msg, USAGE);
  exit(2);
}

/* A whole number in decimal; -1 when it is not one. */
static int parse_whole(const char *s, unsigned long long *out) {
  if (*s == 0) return -1;
  unsigned long long v = 0;
  for (const char *p = s; *p != 0; p++) {
    if (*p < '0' || *p > '9') return -1;
    if (v > (ULLONG_MAX - 9) / 10) return -1;
    v = v * 10 + (unsigned)(*p - '0');
  }
  *out = v;
  return 0;
}

static int level_of(const char *name) {
  static const struct {
    const char *name;
    int level;
  } levels[] = {{"trace", LEVEL_TRACE}, {"debug", LEVEL_DEBUG}, {"info", LEVEL_INFO}, {"warn", LEVEL_WARN}, {"error", LEVEL_ERROR}, {"fatal", LEVEL_FATAL}, {"silent", LEVEL_SILENT}};
  for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
    if (strcmp(levels[i].name, name) == 0) return levels[i].level;
  return -1;
}

int main(int argc, char **argv) {
  const char *listen_path = NULL, *backend_path = NULL, *pid_path = NULL;
  const char *max_bytes_text = "8388608", *check_ms_text = "60000", *level_text = "info";
  static const char *const names[] = {"listen", "backend", "pid-file", "log-level", "log-file", "log-max-bytes", "log-check-ms"};
  const char **values[] = {&listen_path, &backend_path, &pid_path, &level_text, &log_path, &max_bytes_text, &check_ms_text};
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strncmp(arg, "--", 2) != 0) usage_error("unexpected argument '%s'", arg);
    const char *eq = strchr(arg, '=');
    size_t name_len = eq != NULL ? (size_t)(eq - arg - 2) : strlen(arg) - 2;
    size_t k = 0;
    while (k < sizeof names / sizeof names[0] && !(strlen(names[k]) == name_len && strncmp(names[k], arg + 2, name_len) == 0)) k++;
    if (k == sizeof names / sizeof names[0]) usage_error("unknown option '%s'", arg);
    if (eq != NULL) {
      *values[k] = eq + 1;
    } else {
      if (i + 1 >= argc) usage_error("option '--%s <value>' argument missing", names[k]);
      *values[k] = argv[++i];
    }
  }
  log_level = level_of(level_text);
  if (log_level < 0) usage_error("unknown log level '%s'", level_text);
  if (listen_path == NULL || backend_path == NULL) {
    fputs(USAGE, stderr);
    return 2;
  }
  if (log_path != NULL && (parse_whole(max_bytes_text, &log_max_bytes) < 0 || log_max_bytes < 1024 || parse_whole(check_ms_text, &log_check_ms) < 0 || log_check_ms < 10 || log_check_ms > INT32_MAX)) {
    fputs("tsbox-front: --log-max-bytes must be a whole number of bytes, at least 1024; --log-check-ms at least 10 (and at most 2147483647)\n", stderr);
    return 2;
  }

  /* Buffers of 128 KiB and more (frames on their way, answers queued) are mapped and given
     back whole when freed: glibc's moving threshold would otherwise keep what an attack made
     the front hold in its heap for good. */
  if (mallopt(M_MMAP_THRESHOLD, 128 * 1024) == 0) start_failed_errno(EINVAL, "mallopt", "M_MMAP_THRESHOLD");
  /* Room for every connection it admits (as Node allows itself the hard limit). */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) < 0) start_failed_errno(errno, "getrlimit", "RLIMIT_NOFILE");
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0) start_failed_errno(errno, "setrlimit", "RLIMIT_NOFILE");
  }
  /* A peer gone mid-write is an error of that write (MSG_NOSIGNAL), stdout's too. */
  if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) start_failed_errno(errno, "signal", "SIGPIPE");
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGHUP);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0) start_failed_errno(errno, "sigprocmask", "SIGTERM");
  signals.fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signals.fd < 0) start_failed_errno(errno, "signalfd", "SIGTERM");
  epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) start_failed_errno(errno, "epoll_create1", "epoll");
  watch(&signals, EPOLLIN, EPOLL_CTL_ADD);
  spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (spare_fd < 0) start_failed_errno(errno, "open", "/dev/null");

  int64_t next_log_check = 0;
  if (log_path != NULL) {
    check_log();
    next_log_check = now_ms() + (int64_t)log_check_ms;
  }
  listen_on(&backend_listener, backend_path);
  listen_on(&task_listener, listen_path);
  struct line l;
  if (log_begin(&l, LEVEL_INFO)) {
    log_str(&l, "listen", listen_path);
    log_str(&l, "backend", backend_path);
    log_end(&l, "task front listening");
  }
  if (pid_path != NULL) write_pid_file(pid_path);

  int64_t next_sweep = now_ms() + SWEEP_MS;
  struct epoll_event events[64];
  for (;;) {
    int64_t now = now_ms();
    int64_t next = next_sweep;
    if (log_path != NULL && next_log_check < next) next = next_log_check;
    int timeout = next > now ? (int)(next - now) : 0;
    int n = epoll_wait(epfd, events, 64, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (log_begin(&l, LEVEL_FATAL)) {
        log_errno(&l, errno, "epoll_wait", NULL);
        log_end(&l, "task front cannot wait for its connections");
      }
      return 1;
    }
    for (int i = 0; i < n; i++) {
      struct endpoint *ep = events[i].data.ptr;
      uint32_t ev = events[i].events;
      if (ep->fd < 0) continue; /* closed earlier in this batch */
      switch (ep->kind) {
      case KIND_TASK_LISTENER:
        client_accept();
        break;
      case KIND_BACKEND_LISTENER:
        backend_accept();
        break;
      case KIND_SIGNALS: {
        struct signalfd_siginfo si;
        while (read(signals.fd, &si, sizeof si) == (ssize_t)sizeof si) {
          if (si.ssi_signo == SIGTERM) {
            log_msg(LEVEL_INFO, "SIGTERM: the task front ends; containerd's task connections close with it");
            return 0;
          }
          if (log_begin(&l, LEVEL_INFO)) {
            log_str(&l, "signal", si.ssi_signo == SIGHUP ? "SIGHUP" : "SIGINT");
            log_end(&l, "ignored");
          }
        }
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
      case KIND_BACKEND: {
        struct backend *b = (struct backend *)ep;
        if ((ev & EPOLLOUT) && backend_flush(b) < 0) break;
        if (b->ep.fd >= 0 && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) backend_readable(b);
        break;
      }
      }
    }
    while (dead_clients != NULL) {
      struct client *c = dead_clients;
      dead_clients = c->dead_next;
      free(c);
    }
    while (dead_backends != NULL) {
      struct backend *b = dead_backends;
      dead_backends = b->dead_next;
      free(b);
    }
    now = now_ms();
    if (now >= next_sweep) {
      check_frames(now);
      if (listeners_resting) {
        watch(&task_listener, EPOLLIN, EPOLL_CTL_MOD);
        watch(&backend_listener, EPOLLIN, EPOLL_CTL_MOD);
        listeners_resting = 0;
      }
      next_sweep = now + SWEEP_MS;
    }
    if (log_path != NULL && now >= next_log_check) {
      check_log();
      next_log_check = now + (int64_t)log_check_ms;
    }
    while (dead_clients != NULL) {
      struct client *c = dead_clients;
      dead_clients = c->dead_next;
      free(c);
    }
  }
}
