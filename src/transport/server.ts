import type { Logger } from 'pino';
import { systemClock } from '../controller/clock.js';
import type { Controller } from '../controller/controller.js';
import { validateIdentifier, validateNamespace } from '../controller/identifiers.js';
import type { AnyValue, ExitInfo } from '../controller/types.js';
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
/** A handler that answers through `call.reply` (once), for calls that may stay pending long. */
type CallbackHandler<Req, Res> = (request: Req, call: ServedCall<Res>, namespace: string) => void;

const toAny = (any: AnyValue): Any => ({ typeUrl: any.typeUrl, value: Buffer.from(any.value) });

/** What the calls of one server share. */
interface Served {
  readonly log: Logger;
  readonly debug: boolean;
  readonly registry: CallRegistry;
  /** Calls not yet answered; `drained` runs when it drops to 0. */
  inFlight: number;
  drained: (() => void) | undefined;
}

interface Definition<Req, Res> {
  path: string;
  requestDeserialize(b: Buffer): Req;
  responseSerialize(r: Res): Buffer;
}

/** Wait's answer for one exit, encoded once for all of its waiters. */
const encodedExits = new WeakMap<ExitInfo, Buffer>();

/**
 * Waits told of an exit are answered after the current turn: the call that made the exit
 * happen (Stop, Shutdown) is answered first, so that its caller goes on while the answers to
 * the sandbox's watchers follow right behind it.
 */
let waitAnswers: { readonly call: { answer(err: undefined, bytes: Buffer): void }; readonly bytes: Buffer }[] = [];

function answerWaits(): void {
  const answers = waitAnswers;
  waitAnswers = [];
  for (const { call, bytes } of answers) call.answer(undefined, bytes);
}

/**
 * One call being served: its context (signal, namespace), its answer, and for Wait the exit
 * listener, in one object, so that a Wait pending for a pod's whole life holds no closures.
 */
class ServedCall<Res> extends CallContext {
  readonly #served: Served;
  readonly #serialize: (response: Res) => Buffer;
  readonly #rpc: string;
  /** For the debug log line only. */
  readonly #started: bigint;
  id: string | undefined;
  #replied = false;

  constructor(grpc: GrpcCall, served: Served, serialize: (response: Res) => Buffer, rpc: string) {
    super(grpc, served.registry);
    this.#served = served;
    this.#serialize = serialize;
    this.#rpc = rpc;
    this.#started = served.debug ? process.hrtime.bigint() : 0n;
    served.inFlight++;
  }

  /** Answers the call once: the response, or the error as a status. */
  reply(err: unknown, response?: Res): void {
    if (err === undefined) {
      let bytes: Buffer;
      try {
        bytes = this.#serialize(response as Res);
      } catch (serializeErr) {
        this.answer(serializeErr, undefined);
        return;
      }
      this.answer(undefined, bytes);
    } else {
      this.answer(err, undefined);
    }
  }

  /** Wait's exit listener (controller/exit-signal.ts). */
  exitKnown(err: TsboxError | undefined, exit: ExitInfo | undefined): void {
    if (err !== undefined || exit === undefined) {
      this.answer(err ?? new TsboxError('Internal', 'no exit'), undefined);
      return;
    }
    let bytes = encodedExits.get(exit);
    if (bytes === undefined) {
      bytes = ControllerService.wait.responseSerialize({ exitStatus: exit.status, exitedAt: exit.exitedAt });
      encodedExits.set(exit, bytes);
    }
    if (waitAnswers.length === 0) setImmediate(answerWaits);
    waitAnswers.push({ call: this, bytes });
  }

  /** Sends the encoded response, or the error as a status; only the first answer counts. */
  answer(err: unknown, bytes: Buffer | undefined): void {
    if (this.#replied) return;
    this.#replied = true;
    this.dispose();
    const served = this.#served;
    if (--served.inFlight === 0) served.drained?.();
    let code = 0;
    if (err === undefined) {
      this.call.respond(bytes as Buffer);
    } else {
      const status = toStatus(err, served.log, this.#rpc);
      code = status.code;
      this.call.fail(status.code, status.message);
    }
    if (served.debug) {
      served.log.debug(
        { rpc: this.#rpc, ns: this.namespace, id: this.id, code, ms: Number(process.hrtime.bigint() - this.#started) / 1e6 },
        'rpc',
      );
    }
  }
}

/** Builds the server around the controller. */
export function createServer(options: ServerOptions): TsboxServer {
  const { controller, logger } = options;
  const log = logger.child({ component: 'transport' });
  const registry = new CallRegistry();
  const served: Served = { log, debug: log.isLevelEnabled('debug'), registry, inFlight: 0, drained: undefined };

  type Method = (call: GrpcCall) => void;

  /** Wraps a handler: decode, validate, run, encode; errors become statuses. */
  function unary<Req extends { sandboxId: string }, Res>(
    definition: Definition<Req, Res>,
    rpc: string,
    handler: Handler<Req, Res>,
  ): [string, Method] {
    return callback(definition, rpc, (request, call, namespace) => {
      const result = handler(request, call, namespace);
      if (result instanceof Promise) result.then((response) => call.reply(undefined, response), (err: unknown) => call.reply(err));
      else call.reply(undefined, result);
    });
  }

  /** Wraps a callback handler: decode, validate, run; errors become statuses. */
  function callback<Req extends { sandboxId: string }, Res>(
    definition: Definition<Req, Res>,
    rpc: string,
    handler: CallbackHandler<Req, Res>,
  ): [string, Method] {
    const serialize = (response: Res): Buffer => definition.responseSerialize(response);
    const serve = (grpc: GrpcCall): void => {
      const call = new ServedCall<Res>(grpc, served, serialize, rpc);
      try {
        const closing = registry.closing;
        if (closing !== undefined) throw closing;
        let request: Req;
        try {
          request = definition.requestDeserialize(grpc.message);
        } catch (err) {
          throw new TsboxError('InvalidArgument', `malformed ${rpc} request: ${messageOf(err)}`);
        }
        if (served.debug) call.id = request.sandboxId;
        const namespace = validateNamespace(call.namespace);
        validateIdentifier('sandbox_id', request.sandboxId);
        handler(request, call, namespace);
      } catch (err) {
        call.reply(err);
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
    unary<ControllerStartRequest, ControllerStartResponse>(ControllerService.start, 'Start', async (req, ctx, ns) => {
      const started = await controller.start(ns, req.sandboxId, ctx.signal);
      return {
        sandboxId: req.sandboxId,
        pid: started.pid,
        createdAt: started.createdAt,
        labels: { ...started.labels },
        address: started.address,
        version: started.version,
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
    callback<ControllerWaitRequest, ControllerWaitResponse>(ControllerService.wait, 'Wait', (req, call, ns) => {
      controller.listen(ns, req.sandboxId, call.signal, call);
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
        address: status.address,
        version: status.version,
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
      log.info({ inFlight: served.inFlight, drainMs }, 'shutting down: refusing new calls, ending pending Waits');
      server.stopAccepting();
      registry.close(new TsboxError('Unavailable', 'tsbox is shutting down; retry'));
      if (served.inFlight > 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, drainMs);
          served.drained = () => {
            clearTimeout(timer);
            resolve();
          };
        });
      }
      if (served.inFlight > 0) log.warn({ inFlight: served.inFlight }, 'drain time is over; closing connections');
      server.destroy();
      await socket?.remove();
      log.info('server closed');
    },
  };
}
