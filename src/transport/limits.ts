import { readFileSync } from 'node:fs';
import type { ServerOptions } from '@grpc/grpc-js';
import { isGone, withPath } from '../base/errors.js';

/**
 * The transport's limits, each with why it has its value. The peer is containerd: one
 * connection, a pending Wait per running pod on it, other calls a few at a time, requests of
 * a few KiB (up to 16 MiB allowed). Anything on the socket may also be hostile or broken, so
 * every resource a peer can make the daemon hold has a bound here.
 */

/** containerd's gRPC clients send and receive up to 16 MiB (SPEC.md section 1). */
export const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

/**
 * Streams open at once on one connection (advertised as SETTINGS_MAX_CONCURRENT_STREAMS).
 * containerd holds one Wait per running pod on its one connection (more when several clients
 * watch a sandbox), and a grpc-go client queues calls beyond the limit: if pending Waits took
 * every slot, the Stop that would end them could never be sent. So the limit is far above
 * any node's pod count (kubelet's default is 110, large nodes run a few hundred) times a few
 * watchers, and equal to the bound over all connections: containerd's may use it all.
 */
export const MAX_STREAMS_PER_CONNECTION = 8192;

/**
 * Streams open at once over all connections; above this, new streams are refused
 * (REFUSED_STREAM, which grpc-go retries). A stream held open costs memory in grpc-js: a
 * pending Wait about 8 KiB, a stream held by a hostile peer with a full header block about
 * 16 KiB, so this bounds what held streams can cost to about 130 MiB.
 */
export const MAX_OPEN_STREAMS = 8192;

/**
 * Largest header block accepted, decoded (SETTINGS_MAX_HEADER_LIST_SIZE). containerd's
 * metadata is a few hundred bytes; 8 KiB is gRPC's own default (C core, Java). Together with
 * MAX_OPEN_STREAMS it bounds what held header blocks can cost (64 MiB).
 */
export const MAX_HEADER_LIST_BYTES = 8 * 1024;

/**
 * Request bytes received for calls whose request has not ended yet, over all connections.
 * Legitimate requests arrive whole within a millisecond; a peer that opens many streams and
 * sends a body it never ends would otherwise hold 16 MiB per stream. Past this, the
 * connection holding the most such bytes is closed. Four maximal requests fit at once.
 */
export const MAX_PENDING_REQUEST_BYTES = 4 * MAX_MESSAGE_BYTES;

/**
 * Time a call's request has to arrive whole after its headers. containerd sends headers and
 * message in one write; a stream that stays incomplete longer is a broken or hostile peer
 * holding memory, and is reset.
 */
export const REQUEST_ARRIVAL_MS = 30_000;

/**
 * Memory one HTTP/2 session may use inside node (nghttp2's state and queued output), in MB
 * as node counts it. Past it, node refuses new streams on that connection, and closes it when
 * the peer keeps trying: this is what bounds the output queued for a peer that sends requests
 * and never reads the answers. Our answers are small (Metrics is the largest, a few KiB).
 */
export const MAX_SESSION_MEMORY_MB = 32;

/**
 * A connection with no call for this long is closed (GOAWAY, then close). containerd keeps
 * its connection busy with a Wait per running pod, and redials in a millisecond on a unix
 * socket when it has none; a peer that connects and sends nothing loses its slot.
 */
export const MAX_CONNECTION_IDLE_MS = 2 * 60_000;

/**
 * Keepalive: the server PINGs every connection every KEEPALIVE_TIME_MS and closes one that
 * sends no PING ACK within KEEPALIVE_TIMEOUT_MS. The kernel tells when a peer on a unix socket
 * goes away, but not when it is there and stopped reading (a frozen process, a client that
 * never reads). And node leaves a connection it ended with a protocol error (e.g. GOAWAY
 * FRAME_SIZE_ERROR) open without reading it, so even the peer's close goes unseen: the
 * unanswered PING is what frees its descriptor. So each such connection lasts at most 20 s.
 * containerd's grpc-go transport answers PINGs at once; one PING per 10 s costs nothing.
 * Client PINGs need no permit policy here: node answers them, and nghttp2 closes a connection
 * that lets more than 1 000 unread answers (PING or SETTINGS ACKs) pile up.
 */
export const KEEPALIVE_TIME_MS = 10_000;
export const KEEPALIVE_TIMEOUT_MS = 10_000;

/**
 * Connections at once (the connection table, connections.ts). Each connection costs a file
 * descriptor, and node cannot raise RLIMIT_NOFILE above the hard limit it already runs at;
 * sandboxes need descriptors too (supervisor pipes, pidfds, record files), and a Start that
 * meets EMFILE fails. So the bound is at most a quarter of the descriptor limit, and 256 at
 * most: containerd uses one connection, operators' tools a few more. A connection past the
 * bound is not refused: it takes the place of a connection that carries no call (the
 * order is in connections.ts), so that a peer holding slots cannot lock containerd out.
 */
export function maxConnections(limit = openFilesLimit()): number {
  return Math.max(16, Math.min(256, Math.floor(limit / 4)));
}

/**
 * Connections accepted and not read yet, beside the maxConnections the table holds
 * (connections.ts). A connection can only be judged once a later event-loop turn has read it:
 * until then, closing it to make room for another could close containerd's new connection.
 * libuv accepts one connection a turn today (older versions took all the kernel had queued,
 * up to LISTEN_BACKLOG, in one turn), so they are held apart, as many as the kernel queue
 * holds and within the same quarter of the descriptor limit as the table; past that a new one
 * is refused, as the kernel refuses a connection past its queue. Each waits a turn or two.
 */
