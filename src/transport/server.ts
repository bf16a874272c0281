import { Server, ServerCredentials, type sendUnaryData, type ServerUnaryCall, type UntypedServiceImplementation } from '@grpc/grpc-js';
import type { Logger } from 'pino';
import type { Controller } from '../controller/controller.js';
import { validateIdentifier, validateNamespace } from '../controller/identifiers.js';
import type { AnyValue } from '../controller/types.js';
import { TsboxError } from '../errors.js';
import {
  ControllerService,
  type ControllerCreateRequest,
  type ControllerCreateResponse,
  type ControllerMetricsRequest,
  type ControllerMetricsResponse,
  type ControllerPlatformRequest,
  type ControllerPlatformResponse,
  type ControllerShutdownRequest,
  type ControllerShutdownResponse,
  type ControllerStartRequest,
  type ControllerStartResponse,
  type ControllerStatusRequest,
  type ControllerStatusResponse,
  type ControllerStopRequest,
  type ControllerStopResponse,
  type ControllerUpdateRequest,
  type ControllerUpdateResponse,
  type ControllerWaitRequest,
  type ControllerWaitResponse,
} from '../gen/containerd/services/sandbox/v1/sandbox.js';
import type { Any } from '../gen/google/protobuf/any.js';
import { CallContext, CallRegistry } from './call-context.js';
import { claimSocket, prepareSocketPath } from './socket.js';
import { toStatus } from './status.js';

/** containerd sends messages of up to 16 MiB (SPEC.md section 1); grpc-js accepts 4 by default. */
export const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

export interface ServerOptions {
  readonly controller: Controller;
  readonly logger: Logger;
  readonly socketPath: string;
  readonly socketMode: number;
}

/** The daemon's gRPC server, started and stopped by the entry point. */
export interface TsboxServer {
  /** Binds the socket; from now on calls are accepted. */
  listen(): Promise<void>;
  /**
   * Stops accepting calls, aborts pending Waits (they end as UNAVAILABLE, which containerd
   * retries), lets other calls finish for up to `drainMs`, then closes every connection and
   * removes the socket.
   */
  close(drainMs: number): Promise<void>;
}

type Handler<Req, Res> = (request: Req, ctx: CallContext, namespace: string) => Promise<Res> | Res;

const toAny = (any: AnyValue): Any => ({ typeUrl: any.typeUrl, value: Buffer.from(any.value) });

function extensionsOf(map: { [key: string]: Any } | undefined): Record<string, AnyValue> {
  return map ?? {};
}

