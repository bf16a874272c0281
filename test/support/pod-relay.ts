/**
 * A pod's process as the tests meet it: the supervisor (native/tsbox-shim.c, built into
 * dist/bin/tsbox-shim) in relay mode, with native/relay.c owning the pod's task socket, started
 * on its own (no namespaces or cgroups unless asked; the built-in pause as the sandbox); the
 * relay's bounds, read from its source so that a test and the program cannot disagree; and the
 * payload of its cancel request, which tsbox reads with decodeCancel (src/ttrpc/pod-link.ts).
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { readExitFile } from './host.js';
import { type ExitInfo, type ManagedProcess, processAlive, signalPid, stopProcess, tailFile, waitFor } from './processes.js';

/** This file compiles to `<repo>/dist/test/support/`. */
const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** The supervisor's program (as tsbox-daemon.ts names it, without what that module brings). */
const tsboxShim = path.join(repoRoot, 'dist', 'bin', 'tsbox-shim');

const relaySource = path.join(repoRoot, 'native', 'relay.c');
/** What the programs share with tsbox's TypeScript, written by scripts/build-shim.mjs. */
export const contractHeader = path.join(repoRoot, 'dist', 'native-gen', 'tsbox-contract.h');

/**
 * A bound the relay's source, or the contract header it includes, defines (`#define NAME
 * expression`, of whole numbers, `*` and other such names), as a number.
 */
export function relayBound(name: string): number {
  const pattern = new RegExp(`^#define ${name} (.+)$`, 'm');
  const found = pattern.exec(readFileSync(relaySource, 'utf8')) ?? pattern.exec(readFileSync(contractHeader, 'utf8'));
  if (found?.[1] === undefined) throw new Error(`neither native/relay.c nor ${contractHeader} defines ${name}`);
  const terms = found[1].replace(/[()]/g, ' ').split('*').map((t) => t.trim());
  return terms.reduce((product, term) => {
    if (/^\d+(u|ull)?$/.test(term)) return product * Number(term.replace(/u(ll)?$/, ''));
    if (/^[A-Z_]+$/.test(term)) return product * relayBound(term);
    throw new Error(`${name} is not a product of numbers: ${found[1]}`);
  }, 1);
}

/** Connections from containerd the relay keeps at most. */
export const MAX_CONNECTIONS = relayBound('MAX_CONNECTIONS');

/** Bytes of calls the relay keeps unanswered at most (whole frames, headers included). */
export const MAX_PENDING_BYTES = relayBound('MAX_PENDING_BYTES');

/** A cancel request's payload: each stream id as 4 bytes, big-endian. */
export function cancelPayload(streamIds: Iterable<number>): Buffer {
  const ids = [...streamIds];
  const payload = Buffer.alloc(4 * ids.length);
  ids.forEach((id, i) => payload.writeUInt32BE(id, 4 * i));
  return payload;
}

/** What a pod's process is started with, beyond its directory and sockets. */
export interface PodProcessOptions {
  /** Bytes the relay's log may reach before it is cut (--relay-log-max-bytes). */
  readonly relayLogMaxBytes?: number;
  /** Namespaces the sandbox gets of its own (--unshare: pid, ipc, uts, mnt). */
  readonly unshare?: readonly string[];
  /** The sandbox's command; the built-in pause without one. */
  readonly command?: readonly string[];
  /** The task socket's path; `<dir>/task.sock` unless given. */
  readonly taskSocket?: string;
  /** The network namespace the sandbox joins (--netns). */
  readonly netns?: string;
  /** The cgroups the sandbox joins (--cgroup), and those the supervisor moves itself to (--home). */
  readonly cgroups?: readonly string[];
  readonly homes?: readonly string[];
  /**
   * Starts it with --hold: this runs with the supervisor's pid while it waits (as tsbox has
   * systemd move it into the pod's scope meanwhile), then the supervisor is let go.
   */
  readonly hold?: (supervisorPid: number) => void | Promise<void>;
  /** The supervisor's program: dist/bin/tsbox-shim unless given (a sanitized build's). */
  readonly program?: string;
}

/** The supervisor as started, whatever it answered. */
export interface SpawnedPod {
  readonly supervisor: ManagedProcess;
  /** Its one line on stdout ("ok <supervisor pid> <sandbox pid>" or "error <message>"). */
  readonly answer: string;
  /** What it wrote on stderr (nothing, normally). */
  readonly stderr: string;
  readonly taskSocket: string;
  readonly link: string;
  readonly relayLog: string;
}

