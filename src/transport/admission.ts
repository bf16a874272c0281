import http2 from 'node:http2';
import type { Server } from '@grpc/grpc-js';
import type { Logger } from 'pino';
import {
  MAX_HEADER_LIST_BYTES,
  MAX_OPEN_STREAMS,
  MAX_PENDING_REQUEST_BYTES,
  MAX_TIMER_MS,
  REQUEST_ARRIVAL_MS,
} from './limits.js';

type StreamListener = (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, ...rest: unknown[]) => void;

/** Milliseconds per grpc-timeout unit. */
const TIMEOUT_UNITS: Readonly<Record<string, number>> = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 1e-3, n: 1e-6 };

/**
 * grpc-js turns a grpc-timeout into a 32-bit delay: one above 2^31-1 ms (24.8 days) wraps
 * and the call fails as DEADLINE_EXCEEDED at once. Such a header is dropped instead; the
 * client still ends the call when its own deadline passes.
 */
function dropOverlongTimeout(headers: http2.IncomingHttpHeaders): void {
  const value = headers['grpc-timeout'];
  if (typeof value !== 'string') return;
  const match = /^(\d{1,8})([HMSmun])$/.exec(value);
  if (match === null) return; // grpc-js answers a malformed one itself
  if (Number(match[1]) * (TIMEOUT_UNITS[match[2] as string] as number) > MAX_TIMER_MS) delete headers['grpc-timeout'];
}

/**
 * The http2 server grpc-js made for a connection injector. grpc-js offers no way to reach it,
 * and tsbox needs it for the bounds grpc-js has no option for; the field is checked here so
 * that a grpc-js upgrade that moves it fails at start (and in every test), never silently.
 */
export function injectorHttp2Server(server: Server): http2.Http2Server {
  const servers = (server as unknown as { http2Servers?: unknown }).http2Servers;
  if (!(servers instanceof Map) || servers.size !== 1) {
    throw new Error('grpc-js internals changed: cannot find the http2 server of the connection injector');
  }
  const [http2Server] = servers.keys() as IterableIterator<http2.Http2Server>;
  if (typeof http2Server?.updateSettings !== 'function' || http2Server.listenerCount('stream') !== 1) {
    throw new Error('grpc-js internals changed: its http2 server is not what tsbox expects');
  }
  return http2Server;
}

/**
 * Puts the stream admission in front of grpc-js, on the http2 server of its one connection
 * injector (injectorHttp2Server; call before any connection is injected):
 * - advertises and enforces MAX_HEADER_LIST_BYTES (node's own bound, set explicitly);
 * - refuses streams beyond MAX_OPEN_STREAMS over all connections;
 * - counts request bytes of calls whose request has not ended, and closes the connection
 *   holding the most of them when the total passes MAX_PENDING_REQUEST_BYTES;
 * - resets a stream whose request has not ended REQUEST_ARRIVAL_MS after its headers;
 * - drops a grpc-timeout grpc-js cannot represent.
 * Returns a function that stops the sweep timer.
 */
export function admitStreams(http2Server: http2.Http2Server, log: Logger): () => void {
  http2Server.updateSettings({ maxHeaderListSize: MAX_HEADER_LIST_BYTES });
  const [grpcHandler] = http2Server.listeners('stream') as StreamListener[];
  http2Server.removeAllListeners('stream');

  let openStreams = 0;
  let pendingBytes = 0;
  /** Request bytes held per connection, for calls whose request has not ended. */
  const heldBySession = new Map<http2.Http2Session, number>();
  /** Streams whose request has not ended, with when their headers came. */
  const incomplete = new Map<http2.ServerHttp2Stream, number>();

  const shed = (): void => {
    let worst: http2.Http2Session | undefined;
    let most = 0;
    for (const [session, bytes] of heldBySession) {
      if (bytes > most) {
        most = bytes;
        worst = session;
      }
    }
    if (worst === undefined) return;
    log.warn({ heldBytes: most, pendingBytes }, 'closing a connection that holds too many unfinished request bytes');
    heldBySession.delete(worst);
    worst.destroy(undefined, http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
  };

  http2Server.on('stream', (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, ...rest: unknown[]) => {
    // Streams are only closed from here on; their errors are reported by their 'close'.
    stream.on('error', () => undefined);
    // node announces a stream a tick after it read its headers; a RST_STREAM read with them
    // (or the session's end) has destroyed it by then. grpc-js answers a call it has no
    // method for, or one with the wrong content-type, without looking, and node throws when a
    // gone stream is answered: so a gone stream goes no further. There is no one to answer.
    if (stream.destroyed || stream.closed) return;
    if (openStreams >= MAX_OPEN_STREAMS) {
      stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
      return;
    }
    openStreams++;
    const session = stream.session;
    let held = 0;
    const release = (): void => {
      incomplete.delete(stream);
      if (held === 0) return;
      pendingBytes -= held;
      if (session !== undefined) {
        const left = (heldBySession.get(session) ?? 0) - held;
        if (left > 0) heldBySession.set(session, left);
        else heldBySession.delete(session);
      }
      held = 0;
    };
    stream.once('close', () => {
      openStreams--;
      release();
    });
    if (stream.readableEnded || stream.endAfterHeaders) {
      // The request ended with its headers: nothing to count.
    } else {
      incomplete.set(stream, Date.now());
      stream.once('end', release);
      stream.on('data', (chunk: Buffer) => {
        if (!incomplete.has(stream) || session === undefined) return;
        held += chunk.length;
        pendingBytes += chunk.length;
        heldBySession.set(session, (heldBySession.get(session) ?? 0) + chunk.length);
        if (pendingBytes > MAX_PENDING_REQUEST_BYTES) shed();
      });
    }
    dropOverlongTimeout(headers);
    grpcHandler?.call(http2Server, stream, headers, ...rest);
  });

  const sweep = setInterval(
    () => {
      const cutoff = Date.now() - REQUEST_ARRIVAL_MS;
      for (const [stream, since] of incomplete) {
        if (since > cutoff) continue;
        incomplete.delete(stream);
        stream.close(http2.constants.NGHTTP2_CANCEL);
      }
    },
    Math.ceil(REQUEST_ARRIVAL_MS / 4),
  );
  sweep.unref();
  return () => clearInterval(sweep);
}
