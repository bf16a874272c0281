/**
 * The real tsbox daemon for crash, recovery and soak tests: `node dist/src/main.js serve` on a
 * private socket and state dir, started optionally with `TSBOX_CRASH_AT=<point>` (the daemon
 * then SIGKILLs itself at that named point, see CrashPoint in src/controller/controller.ts),
 * restarted without it on the same socket and state dir, killed with SIGKILL from outside, or
 * stopped with SIGTERM.
 *
 * It is the daemon of daemon-process.ts with clients that follow the current run. Its teardown
 * finds what a sandbox left on the host with host.ts, so nothing of a run survives it, even
 * when the daemon died in the middle of an operation and no record names what it had started.
 */
import type { SandboxClient } from './grpc-client.js';
import { type TsboxDaemon, createTsbox } from './daemon-process.js';

/** The calls of the Sandbox Controller API, for one namespace. */
export type TsboxClient = Pick<
  SandboxClient,
  'namespace' | 'create' | 'start' | 'platform' | 'stop' | 'wait' | 'status' | 'shutdown' | 'metrics' | 'update'
>;

/** tsbox on a private socket and state dir, run as often as a test needs. */
export interface CrashDaemon
  extends Pick<
    TsboxDaemon,
    | 'dir'
    | 'socketPath'
    | 'stateDir'
    | 'logPath'
    | 'pid'
    | 'start'
    | 'stop'
    | 'kill9'
    | 'exited'
    | 'sandboxDir'
    | 'logText'
    | 'logTail'
    | 'teardown'
  > {
  /**
   * A client for `namespace` that always calls the current run, each run on a fresh channel
   * (so no reconnect backoff of an earlier run delays the first calls); calls in flight when
   * a run ends fail.
   */
  client(namespace: string): TsboxClient;
  /** Remembers a namespace (its cgroups are removed at teardown) and, once known, a pid. */
  track(namespace: string, pid?: number): void;
}

/** Creates the temp dir; nothing runs until `start()`. Call `teardown()` in an after-hook. */
export async function createCrashDaemon(label: string): Promise<CrashDaemon> {
  const base: TsboxDaemon = await createTsbox(label, { closeClientsOnExit: true });
  return {
    dir: base.dir,
    socketPath: base.socketPath,
    stateDir: base.stateDir,
    logPath: base.logPath,
    get pid() {
      return base.pid;
    },
    start: (options) => base.start(options),
    stop: (graceMs) => base.stop(graceMs),
    kill9: () => base.kill9(),
    exited: () => base.exited(),
    client(namespace) {
      const channel = (): SandboxClient => base.client(namespace);
      return {
        namespace,
        create: (request, options) => channel().create(request, options),
        start: (request, options) => channel().start(request, options),
        platform: (request, options) => channel().platform(request, options),
        stop: (request, options) => channel().stop(request, options),
        wait: (request, options) => channel().wait(request, options),
        status: (request, options) => channel().status(request, options),
        shutdown: (request, options) => channel().shutdown(request, options),
        metrics: (request, options) => channel().metrics(request, options),
        update: (request, options) => channel().update(request, options),
      };
    },
    sandboxDir: (namespace, id) => base.sandboxDir(namespace, id),
    track: (namespace, pid) => base.track(namespace, undefined, pid),
    logText: () => base.logText(),
    logTail: (lines) => base.logTail(lines),
    teardown: () => base.teardown(),
  };
}
