import type { Logger } from 'pino';
import { systemClock } from '../controller/clock.js';
import type { Controller } from '../controller/controller.js';
import { validateIdentifier, validateNamespace } from '../controller/identifiers.js';
import type { AnyValue } from '../controller/types.js';
import { TsboxError, messageOf } from '../errors.js';
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
import { GrpcH2Server, type GrpcCall } from './h2/grpc-server.js';
import { claimSocket, prepareSocketPath } from './socket.js';
import { toStatus } from './status.js';

/** containerd sends messages of up to 16 MiB (SPEC.md section 1). */
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
/** A handler that answers through `reply` (once), for calls that may stay pending long. */
type CallbackHandler<Req, Res> = (request: Req, ctx: CallContext, namespace: string, reply: Reply<Res>) => void;
type Reply<Res> = (err: unknown, response?: Res) => void;

const toAny = (any: AnyValue): Any => ({ typeUrl: any.typeUrl, value: Buffer.from(any.value) });


/** Builds the server around the controller. */
export function createServer(options: ServerOptions): TsboxServer {
  const { controller, logger } = options;
  const log = logger.child({ component: 'transport' });
  const debug = log.isLevelEnabled('debug');
  const registry = new CallRegistry();
  let inFlight = 0;
  let drained: (() => void) | undefined;

  type Method = (call: GrpcCall) => void;

  interface Definition<Req, Res> {
    path: string;
    requestDeserialize(b: Buffer): Req;
    responseSerialize(r: Res): Buffer;
  }

  /** Wraps a handler: decode, validate, run, encode; errors become statuses. */
  function unary<Req extends { sandboxId: string }, Res>(
    definition: Definition<Req, Res>,
    rpc: string,
    handler: Handler<Req, Res>,
  ): [string, Method] {
    return callback(definition, rpc, (request, ctx, namespace, reply) => {
      const result = handler(request, ctx, namespace);
      if (result instanceof Promise) result.then((response) => reply(undefined, response), (err: unknown) => reply(err));
      else reply(undefined, result);
    });
  }

  /** Wraps a callback handler: decode, validate, run, encode; errors become statuses. */
  function callback<Req extends { sandboxId: string }, Res>(
    definition: Definition<Req, Res>,
    rpc: string,
    handler: CallbackHandler<Req, Res>,
  ): [string, Method] {
    const serve = (call: GrpcCall): void => {
      const started = debug ? process.hrtime.bigint() : 0n;
      const ctx = new CallContext(call, registry);
      let request: Req | undefined;
      inFlight++;
      let replied = false;
      const reply: Reply<Res> = (err, response) => {
        if (replied) return;
        replied = true;
        ctx.dispose();
        if (--inFlight === 0) drained?.();
        let code = 0;
        let failure = err;
        if (failure === undefined) {
          try {
            call.respond(definition.responseSerialize(response as Res));
          } catch (serializeErr) {
            failure = serializeErr;
          }
        }
        if (failure !== undefined) {
          const status = toStatus(failure, log, rpc);
          code = status.code;
          call.fail(status.code, status.message);
        }
        if (debug) {
          log.debug(
            { rpc, ns: ctx.namespace, id: request?.sandboxId, code, ms: Number(process.hrtime.bigint() - started) / 1e6 },
            'rpc',
          );
        }
      };
      try {
        const closing = registry.closing;
        if (closing !== undefined) throw closing;
        try {
          request = definition.requestDeserialize(call.message);
        } catch (err) {
          throw new TsboxError('InvalidArgument', `malformed ${rpc} request: ${messageOf(err)}`);
        }
        const namespace = validateNamespace(ctx.namespace);
        validateIdentifier('sandbox_id', request.sandboxId);
        handler(request, ctx, namespace, reply);
      } catch (err) {
        reply(err);
      }
    };
    return [definition.path, serve];
  }

  const methods = new Map<string, Method>([
    unary<ControllerCreateRequest, ControllerCreateResponse>(ControllerService.create, 'Create', async (req, _ctx, ns) => {
      const sandbox = req.sandbox;
      await controller.create(ns, req.sandboxId, {
        netnsPath: req.netnsPath,
        options: req.options,
        spec: sandbox?.spec,
        extensions: sandbox?.extensions ?? {},
        labels: sandbox?.labels ?? {},
        annotations: req.annotations,
      });
      return { sandboxId: req.sandboxId };
    }),
    unary<ControllerStartRequest, ControllerStartResponse>(ControllerService.start, 'Start', async (req, _ctx, ns) => {
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
    unary<ControllerPlatformRequest, ControllerPlatformResponse>(ControllerService.platform, 'Platform', (req, _ctx, ns) => {
      const platform = controller.platform(ns, req.sandboxId);
      return { platform: { os: platform.os, architecture: platform.architecture, variant: platform.variant, osVersion: '' } };
    }),
    unary<ControllerStopRequest, ControllerStopResponse>(ControllerService.stop, 'Stop', async (req, ctx, ns) => {
      await controller.stop(ns, req.sandboxId, req.timeoutSecs, ctx.signal);
      return {};
    }),
    // A pod holds its Wait for its whole life: no promise or async frame stays behind.
    callback<ControllerWaitRequest, ControllerWaitResponse>(ControllerService.wait, 'Wait', (req, ctx, ns, reply) => {
      controller.listen(ns, req.sandboxId, ctx.signal, (err, exit) =>
        err === undefined && exit !== undefined ? reply(undefined, { exitStatus: exit.status, exitedAt: exit.exitedAt }) : reply(err),
      );
    }),
    unary<ControllerStatusRequest, ControllerStatusResponse>(ControllerService.status, 'Status', (req, _ctx, ns) => {
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
    unary<ControllerShutdownRequest, ControllerShutdownResponse>(ControllerService.shutdown, 'Shutdown', async (req, ctx, ns) => {
      await controller.shutdown(ns, req.sandboxId, ctx.signal);
      return {};
    }),
    unary<ControllerMetricsRequest, ControllerMetricsResponse>(ControllerService.metrics, 'Metrics', async (req, _ctx, ns) => {
      const data = await controller.metrics(ns, req.sandboxId);
      return {
        metrics: {
          timestamp: systemClock(),
          id: req.sandboxId,
          data: toAny(data),
        },
      };
    }),
    unary<ControllerUpdateRequest, ControllerUpdateResponse>(ControllerService.update, 'Update', async (req, _ctx, ns) => {
      // containerd never fills Update's sandboxer (SPEC.md section 2): it is not checked.
      await controller.update(ns, req.sandboxId, {
        labels: req.sandbox?.labels ?? {},
        extensions: req.sandbox?.extensions ?? {},
        fields: req.fields,
      });
      return {};
    }),
  ]);

  const server = new GrpcH2Server(
    (call) => {
      const method = methods.get(call.method);
      if (method !== undefined) method(call);
      else call.fail(12, `unknown method ${call.method}`);
    },
    {
      maxMessageBytes: MAX_MESSAGE_BYTES,
      onConnectionError: (err) => log.debug({ err }, 'connection error'),
    },
  );
  let socket: { remove(): Promise<void> } | undefined;

  return {
    async listen() {
      await prepareSocketPath(options.socketPath);
      try {
        await server.listen(options.socketPath);
      } catch (err) {
        throw new TsboxError('Unavailable', `cannot listen on ${options.socketPath}: ${messageOf(err)}`, { cause: err });
      }
      socket = await claimSocket(options.socketPath, options.socketMode);
      log.info({ socket: options.socketPath, mode: options.socketMode.toString(8) }, 'listening');
    },
    async close(drainMs) {
      log.info({ inFlight, drainMs }, 'shutting down: refusing new calls, ending pending Waits');
      server.stopAccepting();
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
      server.destroy();
      await socket?.remove();
      log.info('server closed');
    },
  };
}
