/**
 * CRI's view of a pod's containers, read from containerd's own socket (Kubernetes'
 * RuntimeService, which containerd's CRI plugin serves there).
 *
 * Why a sandboxer asks: CRI's StopPodSandbox first stops the pod's containers, and takes a
 * container it still counts as running but whose task containerd no longer has for stopped,
 * without waiting for its exit to be recorded. That happens whenever a container has just
 * exited on its own: CRI deletes the task first and marks the container exited only after the
 * delete returns. With podsandbox that delete is quick (the pod's runc shim stays for the
 * pause container); on tsbox's version-2 route the pod's runc shim ends with its last
 * container, inside that delete, which can take seconds on a slow node. A RemovePodSandbox in
 * that window fails with "container is still running". So Stop does not answer until CRI
 * counts none of the pod's containers as running (bounded: a container that really runs,
 * stopped through `ctr` rather than CRI, must not hold a Stop for long).
 */
import { setTimeout as delay } from 'node:timers/promises';
import * as grpc from '@grpc/grpc-js';
import type { Logger } from 'pino';
import type { CallSignal, PodContainers } from '../controller/types.js';
import { messageOf } from '../base/errors.js';
import { ContainerState, RuntimeServiceClient, type ListContainersResponse } from '../gen/runtime/v1/containers.js';

/** containerd's namespace for everything CRI makes (containerd's `constants.K8sContainerdNamespace`). */
export const CRI_NAMESPACE = 'k8s.io';

/** One ListContainers call: the ids CRI counts as running in the pod. */
export type ListRunning = (podId: string, deadlineMs: number) => Promise<readonly string[]>;

export interface CriContainersOptions {
  readonly logger: Logger;
  /** How long a Stop waits at most for CRI to record the pod's containers as exited. */
  readonly boundMs?: number;
  /** Pause between two looks. */
  readonly intervalMs?: number;
  /** Deadline of one ListContainers. */
  readonly callMs?: number;
}

/** Long enough for a runc shim to end on a slow node; short enough that a forced Stop is not held. */
const DEFAULT_BOUND_MS = 15_000;
const DEFAULT_INTERVAL_MS = 50;
const DEFAULT_CALL_MS = 2_000;

/** Codes that mean "no CRI here": a containerd without its CRI plugin, or no containerd. */
const NO_CRI = new Set([grpc.status.UNIMPLEMENTED, grpc.status.UNAVAILABLE]);

/** Waits, as PodContainers says, by asking `list` again and again. */
export function podContainersFrom(list: ListRunning, close: () => void, options: CriContainersOptions): PodContainers {
  const boundMs = options.boundMs ?? DEFAULT_BOUND_MS;
  const intervalMs = options.intervalMs ?? DEFAULT_INTERVAL_MS;
  const callMs = options.callMs ?? DEFAULT_CALL_MS;
  const log = options.logger;
  return {
    async settled(namespace: string, podId: string, signal: CallSignal): Promise<void> {
      if (namespace !== CRI_NAMESPACE) return;
      const started = Date.now();
      let running: readonly string[] = [];
      for (;;) {
        if (signal.aborted) return;
        try {
          running = await list(podId, callMs);
        } catch (err) {
          const code = (err as Partial<grpc.ServiceError>).code;
          if (code !== undefined && NO_CRI.has(code)) {
            log.debug({ podId, err: messageOf(err) }, 'no CRI on containerd\'s socket: Stop does not wait for it');
          } else {
            log.warn({ podId, err: messageOf(err) }, 'cannot ask CRI for the pod\'s containers: Stop does not wait for them');
          }
          return;
        }
        if (running.length === 0) {
          if (Date.now() - started >= intervalMs) log.info({ podId, waitedMs: Date.now() - started }, 'CRI recorded the pod\'s containers as exited');
          return;
        }
        if (Date.now() - started >= boundMs) {
          log.warn({ podId, containers: running, waitedMs: Date.now() - started }, 'CRI still counts these containers of the pod as running: Stop answers anyway');
          return;
        }
        // Ends early, without an error, when the call's signal fires (checked at the loop's top).
        await delay(intervalMs, undefined, { signal }).catch(() => undefined);
      }
    },
    close,
  };
}

/** CRI on containerd's socket at `address` (a path). Nothing is dialled before the first look. */
export function criPodContainers(address: string, options: CriContainersOptions): PodContainers {
  const client = new RuntimeServiceClient(`unix:${address}`, grpc.credentials.createInsecure());
  const list: ListRunning = (podId, deadlineMs) =>
    new Promise((resolve, reject) => {
      client.listContainers(
        { filter: { id: '', podSandboxId: podId, state: { state: ContainerState.CONTAINER_RUNNING }, labelSelector: {} } },
        new grpc.Metadata(),
        { deadline: Date.now() + deadlineMs },
        (err: grpc.ServiceError | null, res: ListContainersResponse) => {
          if (err !== null) reject(err);
          else resolve(res.containers.filter((c) => c.state === ContainerState.CONTAINER_RUNNING).map((c) => c.id));
        },
      );
    });
  return podContainersFrom(list, () => client.close(), options);
}
