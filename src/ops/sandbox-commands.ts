/**
 * `tsbox sandbox …`: the operator's commands, through containerd as `ctr` and `crictl` go,
 * so that containerd, CRI and `ctr sandboxes ls` see what they make. A sandbox lives in two
 * places: containerd's sandbox store (the record) and tsbox (the process); every command
 * looks at both and says precisely when they disagree (SPEC.md section 5).
 */
import { randomBytes } from 'node:crypto';
import { createReadStream, existsSync, statSync, watch } from 'node:fs';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import Table from 'cli-table3';
import { validateIdentifier } from '../controller/identifiers.js';
import { messageOf } from '../base/errors.js';
import type {
  ControllerStatusResponse,
  ControllerWaitResponse,
} from '../gen/containerd/services/sandbox/v1/sandbox.js';
import type { StoreGetResponse, StoreListResponse } from '../gen/containerd/services/sandbox/v1/store.js';
import type { Sandbox } from '../gen/containerd/types/sandbox.js';
import type { Timestamp } from '../gen/google/protobuf/timestamp.js';
import { type CallOptions, type CallTarget, ContainerdCallError, type ContainerdClient, connectContainerd, socketExists } from './containerd-client.js';
import { EXIT, OperatorError } from './exit-codes.js';

/** The sandboxer name and proxy plugin id tsbox is registered under (SPEC.md section 1). */
export const SANDBOXER = 'tsbox';
/** containerd needs a runtime on every record (SPEC.md section 5); this one names tsbox. */
const RUNTIME_NAME = 'io.containerd.tsbox.v1';
const OCI_SPEC_TYPE = 'types.containerd.io/opencontainers/runtime-spec/1/Spec';

/**
 * containerd redials a sandboxer with backoff capped at 3 s (SPEC.md section 1), so right
 * after tsbox (re)starts a call may still see UNAVAILABLE: retry for this long.
 */
const UNAVAILABLE_RETRY_MS = 10_000;

/** Where the commands print. */
export interface Output {
  out(text: string): void;
  err(text: string): void;
}

/** What every sandbox command needs. */
export interface SandboxContext {
  /** containerd's socket. */
  readonly address: string;
  readonly namespace: string;
  /** tsbox's state dir from its config: where `logs` looks when tsbox does not say. */
  readonly stateDir: string;
  readonly output: Output;
  /** Ends `logs -f` and `wait` (Ctrl-C). */
  readonly signal?: AbortSignal;
}

/** The two halves of a sandbox: containerd's record and tsbox's status. */
interface Located {
  readonly id: string;
  readonly record: Sandbox | undefined;
  readonly status: ControllerStatusResponse | undefined;
}

/** Turns a failed call into what the operator must do about it. */
function explain(err: unknown, c: { address: string; namespace: string }): unknown {
  if (!(err instanceof ContainerdCallError)) return err;
  const { address } = c;
  if (err.target === 'store' && (err.code === grpc.status.UNAVAILABLE || err.code === grpc.status.DEADLINE_EXCEEDED)) {
    return containerdDown(address, err.details);
  }
  if (err.target === 'controller') {
    if (err.code === grpc.status.NOT_FOUND && /sandbox controller/.test(err.details)) {
      return new OperatorError(
        EXIT.notRegistered,
        `containerd at ${address} has no sandboxer named "${SANDBOXER}" (${err.details})`,
        `register tsbox in containerd's config ("tsbox install", or paste "tsbox config containerd" into config.toml) and restart containerd; "tsbox doctor" checks it`,
      );
    }
    if (err.code === grpc.status.UNAVAILABLE) {
      return new OperatorError(
        EXIT.tsboxDown,
        `containerd cannot reach tsbox: ${err.details}`,
        `start tsbox ("systemctl start tsbox" or "tsbox serve"), and check that [proxy_plugins.tsbox] address in containerd's config is tsbox's socket ("tsbox doctor")`,
      );
    }
  }
  return new OperatorError(EXIT.failure, err.message, undefined, { cause: err });
}

function containerdDown(address: string, details: string): OperatorError {
  return new OperatorError(
    EXIT.containerdDown,
    `containerd is not running at ${address}: ${details}`,
    'start containerd ("systemctl start containerd"), or pass --address with the socket it listens on (its [grpc] address)',
  );
}