/** A pod's process that answered ok. */
export interface PodProcess extends SpawnedPod {
  readonly dir: string;
  readonly sandboxPid: number;
  /** Ends the sandbox process (SIGKILL) and waits until its exit file is written; its status. */
  endSandbox(): Promise<number>;
  /**
   * Ends it all: the sandbox process (its exit file awaited), then the supervisor with SIGTERM,
   * SIGKILL to its group after a bound. How the supervisor exited.
   */
  stop(): Promise<ExitInfo & { graceful: boolean }>;
}

/**
 * Starts `tsbox-shim --dir DIR --task-socket S --link L --relay-log F` and reads its answer (the
 * supervisor closes its stdout once it has answered). The supervisor is the test's child, in a
 * session of its own, as tsbox starts it.
 */
export async function spawnPod(dir: string, options: PodProcessOptions = {}): Promise<SpawnedPod> {
  const taskSocket = options.taskSocket ?? path.join(dir, 'task.sock');
  const link = path.join(dir, 'link.sock');
  const relayLog = path.join(dir, 'relay.log');
  const args = ['--dir', dir, '--task-socket', taskSocket, '--link', link, '--relay-log', relayLog];
  if (options.relayLogMaxBytes !== undefined) args.push('--relay-log-max-bytes', String(options.relayLogMaxBytes));
  if (options.unshare !== undefined) args.push('--unshare', options.unshare.join(','));
  if (options.netns !== undefined) args.push('--netns', options.netns);
  for (const cgroup of options.cgroups ?? []) args.push('--cgroup', cgroup);
  for (const home of options.homes ?? []) args.push('--home', home);
  if (options.hold !== undefined) args.push('--hold');
  if (options.command !== undefined) args.push('--', ...options.command);
  const program = options.program ?? tsboxShim;
  const child = spawn(program, args, { detached: true, stdio: ['pipe', 'pipe', 'pipe'], cwd: '/' });
  let exit: ExitInfo | undefined;
  const exited = new Promise<ExitInfo>((resolve) => {
    child.once('exit', (code, signal) => {
      exit = { code, signal };
      resolve(exit);
    });
  });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout.on('data', (chunk: Buffer) => out.push(chunk));
  child.stderr.on('data', (chunk: Buffer) => err.push(chunk));
  const answered = new Promise<void>((resolve) => child.stdout.once('close', resolve));
  await new Promise<void>((resolve, reject) => {
    child.once('spawn', resolve);
    child.once('error', reject);
  });
  // Errors after spawn (e.g. kill on a gone process) must not crash the test runner.
  child.on('error', () => undefined);
  const pid = child.pid;
  if (pid === undefined) throw new Error(`${program}: spawned without a pid`);
  const supervisor: ManagedProcess = { pid, child, exited, exitInfo: () => exit };
  child.stdin.on('error', () => /* a supervisor that failed first says why on stdout */ undefined);
  let held = false;
  try {
    await options.hold?.(pid);
    held = options.hold !== undefined;
  } finally {
    // The go-ahead; or, without --hold or when the hook failed, the end of its stdin (then the
    // start is given up).
    child.stdin.end(held ? 'g' : undefined);
  }
  await answered;
  return { supervisor, answer: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString(), taskSocket, link, relayLog };
}

/** Starts a pod's process (spawnPod) that must answer ok. */
export async function startPod(dir: string, options: PodProcessOptions = {}): Promise<PodProcess> {
  const spawned = await spawnPod(dir, options);
  const ok = /^ok (\d+) (\d+)\n$/.exec(spawned.answer);
  if (ok === null) {
    await stopProcess(spawned.supervisor, { graceMs: 0 });
    throw new Error(`the pod's process answered ${JSON.stringify(spawned.answer)} (stderr ${JSON.stringify(spawned.stderr)})`);
  }
  if (Number(ok[1]) !== spawned.supervisor.pid) throw new Error(`the pod's process answered ${spawned.answer.trim()}, but its pid is ${spawned.supervisor.pid}`);
  const sandboxPid = Number(ok[2]);
  const endSandbox = async (): Promise<number> => {
    signalPid(sandboxPid, 'SIGKILL');
    const recorded = await waitFor(() => readExitFile(dir), { what: 'the sandbox\'s exit file', timeoutMs: 10_000, describe: () => tailFile(spawned.relayLog) });
    return recorded.status;
  };
  return {
    ...spawned,
    dir,
    sandboxPid,
    endSandbox,
    async stop() {
      if (spawned.supervisor.exitInfo() === undefined && processAlive(sandboxPid)) await endSandbox().catch(() => /* the supervisor is stopped below whatever happened */ undefined);
      const exit = await stopProcess(spawned.supervisor, { graceMs: 5000 });
      // A supervisor killed before its sandbox ended leaves it running: it goes too.
      if (processAlive(sandboxPid)) signalPid(sandboxPid, 'SIGKILL');
      return exit;
    },
  };
}
