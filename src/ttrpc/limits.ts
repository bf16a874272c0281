/**
 * The ttrpc server's limits, each with why it has its value. The peer is containerd: one
 * connection per task (SPEC.md section 7), a pending Wait on each, other calls one or a few at
 * a time, requests of a few KiB. Anything on the socket may also be hostile or broken, so every
 * resource a peer can make the server hold has a bound here, as on the gRPC side
 * (src/transport/limits.ts).
 */

/** ttrpc's frame header: length u32, stream id u32, type u8, flags u8, big-endian. */
export const HEADER_BYTES = 10;

/** ttrpc's largest message (messageLengthMax in its channel.go): 4 MiB, its client's bound too. */
export const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

/**
 * Calls in flight on one connection. containerd keeps a Wait per process of the task (its
 * init and each exec) on the task's connection, plus a few calls at a time: far below this. A
 * call past it is answered RESOURCE_EXHAUSTED at once.
 */
export const MAX_CALLS_PER_CONNECTION = 1024;

/**
 * Calls in flight over all connections: a pending Wait per container and exec on a node of a
 * few hundred pods fits many times over. Each call holds its decoded request and a timer or
 * two, a few KiB; past the bound, new calls are answered RESOURCE_EXHAUSTED.
 */
export const MAX_CALLS = 8192;

/**
 * Bytes held in frames that have not arrived whole, over all connections. containerd writes a
 * frame in one write; a peer that announces large frames and sends them slowly (or never)
 * would otherwise hold 4 MiB per connection. Past this, the connection holding the most such
 * bytes is closed. Eight maximal messages fit at once.
 */
export const MAX_PARTIAL_FRAME_BYTES = 8 * MAX_MESSAGE_BYTES;

/** Time a frame has to arrive whole once its first byte came; containerd's come in one write. */
export const FRAME_ARRIVAL_MS = 10_000;

/**
 * Answers queued for a connection whose peer does not read them. Past this the server stops
 * reading that connection until its output drains, so a peer that sends requests and never
 * reads the answers holds at most this much.
 */
export const MAX_QUEUED_OUTPUT_BYTES = 1024 * 1024;

/** How often the server checks frame deadlines: a tenth of the deadline. */
export const SWEEP_MS = 1000;
