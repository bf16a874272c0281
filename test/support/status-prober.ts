/**
 * What containerd does when it (re)connects: a new connection and a Status on it, made from a
 * process of its own. The hostile tier times these while an attack runs; made in the test's
 * own process, they would wait behind the attacker's work on its event loop (100 ms and more
 * under a flood of connections) and time the attacker rather than the daemon. The prober runs
 * one probe at a time, when asked, and times it from before the connection is made to the
 * answer (status-prober-child.ts).
 */
import { type ChildProcess, fork } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ignoreError } from '../../src/base/errors.js';

/** One probe's outcome: the state Status reported, or the error; how long it took. */
export interface ProbeResult {
  readonly ms: number;
  readonly state?: string;
  readonly error?: string;
}

export interface StatusProber {
  /** A Status for the sandbox on a new connection, with `timeoutMs` as its deadline. */
  probe(): Promise<ProbeResult>;
  /** Ends the prober process. */
  close(): Promise<void>;
}

const childPath = path.join(path.dirname(fileURLToPath(import.meta.url)), 'status-prober-child.js');

/** Starts the prober for Status of `sandboxId` in `namespace` on the socket at `socketPath`. */
export async function startStatusProber(socketPath: string, namespace: string, sandboxId: string, timeoutMs: number): Promise<StatusProber> {
  const child: ChildProcess = fork(childPath, [socketPath, namespace, sandboxId, String(timeoutMs)], {
    execArgv: [],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const next = (): Promise<unknown> =>
    new Promise((resolve, reject) => {
      const onExit = (code: number | null, signal: string | null): void => {
        child.off('message', onMessage);
        reject(new Error(`the Status prober exited (code ${code}, signal ${signal})`));
      };
      const onMessage = (message: unknown): void => {
        child.off('exit', onExit);
        resolve(message);
      };
      child.once('message', onMessage);
      child.once('exit', onExit);
    });
  const ready = await next();
  if (ready !== 'ready') throw new Error(`the Status prober said ${JSON.stringify(ready)} instead of ready`);
  let queue: Promise<unknown> = Promise.resolve();
  return {
    probe() {
      const result = queue.then(() => {
        const answer = next();
        child.send('probe');
        return answer as Promise<ProbeResult>;
      });
      queue = result.catch(ignoreError('reported to the caller of this probe; the next one is sent regardless'));
      return result;
    },
    async close() {
      if (child.exitCode === null && child.signalCode === null) child.disconnect();
      await exited;
    },
  };
}
