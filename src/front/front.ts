import { createServer, type Server, type Socket } from 'node:net';
import type { Logger } from 'pino';
import { FrameDecoder, FrameType, encodeFrame } from '../ttrpc/frame.js';
import { encodeCancel, namesFrontService } from '../ttrpc/front-link.js';
import { FRAME_ARRIVAL_MS, MAX_PARTIAL_FRAME_BYTES, SWEEP_MS } from '../ttrpc/limits.js';
import { writeBounded } from '../ttrpc/peer.js';
import { claimSocket, prepareSocketPath } from '../transport/socket.js';

/**
 * The task front: the process that owns the Task API socket and containerd's connections to
 * it, so that a restart of tsbox — planned or a crash — breaks none of them. containerd's
 * ttrpc client never redials, and CRI takes a broken Wait for the container's exit (research
 * notes on the Task API, §1.6): whoever holds those connections must outlive tsbox.
 *
 * It knows ttrpc's framing and nothing else. Each request from containerd gets a stream id of
 * the front's own (odd, increasing) and goes to tsbox over one connection tsbox opens to the
 * front's backend socket; each answer goes back to the connection and stream it came from.
 * Requests not yet answered are kept, and sent again, in order, to the next tsbox that
 * connects: containerd sees a slow answer, never a failure. tsbox's handlers give the same
 * answer to a request seen twice (src/tasks/tasks.ts).
 */

/**
 * Connections from containerd at most (one per task, plus its reloads); past it the one idle
 * longest with no call waiting makes room, as on tsbox's own sockets.
 */
export const MAX_FRONT_CONNECTIONS = 1024;
/** Requests kept unanswered at most (Waits: one per container and exec). */
const MAX_PENDING = 16_384;

interface Pending {
  readonly conn: ClientConn;
  readonly streamId: number;
  /** The request as relayed: its stream id (bytes 4–7) is the front's. */
  readonly frame: Buffer;
}

/**
 * The front's stream ids on tsbox's connection must increase (ttrpc's rule); past this one the
 * connection to tsbox is closed and the next one starts again from 1 (about a year of calls).
 */
const LAST_STREAM_ID = 0xfffffff0;

class ClientConn {
  readonly decoder = new FrameDecoder();
  readonly ids = new Set<number>();
  lastStreamId = 0;
  frameStartedAt = 0;
  lastActive = Date.now();
  paused = false;
  constructor(readonly socket: Socket) {}
}

export interface FrontOptions {
  readonly logger: Logger;
  /** The Task API socket containerd dials (`ttrpc+unix://…`). */
  readonly listen: string;
  /** The socket tsbox connects to. */
  readonly backend: string;
}

export class TaskFront {
  readonly #log: Logger;
  readonly #opts: FrontOptions;
  readonly #clients = new Set<ClientConn>();
  readonly #pending = new Map<number, Pending>();
  #nextId = 1;
  #tsbox: Socket | undefined;
  #partialBytes = 0;
  readonly #public: Server;
  readonly #private: Server;
  #sweep: NodeJS.Timeout | undefined;

  constructor(options: FrontOptions) {
    this.#opts = options;
    this.#log = options.logger;
    this.#public = createServer((socket) => this.#acceptClient(socket));
    this.#private = createServer((socket) => this.#acceptTsbox(socket));
  }

  get pendingCount(): number {
    return this.#pending.size;
  }

  async start(): Promise<void> {
    for (const [server, path] of [[this.#private, this.#opts.backend], [this.#public, this.#opts.listen]] as const) {
      await prepareSocketPath(path);
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(path, () => {
          server.off('error', reject);
          resolve();
        });
      });
      await claimSocket(path, 0o600);
    }
    this.#sweep = setInterval(() => this.#checkFrames(), SWEEP_MS);
    this.#sweep.unref();
    this.#log.info({ listen: this.#opts.listen, backend: this.#opts.backend }, 'task front listening');
  }

