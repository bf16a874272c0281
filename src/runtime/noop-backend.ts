import { systemClock } from '../controller/clock.js';
import type { AnyValue, CallSignal, ExitInfo, LaunchSpec, Recovered, RunningSandbox, RuntimeBackend, SandboxPlacement, TaskEndpoint } from '../controller/types.js';
import { TsboxError } from '../base/errors.js';

/** SIGKILL's exit status, as a killed process reports it. */
const KILLED = 137;

class NoopSandbox implements RunningSandbox {
  readonly pid = 0;
  readonly handle = { noop: true };
  #exit: ExitInfo | undefined;
  #listener: ((exit: ExitInfo) => void) | undefined;

  onExit(listener: (exit: ExitInfo) => void): void {
    if (this.#exit !== undefined) listener(this.#exit);
    else this.#listener = listener;
  }

  end(): void {
    if (this.#exit !== undefined) return;
    this.#exit = {
      status: KILLED,
      exitedAt: systemClock(),
      reason: 'stopped (no process)',
    };
    this.#listener?.(this.#exit);
    this.#listener = undefined;
  }
}

/**
 * A backend that runs nothing: Start succeeds with pid 0 and Stop ends the sandbox at once
 * with 137. It exists only so that benchmarks measure tsbox's own cost against a reference
 * server doing the same work; it is never the default.
 */
export class NoopBackend implements RuntimeBackend {
  readonly name = 'noop';

  start(_spec: LaunchSpec): Promise<RunningSandbox> {
    return Promise.resolve(new NoopSandbox());
  }

  /** No process, so no containers: containerd is told no task endpoint. */
  endpoint(): TaskEndpoint {
    return { address: '', version: 0 };
  }

  teardown(): Promise<void> {
    return Promise.resolve();
  }

  updateResources(spec: LaunchSpec): Promise<void> {
    return Promise.reject(new TsboxError('Unimplemented', `sandbox ${spec.id} has no cgroup: the noop backend runs no process`));
  }

  recover(_spec: LaunchSpec, _handle: unknown): Promise<Recovered> {
    // Nothing ran, so nothing survived the restart: running sandboxes come back running.
    return Promise.resolve({ kind: 'running', sandbox: new NoopSandbox() });
  }

  abandon(_spec: LaunchSpec, _signal: CallSignal): Promise<void> {
    return Promise.resolve();
  }

  /** There is no process to ignore SIGTERM: a graceful Stop ends the sandbox at once. */
  terminate(sandbox: RunningSandbox): Promise<void> {
    (sandbox as NoopSandbox).end();
    return Promise.resolve();
  }

  kill(sandbox: RunningSandbox, _signal: CallSignal): Promise<void> {
    (sandbox as NoopSandbox).end();
    return Promise.resolve();
  }

  release(_spec: LaunchSpec, _signal: CallSignal): Promise<void> {
    return Promise.resolve();
  }

  metrics(spec: LaunchSpec): Promise<AnyValue> {
    return Promise.reject(new TsboxError('Unimplemented', `sandbox ${spec.id} has no cgroup: the noop backend runs no process`));
  }

  describe(): Record<string, unknown> {
    return {};
  }

  /** No process: no namespace, cgroup or program of its own. */
  placement(): SandboxPlacement {
    return { namespaces: [], args: [] };
  }

  close(): void {}
}