export function maxArrivingConnections(limit = openFilesLimit()): number {
  return Math.max(16, Math.min(LISTEN_BACKLOG, Math.floor(limit / 4)));
}

/**
 * Connections the kernel queues for accept on the listening socket (the kernel caps it at
 * net.core.somaxconn, 4096 on current kernels). Past it, a client's connect fails at once
 * (EAGAIN on a unix socket) and grpc-go reports UNAVAILABLE. node's default, 511, fills while
 * a peer opens connections faster than the daemon takes them (each costs an HTTP/2 session);
 * a deeper queue lets containerd's connection wait its turn instead of being turned away.
 */
export const LISTEN_BACKLOG = 4096;

/**
 * Time a new connection has to complete the HTTP/2 handshake (the preface and its first
 * SETTINGS frame). containerd's grpc-go sends both in its first write; a connection that has
 * not is a broken or hostile peer holding a slot and a descriptor (only that: until then the
 * connection table reads it itself, no HTTP/2 session exists for it).
 */
export const HANDSHAKE_MS = 5000;

/**
 * A connection that carries no call and has been quiet for CONNECTION_PING_MS is sent a PING;
 * one whose PING node has not even sent within CONNECTION_PING_TIMEOUT_MS is closed. This is
 * what frees a connection whose peer left unseen: node ends a connection on a protocol error
 * (a frame longer than allowed, a DATA frame on an idle stream) with a GOAWAY, then sends and
 * reads nothing more, so the peer's close never reaches it; its PING stays queued. A PING that
 * went out and waits for its answer is never a reason to close: a client whose event loop is
 * busy for seconds (a large message to encode, a GC pause) answers late, and closing its
 * connection would refuse the call it is sending (grpc-js cannot retry a large one elsewhere).
 * Such a connection is left to grpc-js's keepalive (KEEPALIVE_TIME_MS). One PING a second on
 * a quiet unix socket costs nothing.
 */
export const CONNECTION_PING_MS = 1000;
export const CONNECTION_PING_TIMEOUT_MS = 1000;

/**
 * When the table is full, a connection that completed its handshake or ended a call less than
 * this ago is evicted only after every other connection without a call: a client sends its
 * call right after its handshake (containerd in the same write), and the next one soon after
 * the last, and must get to make it while a flood of new connections takes the slots.
 */
export const NEW_CLIENT_GRACE_MS = 1000;

/**
 * When the table is full of connections that rank above one that has sent nothing yet (clients
 * in their grace, calls), that one waits this long after its accept for its first bytes before
 * it is turned away: a client connects, then writes its handshake, and a busy machine may put
 * a few scheduling delays in between. Waiting costs a descriptor, within maxArrivingConnections.
 */
export const FIRST_BYTES_MS = 250;

/** How often the connection table checks its deadlines: within half the shortest one. */
export const CONNECTION_SWEEP_MS = 100;

/** The soft RLIMIT_NOFILE of this process (node has no getrlimit); 1024 when unreadable. */
export function openFilesLimit(): number {
  let text: string;
  try {
    text = readFileSync('/proc/self/limits', 'utf8');
  } catch (err) {
    // Not Linux, or no /proc: assume the usual default soft limit.
    if (isGone(err)) return 1024;
    throw withPath(err, '/proc/self/limits', 'read');
  }
  const match = /^Max open files\s+(\d+|unlimited)/m.exec(text);
  if (match === null || match[1] === 'unlimited') return 1024 * 1024;
  return Number(match[1]);
}

/** The grpc-js server options; the header-list bound is set on its http2 server (server.ts). */
export const GRPC_SERVER_OPTIONS: ServerOptions = {
  'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
  'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
  'grpc.max_concurrent_streams': MAX_STREAMS_PER_CONNECTION,
  'grpc-node.max_session_memory': MAX_SESSION_MEMORY_MB,
  'grpc.max_connection_idle_ms': MAX_CONNECTION_IDLE_MS,
  'grpc.keepalive_time_ms': KEEPALIVE_TIME_MS,
  'grpc.keepalive_timeout_ms': KEEPALIVE_TIMEOUT_MS,
  // channelz keeps per-call statistics nobody reads here: it costs time on every call.
  'grpc.enable_channelz': 0,
};

/** The largest delay a node timer takes; a longer one fires after 1 ms. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * How long before a call's deadline tsbox gives up on it and answers DEADLINE_EXCEEDED: at
 * most this, and at most a tenth of the time left when its handler first waits on it. The deadline tsbox reads was
 * passed on by containerd, which keeps the same deadline for its own caller: an answer that
 * comes at the deadline races containerd's own expiry, and a grpc-go server that reaches its
 * deadline first resets its caller's stream (RST_STREAM CANCEL), which a grpc-js or any
 * non-Go caller reports as CANCELLED. Answering this much earlier lets containerd pass
 * DEADLINE_EXCEEDED on, as podsandbox's Wait gives it. It covers the round trip on the unix
 * socket and the lateness of a timer on a busy event loop: 25 ms was not enough on the slow
 * test node, where a Wait's answer came after the caller's own timer had ended the call.
 */
export const DEADLINE_MARGIN_MS = 100;