  #acceptClient(socket: Socket): void {
    if (this.#clients.size >= MAX_FRONT_CONNECTIONS && !this.#evictIdle()) {
      this.#log.warn({ max: MAX_FRONT_CONNECTIONS }, 'task socket: connection refused, every one carries a call');
      socket.destroy();
      return;
    }
    const conn = new ClientConn(socket);
    this.#clients.add(conn);
    socket.on('data', (chunk: Buffer) => this.#fromClient(conn, chunk));
    socket.on('error', (err) => this.#log.debug({ err }, 'containerd connection error'));
    socket.once('end', () => socket.destroy());
    socket.once('close', () => this.#forgetClient(conn));
  }

  /** Closes the connection idle longest that has no call waiting; false when there is none. */
  #evictIdle(): boolean {
    let victim: ClientConn | undefined;
    for (const conn of this.#clients) {
      if (conn.ids.size > 0) continue;
      if (victim === undefined || conn.lastActive < victim.lastActive) victim = conn;
    }
    if (victim === undefined) return false;
    victim.socket.destroy();
    this.#forgetClient(victim);
    return true;
  }

  #forgetClient(conn: ClientConn): void {
    if (!this.#clients.delete(conn)) return;
    this.#partialBytes -= conn.decoder.buffered;
    // Its answers have nowhere to go: tsbox ends the calls (a Wait would otherwise stay
    // until its process exits), and a later tsbox never sees them.
    if (conn.ids.size === 0) return;
    for (const id of conn.ids) this.#pending.delete(id);
    if (this.#tsbox !== undefined && !this.#tsbox.destroyed && this.#nextId <= LAST_STREAM_ID) {
      // Its own stream id on tsbox's connection; the answer matches no pending call and is dropped.
      const id = this.#nextId;
      this.#nextId += 2;
      this.#tsbox.write(encodeCancel(id, conn.ids));
    }
    conn.ids.clear();
  }

  #fromClient(conn: ClientConn, chunk: Buffer): void {
    conn.lastActive = Date.now();
    this.#partialBytes -= conn.decoder.buffered;
    const decoded = conn.decoder.push(chunk);
    this.#partialBytes += conn.decoder.buffered;
    conn.frameStartedAt = conn.decoder.midFrame ? conn.frameStartedAt || Date.now() : 0;
    for (const item of decoded) {
      if (conn.socket.destroyed) return;
      if (item.kind === 'skipped') {
        // A frame over ttrpc's limit or of a type it does not know: not containerd's.
        this.#log.warn({ reason: item.reason, bytes: item.header.length }, 'task socket: closing a connection that broke the protocol');
        conn.socket.destroy();
        return;
      }
      const { frame } = item;
      if (frame.type !== FrameType.Request) continue;
      if (frame.streamId % 2 !== 1 || frame.streamId <= conn.lastStreamId || this.#pending.size >= MAX_PENDING) {
        this.#log.warn({ streamId: frame.streamId, pending: this.#pending.size }, 'task socket: closing a connection that broke the protocol or the bound on calls');
        conn.socket.destroy();
        return;
      }
      if (namesFrontService(frame.payload)) {
        this.#log.warn({ streamId: frame.streamId }, 'task socket: closing a connection that called the front\'s own service');
        conn.socket.destroy();
        return;
      }
      conn.lastStreamId = frame.streamId;
      // Out of stream ids on tsbox's connection: a new one renumbers (#acceptTsbox).
      if (this.#nextId > LAST_STREAM_ID) this.#tsbox?.destroy();
      const id = this.#nextId;
      this.#nextId += 2;
      const relayed = encodeFrame(id, FrameType.Request, frame.payload, frame.flags);
      this.#pending.set(id, { conn, streamId: frame.streamId, frame: relayed });
      conn.ids.add(id);
      this.#tsbox?.write(relayed);
    }
    if (this.#partialBytes > MAX_PARTIAL_FRAME_BYTES) this.#shedPartial();
  }

  #acceptTsbox(socket: Socket): void {
    // A newer tsbox replaces an older connection (one that has not noticed its end yet).
    this.#tsbox?.destroy();
    this.#tsbox = socket;
    const decoder = new FrameDecoder();
    socket.on('data', (chunk: Buffer) => {
      for (const item of decoder.push(chunk)) {
        if (item.kind !== 'frame' || item.frame.type !== FrameType.Response) continue;
        const pending = this.#pending.get(item.frame.streamId);
        if (pending === undefined) continue;
        this.#pending.delete(item.frame.streamId);
        pending.conn.ids.delete(item.frame.streamId);
        this.#toClient(pending.conn, encodeFrame(pending.streamId, FrameType.Response, item.frame.payload, item.frame.flags));
      }
    });
    socket.on('error', (err) => this.#log.debug({ err }, 'tsbox connection error'));
    socket.once('close', () => {
      if (this.#tsbox === socket) this.#tsbox = undefined;
      this.#log.info({ pending: this.#pending.size }, 'tsbox disconnected: its unanswered calls wait for the next one');
    });
    // A new connection numbers its streams from 1: the kept requests go first, in the order
    // they came, then new ones.
    const replay = [...this.#pending.entries()].sort(([a], [b]) => a - b);
    this.#pending.clear();
    this.#nextId = 1;
    for (const [old, pending] of replay) {
      const id = this.#nextId;
      this.#nextId += 2;
      pending.frame.writeUInt32BE(id, 4);
      pending.conn.ids.delete(old);
      pending.conn.ids.add(id);
      this.#pending.set(id, pending);
      socket.write(pending.frame);
    }
    this.#log.info({ replayed: replay.length }, 'tsbox connected');
  }

  /** An answer to containerd; a connection that leaves too many unread is not read until it reads them. */
  #toClient(conn: ClientConn, frame: Buffer): void {
    conn.lastActive = Date.now();
    writeBounded(conn, frame);
  }

  #shedPartial(): void {
    let largest: ClientConn | undefined;
    for (const conn of this.#clients) if (largest === undefined || conn.decoder.buffered > largest.decoder.buffered) largest = conn;
    if (largest === undefined) return;
    this.#log.warn({ bytes: largest.decoder.buffered }, 'task socket: closing the connection holding the most bytes of unfinished frames');
    largest.socket.destroy();
    this.#forgetClient(largest);
  }

  #checkFrames(): void {
    const now = Date.now();
    for (const conn of this.#clients) {
      if (!conn.paused && conn.frameStartedAt !== 0 && now - conn.frameStartedAt >= FRAME_ARRIVAL_MS) {
        conn.socket.destroy();
        this.#forgetClient(conn);
      }
    }
  }
}