/** Builds the server around the controller. */
export function createServer(options: ServerOptions): TsboxServer {
  const { controller, logger } = options;
  const log = logger.child({ component: 'transport' });
  const debug = log.isLevelEnabled('debug');
  const registry = new CallRegistry();
  let inFlight = 0;
  let drained: (() => void) | undefined;

  function unary<Req extends { sandboxId: string }, Res>(rpc: string, handler: Handler<Req, Res>) {
    return (call: ServerUnaryCall<Req, Res>, callback: sendUnaryData<Res>): void => {
      const started = debug ? process.hrtime.bigint() : 0n;
      const ctx = new CallContext(call, registry);
      inFlight++;
      const finish = (): void => {
        ctx.dispose();
        if (--inFlight === 0) drained?.();
      };
      const reply = (err: unknown, response?: Res): void => {
        finish();
        if (err === undefined) callback(null, response);
        else callback(toStatus(err, log, rpc));
        if (debug) {
          log.debug(
            {
              rpc,
              ns: ctx.namespace,
              id: call.request.sandboxId,
              code: err === undefined ? 0 : toStatus(err, log, rpc).code,
              ms: Number(process.hrtime.bigint() - started) / 1e6,
            },
            'rpc',
          );
        }
      };
      try {
        const closing = registry.closing;
        if (closing !== undefined) throw closing;
        const namespace = validateNamespace(ctx.namespace);
        validateIdentifier('sandbox_id', call.request.sandboxId);
        const result = handler(call.request, ctx, namespace);
        if (result instanceof Promise) result.then((response) => reply(undefined, response), (err: unknown) => reply(err));
        else reply(undefined, result);
      } catch (err) {
        reply(err);
      }
    };
  }

  const implementation: UntypedServiceImplementation = {
    create: unary<ControllerCreateRequest, ControllerCreateResponse>('Create', async (req, _ctx, ns) => {
      const sandbox = req.sandbox;
      await controller.create(ns, req.sandboxId, {
        netnsPath: req.netnsPath,
        options: req.options,
        spec: sandbox?.spec,
        extensions: extensionsOf(sandbox?.extensions),
        labels: sandbox?.labels ?? {},
        annotations: req.annotations,
      });
      return { sandboxId: req.sandboxId };
    }),
    start: unary<ControllerStartRequest, ControllerStartResponse>('Start', async (req, _ctx, ns) => {
      const started = await controller.start(ns, req.sandboxId);
      return {
        sandboxId: req.sandboxId,
        pid: started.pid,
        createdAt: started.createdAt,
        labels: { ...started.labels },
        address: '',
        version: 0,
        spec: undefined,
      };
    }),
    platform: unary<ControllerPlatformRequest, ControllerPlatformResponse>('Platform', (req, _ctx, ns) => {
      const platform = controller.platform(ns, req.sandboxId);
      return { platform: { os: platform.os, architecture: platform.architecture, variant: platform.variant, osVersion: '' } };
    }),
    stop: unary<ControllerStopRequest, ControllerStopResponse>('Stop', async (req, ctx, ns) => {
      await controller.stop(ns, req.sandboxId, req.timeoutSecs, ctx.signal);
      return {};
    }),
    wait: unary<ControllerWaitRequest, ControllerWaitResponse>('Wait', async (req, ctx, ns) => {
      const exit = await controller.wait(ns, req.sandboxId, ctx.signal);
      return { exitStatus: exit.status, exitedAt: exit.exitedAt };
    }),
    status: unary<ControllerStatusRequest, ControllerStatusResponse>('Status', (req, _ctx, ns) => {
      const status = controller.status(ns, req.sandboxId, req.verbose);
      return {
        sandboxId: req.sandboxId,
        pid: status.pid,
        state: status.state,
        info: status.info ?? {},
        createdAt: status.createdAt,
        exitedAt: status.exitedAt,
        extra: undefined,
        address: '',
        version: 0,
      };
    }),
    shutdown: unary<ControllerShutdownRequest, ControllerShutdownResponse>('Shutdown', async (req, ctx, ns) => {
      await controller.shutdown(ns, req.sandboxId, ctx.signal);
      return {};
    }),
    metrics: unary<ControllerMetricsRequest, ControllerMetricsResponse>('Metrics', async (req, _ctx, ns) => {
      const data = await controller.metrics(ns, req.sandboxId);
      const ms = Date.now();
      return {
        metrics: {
          timestamp: { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1_000_000 },
          id: req.sandboxId,
          data: toAny(data),
        },
      };
    }),
    update: unary<ControllerUpdateRequest, ControllerUpdateResponse>('Update', async (req, _ctx, ns) => {
      // containerd never fills Update's sandboxer (SPEC.md section 2): it is not checked.
      await controller.update(ns, req.sandboxId, {
        labels: req.sandbox?.labels ?? {},
        extensions: extensionsOf(req.sandbox?.extensions),
        fields: req.fields,
      });
      return {};
    }),
  };

  const server = new Server({
    'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
    'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
    // Channelz bookkeeping costs on every call and nobody reads it here.
    'grpc.enable_channelz': 0,
  });
  server.addService(ControllerService, implementation);
  let socket: { remove(): Promise<void> } | undefined;

  return {
    async listen() {
      await prepareSocketPath(options.socketPath);
      await new Promise<void>((resolve, reject) => {
        server.bindAsync(`unix:${options.socketPath}`, ServerCredentials.createInsecure(), (err) => {
          if (err === null) resolve();
          else reject(new TsboxError('Unavailable', `cannot listen on ${options.socketPath}: ${err.message}`, { cause: err }));
        });
      });
      socket = await claimSocket(options.socketPath, options.socketMode);
      log.info({ socket: options.socketPath, mode: options.socketMode.toString(8) }, 'listening');
    },
    async close(drainMs) {
      log.info({ inFlight, drainMs }, 'shutting down: refusing new calls, ending pending Waits');
      registry.close(new TsboxError('Unavailable', 'tsbox is shutting down; retry'));
      if (inFlight > 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, drainMs);
          drained = () => {
            clearTimeout(timer);
            resolve();
          };
        });
      }
      if (inFlight > 0) log.warn({ inFlight }, 'drain time is over; closing connections');
      server.forceShutdown();
      await socket?.remove();
      log.info('server closed');
    },
  };
}
