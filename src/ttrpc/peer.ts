import type { Socket } from 'node:net';
import { MAX_QUEUED_OUTPUT_BYTES } from './limits.js';

/**
 * What the server keeps per connection it reads ttrpc frames from (a pod's relay,
 * native/relay.c, keeps the same for each of containerd's connections, in C).
 */
export interface ReadingPeer {
  readonly socket: Socket;
  /** Reading is paused until the peer reads what was written to it. */
  paused: boolean;
  /** When the frame in progress began; 0 between frames. */
  frameStartedAt: number;
}

/**
 * Writes to a peer; a peer that leaves more than MAX_QUEUED_OUTPUT_BYTES unread is not read
 * either until it drains them (so it cannot make us queue without bound), and the clock of its
 * frame in progress restarts then, since it could not arrive while unread.
 */
export function writeBounded(peer: ReadingPeer, bytes: Buffer): void {
  const socket = peer.socket;
  if (socket.destroyed) return;
  socket.write(bytes);
  if (!peer.paused && socket.writableLength > MAX_QUEUED_OUTPUT_BYTES) {
    peer.paused = true;
    socket.pause();
    socket.once('drain', () => {
      peer.paused = false;
      if (peer.frameStartedAt !== 0) peer.frameStartedAt = Date.now();
      socket.resume();
    });
  }
}
