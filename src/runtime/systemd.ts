import type { EventEmitter } from 'node:events';
import { existsSync } from 'node:fs';
import { DBusError, Message, MessageType, Variant, systemBus, type MessageBus } from '@jellybrick/dbus-next';
import type { Logger } from 'pino';
import type { Resources } from '../controller/pod-spec.js';
import { TsboxError, ignoreError, messageOf } from '../base/errors.js';
import { sharesToWeight } from './cgroups.js';

/**
 * The systemd cgroup driver: a pod whose cgroup_parent is a slice gets its sandbox process in
 * a transient scope `cri-containerd-<id>.scope` under that slice, made by systemd over D-Bus as
 * runc's systemd driver makes a pause container's (containerd's CRI names it
 * "<slice>:cri-containerd:<id>"), so systemd accounts for it and never moves it.
 */

const DESTINATION = 'org.freedesktop.systemd1';
const PATH = '/org/freedesktop/systemd1';
const MANAGER = 'org.freedesktop.systemd1.Manager';

/** How long a systemd job may take before the operation fails. */
const JOB_TIMEOUT_MS = 30_000;

/** True when systemd is this machine's init (what sd_booted checks). */
export function systemdIsInit(): boolean {
  return existsSync('/run/systemd/system');
}

/** The calls tsbox makes of systemd's manager, and the job signals it reads; a fake implements it in tests. */
export interface SystemdConnection {
  /** Calls a method of org.freedesktop.systemd1.Manager; rejects with the D-Bus error name and text. */
  call(member: string, signature: string, body: unknown[]): Promise<unknown[]>;
  /** Every JobRemoved signal: the job's object path, its unit and its result ("done", "failed", …). */
  onJobRemoved(listener: (job: string, unit: string, result: string) => void): void;
  close(): void;
}

/** A D-Bus error's name, or undefined for any other failure. */
export function dbusErrorName(err: unknown): string | undefined {
  return err instanceof DBusError ? err.type : undefined;
}

/** Connects to systemd through the system bus and subscribes to its job signals. */
export async function connectSystemd(logger: Logger): Promise<SystemdConnection> {
  const bus: MessageBus = systemBus();
  const listeners: ((job: string, unit: string, result: string) => void)[] = [];
  // The bus emits 'error' (a lost connection, a refused Hello) although its typings list no such event.
  (bus as unknown as EventEmitter).on('error', (err: unknown) => logger.error({ err }, 'system bus connection failed'));
  bus.on('message', (msg: Message) => {
    if (msg.type !== MessageType.SIGNAL || msg.interface !== MANAGER || msg.member !== 'JobRemoved') return;
    const [, job, unit, result] = msg.body as [number, string, string, string];
    for (const listener of listeners) listener(job, unit, result);
  });
  const send = async (message: Message): Promise<unknown[]> => {
    const reply = await bus.call(message);
    return reply?.body ?? [];
  };
  const call = (member: string, signature: string, body: unknown[]): Promise<unknown[]> =>
    send(new Message({ destination: DESTINATION, path: PATH, interface: MANAGER, member, signature, body }));
  try {
    await send(
      new Message({
        destination: 'org.freedesktop.DBus',
        path: '/org/freedesktop/DBus',
        interface: 'org.freedesktop.DBus',
        member: 'AddMatch',
        signature: 's',
        body: [`type='signal',sender='${DESTINATION}',path='${PATH}',interface='${MANAGER}',member='JobRemoved'`],
      }),
    );
    // systemd sends job signals on the bus only while someone is subscribed.
    await call('Subscribe', '', []);
  } catch (err) {
    bus.disconnect();
    throw new TsboxError('Unavailable', `cannot reach systemd on the system bus: ${messageOf(err)}`, { cause: err });
  }
  return {
    call,
    onJobRemoved: (listener) => listeners.push(listener),
    close: () => bus.disconnect(),
  };
}

/** What the scope is made for: its unit name, slice, first process and the pod's limits. */
export interface ScopeRequest {
  readonly unit: string;
  readonly slice: string;
  readonly pid: number;
  readonly description: string;
  readonly limits: Resources | undefined;
}

/** The name of the scope of sandbox `id` (what runc names a container of "<slice>:cri-containerd:<id>"). */
export function scopeUnit(id: string): string {
  return `cri-containerd-${id}.scope`;
}

/** The slice unit of a cgroup_parent that is one (its last component), else undefined. */
export function sliceOf(cgroupParent: string | undefined): string | undefined {
  const base = cgroupParent?.split('/').pop();
  return base?.endsWith('.slice') ? base : undefined;
}

/** systemd's "infinity" (no limit) and "unset" for 64-bit unit properties. */
const UNLIMITED = 18446744073709551615n;

/**
 * The unit properties for a pod's limits, as runc's systemd driver sets them, so that systemd
 * itself keeps them (a daemon-reload rewrites a unit's cgroup files from its properties). A
 * limit left out is unlimited, as in the cgroup files.
 */
export function limitProperties(limits: Resources): [string, Variant][] {
  const { memoryLimitBytes: memory, memorySwapLimitBytes: swap, cpuShares, cpuQuota } = limits;
  // CRI's swap limit counts memory plus swap; systemd's (cgroup v2's) counts swap alone.
  const swapOnly = memory === undefined || swap === undefined ? UNLIMITED : BigInt(Math.max(0, swap - memory));
  const period = limits.cpuPeriod ?? 100_000;
  // systemd takes the quota per second and keeps it in 10 ms steps: rounded up, as runc does.
  const perSecond = cpuQuota === undefined ? UNLIMITED : BigInt(Math.ceil((cpuQuota * 1_000_000) / period / 10_000) * 10_000);
  return [
    ['MemoryMax', new Variant('t', memory === undefined ? UNLIMITED : BigInt(memory))],
    ['MemorySwapMax', new Variant('t', swapOnly)],
    ['CPUWeight', new Variant('t', cpuShares === undefined ? UNLIMITED : BigInt(sharesToWeight(cpuShares)))],
    ['CPUQuotaPerSecUSec', new Variant('t', perSecond)],
    ['CPUQuotaPeriodUSec', new Variant('t', BigInt(period))],
  ];
}

