/**
 * A plain unix-socket connection for tests that play a broken or hostile peer: it writes
 * whatever a test builds, hands what the server sends to a parser of the protocol at hand
 * (h2-frames.ts, ttrpc-peer.ts), and waits for a condition on what came or for the close.
 * Reading can be stopped (`pause`) to play a peer that never reads.
 */
import net from 'node:net';

export class RawSocket {
  readonly socket: net.Socket;
  closed = false;
  readonly #closedPromise: Promise<void>;
  #listeners: (() => void)[] = [];

  /** `parse` is given every chunk the server sends; the waiters are told after each. */
  protected constructor(socket: net.Socket, parse: (chunk: Buffer) => void) {
    this.socket = socket;
    socket.on('data', (chunk: Buffer) => {
      parse(chunk);
      this.#notify();
    });
    // Resets and EPIPE are what a hostile peer expects; the test looks at `closed`.
    socket.on('error', () => undefined);
    this.#closedPromise = new Promise((resolve) =>
      socket.once('close', () => {
        this.closed = true;
        this.#notify();
        resolve();
      }),
    );
  }

  /** Connects a socket to `path`; resolves once connected (or rejects when refused). */
  protected static open(path: string): Promise<net.Socket> {
    return new Promise((resolve, reject) => {
      const socket = net.connect(path);
      socket.once('error', reject);
      socket.once('connect', () => {
        socket.off('error', reject);
        resolve(socket);
      });
    });
  }

  #notify(): void {
    const listeners = this.#listeners;
    this.#listeners = [];
    for (const listener of listeners) listener();
  }

  /**
   * Writes; resolves when the bytes are handed to the kernel, when the connection is gone, or
   * after `timeoutMs` (a server that stopped reading leaves them queued here).
   */
  write(bytes: Uint8Array, timeoutMs = 10_000): Promise<void> {
    if (this.closed || this.socket.destroyed) return Promise.resolve();
    return new Promise((resolve) => {
      if (this.socket.write(bytes)) {
        resolve();
        return;
      }
      const done = (): void => {
        clearTimeout(timer);
        this.socket.off('drain', done);
        this.socket.off('close', done);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, timeoutMs));
      this.socket.once('drain', done);
      this.socket.once('close', done);
    });
  }

  /** Resolves when `check` holds (checked on every chunk and at close), false after `timeoutMs`. */
  until(check: () => boolean, timeoutMs: number): Promise<boolean> {
    if (check()) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#listeners = this.#listeners.filter((l) => l !== listener);
        resolve(check());
      }, timeoutMs);
      const listener = (): void => {
        if (check()) {
          clearTimeout(timer);
          resolve(true);
        } else if (!this.closed) this.#listeners.push(listener);
        else {
          clearTimeout(timer);
          resolve(false);
        }
      };
      this.#listeners.push(listener);
    });
  }

  /** Resolves true when the server closes the connection within `timeoutMs`. */
  async closedWithin(timeoutMs: number): Promise<boolean> {
    const timer = new Promise<false>((resolve) => setTimeout(() => resolve(false), timeoutMs).unref());
    return Promise.race([this.#closedPromise.then(() => true as const), timer]);
  }

  pause(): void {
    this.socket.pause();
  }

  destroy(): void {
    this.socket.destroy();
  }
}

/**
 * Opens `count` connections with `connect`, at most `inFlight` at a time, and sends each
 * `first(i)` when it gives bytes. A connection refused at connect is one the peer does not
 * hold: it is left out of the result.
 */
export async function openMany<T extends RawSocket>(
  connect: () => Promise<T>,
  count: number,
  first: (i: number) => Buffer | undefined,
  inFlight: number,
): Promise<T[]> {
  const conns: T[] = [];
  for (let start = 0; start < count; start += inFlight) {
    const batch = Array.from({ length: Math.min(inFlight, count - start) }, async (_, k) => {
      const conn = await connect();
      const bytes = first(start + k);
      if (bytes !== undefined) void conn.write(bytes);
      return conn;
    });
    for (const result of await Promise.allSettled(batch)) {
      if (result.status === 'fulfilled') conns.push(result.value);
    }
  }
  return conns;
}
