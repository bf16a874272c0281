/**
 * `tsbox ready`: returns once tsbox accepts connections on its socket. tsbox binds the socket
 * only after recovery, so this is "ready to serve"; the systemd unit runs it as
 * ExecStartPost, which makes systemd report the unit started exactly then.
 */
import { probeSocket } from '../transport/socket.js';
import { EXIT, OperatorError } from './exit-codes.js';

/** Polls the socket every 100 ms until it accepts a connection or `timeoutSeconds` pass. */
export async function waitUntilServing(socket: string, timeoutSeconds: number): Promise<number> {
  const giveUpAt = Date.now() + timeoutSeconds * 1000;
  for (;;) {
    if ((await probeSocket(socket, 1_000)) === 'accepts') return EXIT.ok;
    if (Date.now() >= giveUpAt) {
      throw new OperatorError(EXIT.tsboxDown, `tsbox did not start serving on ${socket} within ${timeoutSeconds} s`, 'journalctl -u tsbox shows why');
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}