/** Makes, updates and removes sandbox scopes through one lazily opened connection to systemd. */
export class SystemdScopes {
  readonly #connect: () => Promise<SystemdConnection>;
  readonly #log: Logger;
  #connection: Promise<SystemdConnection> | undefined;
  readonly #waiters = new Set<(job: string, unit: string, result: string) => void>();

  constructor(connect: () => Promise<SystemdConnection>, logger: Logger) {
    this.#connect = connect;
    this.#log = logger;
  }

  #systemd(): Promise<SystemdConnection> {
    this.#connection ??= this.#connect().then(
      (connection) => {
        connection.onJobRemoved((job, unit, result) => {
          for (const waiter of this.#waiters) waiter(job, unit, result);
        });
        return connection;
      },
      (err: unknown) => {
        this.#connection = undefined;
        throw err;
      },
    );
    return this.#connection;
  }

  /** Runs a call that queues a job on `unit` and waits for the job to end; returns its result. */
  async #job(unit: string, what: string, call: (systemd: SystemdConnection) => Promise<unknown[]>): Promise<string> {
    const systemd = await this.#systemd();
    // The job's end may be signalled before the call's reply names the job.
    const ended = new Map<string, string>();
    let wanted: string | undefined;
    let finish: (result: string) => void = () => undefined;
    const done = new Promise<string>((resolve) => (finish = resolve));
    const waiter = (job: string, jobUnit: string, result: string): void => {
      if (jobUnit !== unit) return;
      if (wanted === undefined) ended.set(job, result);
      else if (job === wanted) finish(result);
    };
    this.#waiters.add(waiter);
    let timer: NodeJS.Timeout | undefined;
    try {
      const [job] = (await call(systemd)) as [string];
      wanted = job;
      const early = ended.get(job);
      if (early !== undefined) return early;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new TsboxError('Unavailable', `systemd did not finish ${what} ${unit} within ${JOB_TIMEOUT_MS} ms`)), JOB_TIMEOUT_MS);
      });
      return await Promise.race([done, timeout]);
    } finally {
      clearTimeout(timer);
      this.#waiters.delete(waiter);
    }
  }

  /**
   * Has systemd make the scope under its slice with `pid` in it (Delegate=yes, as runc asks,
   * so the scope's cgroup files are tsbox's to write) and waits until it runs.
   */
  async start(request: ScopeRequest): Promise<void> {
    const { unit, slice, pid } = request;
    const properties: [string, Variant][] = [
      ['Description', new Variant('s', request.description)],
      ['Slice', new Variant('s', slice)],
      ['PIDs', new Variant('au', [pid])],
      ['Delegate', new Variant('b', true)],
      ['DefaultDependencies', new Variant('b', false)],
      ['MemoryAccounting', new Variant('b', true)],
      ['CPUAccounting', new Variant('b', true)],
      ['TasksAccounting', new Variant('b', true)],
      ...(request.limits === undefined ? [] : limitProperties(request.limits)),
    ];
    let result: string;
    try {
      result = await this.#job(unit, 'starting', (systemd) => systemd.call('StartTransientUnit', 'ssa(sv)a(sa(sv))', [unit, 'fail', properties, []]));
    } catch (err) {
      if (err instanceof TsboxError) throw err;
      throw new TsboxError('FailedPrecondition', `systemd cannot make scope ${unit} in ${slice}: ${messageOf(err)}`, { cause: err });
    }
    if (result !== 'done') throw new TsboxError('FailedPrecondition', `systemd's job to start scope ${unit} in ${slice} ended "${result}" (see journalctl -u ${unit})`);
  }

  /** Sets the scope's limit properties for an Update (the cgroup files are written too, by the caller). */
  async update(unit: string, limits: Resources): Promise<void> {
    const properties = limitProperties(limits);
    const systemd = await this.#systemd();
    try {
      await systemd.call('SetUnitProperties', 'sba(sv)', [unit, true, properties]);
    } catch (err) {
      throw new TsboxError('FailedPrecondition', `systemd cannot set the limits of ${unit}: ${messageOf(err)}`, { cause: err });
    }
  }

  /** Stops the scope and forgets a failed one; a scope that is already gone is fine. */
  async stop(unit: string): Promise<void> {
    try {
      const result = await this.#job(unit, 'stopping', (systemd) => systemd.call('StopUnit', 'ss', [unit, 'replace']));
      if (result !== 'done') this.#log.warn({ unit, result }, 'systemd\'s job to stop a sandbox scope did not end "done"');
    } catch (err) {
      if (dbusErrorName(err) !== 'org.freedesktop.systemd1.NoSuchUnit') {
        throw err instanceof TsboxError ? err : new TsboxError('Internal', `systemd cannot stop ${unit}: ${messageOf(err)}`, { cause: err });
      }
    }
    const systemd = await this.#systemd();
    await systemd.call('ResetFailedUnit', 's', [unit]).catch((err: unknown) => {
      // An inactive scope that did not fail is gone already: nothing to reset.
      if (dbusErrorName(err) !== 'org.freedesktop.systemd1.NoSuchUnit') throw new TsboxError('Internal', `systemd cannot reset ${unit}: ${messageOf(err)}`, { cause: err });
    });
  }

  close(): void {
    void this.#connection?.then((connection) => connection.close(), ignoreError('a connection that never opened has nothing to close'));
  }
}