/** Calls through containerd; Controller calls retry UNAVAILABLE while containerd redials tsbox. */
async function call<Res>(c: ContainerdClient, target: CallTarget, method: string, request: unknown, options: CallOptions = {}): Promise<Res> {
  const giveUpAt = Date.now() + UNAVAILABLE_RETRY_MS;
  for (;;) {
    try {
      return await c.call<unknown, Res>(target, method, request, options);
    } catch (err) {
      const retry =
        target === 'controller' &&
        err instanceof ContainerdCallError &&
        err.code === grpc.status.UNAVAILABLE &&
        Date.now() < giveUpAt &&
        options.signal?.aborted !== true;
      if (!retry) throw explain(err, c);
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

/** Like `call`, but a sandbox that is not there (NOT_FOUND) resolves as undefined. */
async function lookup<Res>(c: ContainerdClient, target: CallTarget, method: string, request: unknown): Promise<Res | undefined> {
  try {
    return await call<Res>(c, target, method, request);
  } catch (err) {
    if (err instanceof OperatorError && err.cause instanceof ContainerdCallError) {
      const cause = err.cause;
      if (cause.code === grpc.status.NOT_FOUND && err.exitCode === EXIT.failure) return undefined;
    }
    throw err;
  }
}

/** Opens the client, refusing at once when nothing is at the address. */
function open(ctx: SandboxContext): ContainerdClient {
  if (!socketExists(ctx.address)) throw containerdDown(ctx.address, 'no socket there');
  return connectContainerd(ctx.address, ctx.namespace);
}

async function withClient<T>(ctx: SandboxContext, body: (c: ContainerdClient) => Promise<T>): Promise<T> {
  const c = open(ctx);
  try {
    return await body(c);
  } finally {
    c.close();
  }
}

function checkId(id: string): void {
  try {
    validateIdentifier('sandbox_id', id);
  } catch (err) {
    throw new OperatorError(EXIT.usage, messageOf(err));
  }
}

/** Reads both halves of a sandbox; an id owned by another sandboxer is refused. */
async function locate(c: ContainerdClient, id: string, verbose = false): Promise<Located> {
  checkId(id);
  const record = (await lookup<StoreGetResponse>(c, 'store', 'Get', { sandboxId: id }))?.sandbox;
  if (record !== undefined && record.sandboxer !== SANDBOXER) {
    throw new OperatorError(
      EXIT.badState,
      `sandbox ${id} in namespace ${c.namespace} belongs to sandboxer "${record.sandboxer || '(none)'}", not ${SANDBOXER}`,
      `use "ctr -n ${c.namespace} sandboxes" for it`,
    );
  }
  const status = await lookup<ControllerStatusResponse>(c, 'controller', 'Status', { sandboxId: id, sandboxer: SANDBOXER, verbose });
  return { id, record, status };
}

/** Refuses a sandbox unless both containerd and tsbox know it. */
function requireBoth(c: ContainerdClient, found: Located): { record: Sandbox; status: ControllerStatusResponse } {
  const { id, record, status } = found;
  if (record === undefined && status === undefined) {
    throw new OperatorError(
      EXIT.notFound,
      `no sandbox ${id} in namespace ${c.namespace}: neither containerd nor tsbox knows it`,
      `"tsbox sandbox ls -n ${c.namespace}" lists the sandboxes there`,
    );
  }
  if (status === undefined) {
    throw new OperatorError(
      EXIT.mismatch,
      `sandbox ${id} is in containerd's store (namespace ${c.namespace}) but tsbox does not know it: tsbox lost it, or serves another state dir`,
      `"tsbox sandbox rm --force ${id} -n ${c.namespace}" removes containerd's record`,
    );
  }
  if (record === undefined) {
    throw new OperatorError(
      EXIT.mismatch,
      `tsbox has sandbox ${id} (namespace ${c.namespace}) but containerd has no record of it: it was made on tsbox's socket directly, or its record was deleted`,
      `"tsbox sandbox rm --force ${id} -n ${c.namespace}" stops it and removes it from tsbox`,
    );
  }
  return { record, status };
}

function newId(): string {
  return randomBytes(16).toString('hex');
}

function timestampIso(t: Timestamp | undefined): string | undefined {
  if (t === undefined || t.seconds <= 0) return undefined;
  return new Date(t.seconds * 1000 + Math.floor(t.nanos / 1e6)).toISOString();
}

/** Options of `sandbox run`. */
export interface RunOptions {
  readonly id?: string;
  readonly hostname?: string;
  readonly netns?: string;
  readonly labels: Readonly<Record<string, string>>;
  /** The sandbox's process; empty for a pause process. */
  readonly command: readonly string[];
}

/**
 * Creates the record in containerd's store (sandboxer tsbox, a runtime), then Create and
 * Start through containerd's Controller service (SPEC.md section 5). Anything made before a
 * failure is removed again. Prints the id.
 */
export async function runSandbox(ctx: SandboxContext, options: RunOptions): Promise<number> {
  const id = options.id ?? newId();
  checkId(id);
  return withClient(ctx, async (c) => {
    const before = await locate(c, id);
    if (before.record !== undefined || before.status !== undefined) {
      throw new OperatorError(
        EXIT.exists,
        `sandbox ${id} exists already in namespace ${c.namespace}${before.status === undefined ? ' (in containerd only)' : before.record === undefined ? ' (in tsbox only)' : ''}`,
        `pick another --id, or remove it first: tsbox sandbox rm --force ${id} -n ${c.namespace}`,
      );
    }
    const spec: Record<string, unknown> = { ociVersion: '1.1.0' };
    if (options.hostname !== undefined) spec['hostname'] = options.hostname;
    if (options.command.length > 0) spec['process'] = { args: options.command, env: [], cwd: '/' };
    const sandbox: Sandbox = {
      sandboxId: id,
      runtime: { name: RUNTIME_NAME, options: undefined },
      spec: { typeUrl: OCI_SPEC_TYPE, value: Buffer.from(JSON.stringify(spec)) },
      labels: { ...options.labels },
      createdAt: undefined,
      updatedAt: undefined,
      extensions: {},
      sandboxer: SANDBOXER,
    };
    await call(c, 'store', 'Create', { sandbox });
    let createdInTsbox = false;
    try {
      await call(c, 'controller', 'Create', {
        sandboxId: id,
        sandboxer: SANDBOXER,
        sandbox,
        rootfs: [],
        options: undefined,
        netnsPath: options.netns ?? '',
        annotations: {},
      });
      createdInTsbox = true;
      await call(c, 'controller', 'Start', { sandboxId: id, sandboxer: SANDBOXER });
    } catch (err) {
      // Leave nothing half-made: tsbox forgets a failed Start itself, Shutdown is for a Create.
      // Best effort: the error the operator must see is the one rethrown below.
      if (createdInTsbox) await c.call('controller', 'Shutdown', { sandboxId: id, sandboxer: SANDBOXER }).catch(() => /* see above */ undefined);
      await c.call('store', 'Delete', { sandboxId: id }).catch(() => /* see above */ undefined);
      throw err;
    }
    ctx.output.out(`${id}\n`);
    return EXIT.ok;
  });
}

/** One row of `sandbox ls`. */
interface SandboxRow {
  readonly id: string;
  readonly namespace: string;
  /** SANDBOX_READY, SANDBOX_NOTREADY, SANDBOX_UNKNOWN, or MISSING when tsbox does not know it. */
  readonly state: string;
  readonly pid: number;
  readonly created: string | undefined;
  readonly exitStatus: number | undefined;
  readonly exitedAt: string | undefined;
  readonly labels: Readonly<Record<string, string>>;
}

const infoSchema = (info: Record<string, string> | undefined): Record<string, unknown> => {
  const raw = info?.['info'];
  if (raw === undefined) return {};
  try {
    const parsed: unknown = JSON.parse(raw);
    return typeof parsed === 'object' && parsed !== null ? (parsed as Record<string, unknown>) : {};
  } catch {
    // tsbox always sends a JSON object; anything else is shown as nothing rather than failing ls
    return {};
  }
};

/** Lists the tsbox sandboxes of the namespace: containerd's records, each with tsbox's status. */
export async function listSandboxes(ctx: SandboxContext, options: { json: boolean }): Promise<number> {
  const rows = await withClient(ctx, async (c) => {
    const { list } = await call<StoreListResponse>(c, 'store', 'List', { filters: [] });
    const ours = list.filter((s) => s.sandboxer === SANDBOXER).sort((a, b) => (a.createdAt?.seconds ?? 0) - (b.createdAt?.seconds ?? 0));
    const out: SandboxRow[] = [];
    for (const record of ours) {
      const status = await lookup<ControllerStatusResponse>(c, 'controller', 'Status', { sandboxId: record.sandboxId, sandboxer: SANDBOXER, verbose: true });
      const info = infoSchema(status?.info);
      out.push({
        id: record.sandboxId,
        namespace: c.namespace,
        state: status?.state ?? 'MISSING',
        pid: status?.pid ?? 0,
        created: timestampIso(status?.createdAt) ?? timestampIso(record.createdAt),
        exitStatus: typeof info['exitStatus'] === 'number' ? info['exitStatus'] : undefined,
        exitedAt: timestampIso(status?.exitedAt),
        labels: record.labels,
      });
    }
    return out;
  });
  if (options.json) {
    ctx.output.out(`${JSON.stringify(rows, null, 2)}\n`);
    return EXIT.ok;
  }
  const table = new Table({
    head: ['ID', 'NAMESPACE', 'STATE', 'PID', 'CREATED', 'EXIT'],
    style: { head: [], border: [], compact: true },
    chars: { top: '', 'top-mid': '', 'top-left': '', 'top-right': '', bottom: '', 'bottom-mid': '', 'bottom-left': '', 'bottom-right': '', left: '', 'left-mid': '', mid: '', 'mid-mid': '', right: '', 'right-mid': '', middle: '  ' },
  });
  for (const r of rows) {
    table.push([r.id, r.namespace, r.state, r.pid === 0 ? '-' : String(r.pid), r.created ?? '-', r.exitStatus === undefined ? '-' : String(r.exitStatus)]);
  }
  ctx.output.out(`${table.toString().split('\n').map((l) => l.trimEnd().replace(/^ /, '')).join('\n')}\n`);
  return EXIT.ok;
}

/** Prints containerd's record and tsbox's verbose status as one JSON document. */
export async function inspectSandbox(ctx: SandboxContext, id: string): Promise<number> {
  const doc = await withClient(ctx, async (c) => {
    const { record, status } = requireBoth(c, await locate(c, id, true));
    return {
      id,
      namespace: c.namespace,
      containerd: {
        sandboxer: record.sandboxer,
        runtime: record.runtime?.name,
        labels: record.labels,
        createdAt: timestampIso(record.createdAt),
        updatedAt: timestampIso(record.updatedAt),
        spec: record.spec === undefined ? undefined : decodeSpec(record.spec.value),
        extensions: Object.keys(record.extensions),
      },
      tsbox: {
        state: status.state,
        pid: status.pid,
        createdAt: timestampIso(status.createdAt),
        exitedAt: timestampIso(status.exitedAt),
        info: infoSchema(status.info),
      },
    };
  });
  ctx.output.out(`${JSON.stringify(doc, null, 2)}\n`);
  return EXIT.ok;
}

function decodeSpec(bytes: Uint8Array): unknown {
  try {
    return JSON.parse(Buffer.from(bytes).toString('utf8'));
  } catch {
    // a spec some other client wrote in another encoding: show its size only
    return `(${bytes.length} bytes, not JSON)`;
  }
}

/** Waits for the sandbox to exit; prints its exit status and returns it as the exit code. */
export async function waitSandbox(ctx: SandboxContext, id: string): Promise<number> {
  return withClient(ctx, async (c) => {
    requireBoth(c, await locate(c, id));
    const res = await call<ControllerWaitResponse>(c, 'controller', 'Wait', { sandboxId: id, sandboxer: SANDBOXER }, { timeoutMs: Infinity, ...(ctx.signal === undefined ? {} : { signal: ctx.signal }) });
    ctx.output.out(`${res.exitStatus}\n`);
    return res.exitStatus;
  });
}

/** Stops the sandbox (SIGTERM, SIGKILL after `timeoutSeconds`; 0 kills at once). Prints the id. */
export async function stopSandbox(ctx: SandboxContext, id: string, timeoutSeconds: number): Promise<number> {
  return withClient(ctx, async (c) => {
    requireBoth(c, await locate(c, id));
    await call(c, 'controller', 'Stop', { sandboxId: id, sandboxer: SANDBOXER, timeoutSecs: timeoutSeconds }, { timeoutMs: (timeoutSeconds + 30) * 1000 });
    ctx.output.out(`${id}\n`);
    return EXIT.ok;
  });
}

/**
 * Removes sandboxes: stops one that runs, Shutdown in tsbox, deletes containerd's record.
 * `force` also removes a sandbox known to one side only and ignores unknown ids. Every id is
 * tried; the exit code is the first failure's.
 */
export async function removeSandboxes(ctx: SandboxContext, ids: readonly string[], force: boolean): Promise<number> {
  return withClient(ctx, async (c) => {
    let code: number = EXIT.ok;
    for (const id of ids) {
      try {
        const found = await locate(c, id);
        if (force) {
          if (found.record === undefined && found.status === undefined) continue;
        } else {
          requireBoth(c, found);
        }
        if (found.status !== undefined) {
          if (found.status.state === 'SANDBOX_READY') {
            await call(c, 'controller', 'Stop', { sandboxId: id, sandboxer: SANDBOXER, timeoutSecs: 0 }, { timeoutMs: 60_000 });
          }
          await call(c, 'controller', 'Shutdown', { sandboxId: id, sandboxer: SANDBOXER }, { timeoutMs: 60_000 });
        }
        if (found.record !== undefined) await call(c, 'store', 'Delete', { sandboxId: id });
        ctx.output.out(`${id}\n`);
      } catch (err) {
        if (!(err instanceof OperatorError)) throw err;
        ctx.output.err(err.describe());
        if (code === EXIT.ok) code = err.exitCode;
      }
    }
    return code;
  });
}

/**
 * Prints the sandbox's console output (stdout and stderr of its process), which tsbox keeps
 * at `<state dir>/sandboxes/<ns>/<id>/console.log`; tsbox's verbose Status names its state
 * dir, `--state-dir` is the fallback. `follow` keeps printing until the sandbox exits.
 */
export async function sandboxLogs(ctx: SandboxContext, id: string, follow: boolean): Promise<number> {
  return withClient(ctx, async (c) => {
    const { status } = requireBoth(c, await locate(c, id, true));
    const stateDir = infoSchema(status.info)['stateDir'];
    const dir = typeof stateDir === 'string' && stateDir !== '' ? stateDir : ctx.stateDir;
    const file = join(dir, 'sandboxes', c.namespace, id, 'console.log');
    if (!existsSync(file)) {
      throw new OperatorError(EXIT.failure, `no console log at ${file}`, 'run this on the node tsbox runs on, with tsbox\'s --state-dir (or --config)');
    }
    if (!follow || status.state !== 'SANDBOX_READY') {
      await copyRange(file, 0, Infinity, ctx.output);
      return EXIT.ok;
    }
    let offset = 0;
    let ended = false;
    const stop = new AbortController();
    const onAbort = (): void => stop.abort();
    ctx.signal?.addEventListener('abort', onAbort, { once: true });
    const exited = call(c, 'controller', 'Wait', { sandboxId: id, sandboxer: SANDBOXER }, { timeoutMs: Infinity, signal: stop.signal }).then(
      () => {
        ended = true;
      },
      (err: unknown) => {
        if (!stop.signal.aborted) ctx.output.err(err instanceof OperatorError ? err.describe() : `tsbox: ${messageOf(err)}\n`);
        ended = true;
      },
    );
    let wake: (() => void) | undefined;
    const watcher = watch(file, () => wake?.());
    watcher.on('error', () => wake?.());
    try {
      for (;;) {
        const size = statSync(file).size;
        if (size > offset) offset = await copyRange(file, offset, size, ctx.output);
        if (ended || stop.signal.aborted) break;
        // The watcher wakes the loop on a write; the timer bounds a missed event and Wait's answer.
        await new Promise<void>((r) => {
          const t = setTimeout(r, 250);
          wake = () => {
            clearTimeout(t);
            r();
          };
        });
      }
      // What the process wrote just before it exited.
      const size = statSync(file).size;
      if (size > offset) await copyRange(file, offset, size, ctx.output);
    } finally {
      watcher.close();
      stop.abort();
      ctx.signal?.removeEventListener('abort', onAbort);
      await exited;
    }
    return EXIT.ok;
  });
}

/** Copies bytes [start, end) of a file to the output; resolves with the offset reached. */
function copyRange(file: string, start: number, end: number, output: Output): Promise<number> {
  return new Promise((resolvePromise, reject) => {
    let offset = start;
    const stream = createReadStream(file, { start, ...(Number.isFinite(end) ? { end: end - 1 } : {}) });
    stream.on('data', (chunk) => {
      const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
      offset += buf.length;
      output.out(buf.toString('utf8'));
    });
    stream.once('error', reject);
    stream.once('end', () => resolvePromise(offset));
  });
}
