import type { Server, ServerUnaryCall, ServiceDefinition, sendUnaryData } from '@grpc/grpc-js';
import type { Logger } from 'pino';
import { systemClock } from '../controller/clock.js';
import type { Controller } from '../controller/controller.js';
import { validateIdentifier, validateNamespace } from '../controller/identifiers.js';
import type { AnyValue, ExitInfo } from '../controller/types.js';
import { OCI_SPEC_TYPE } from '../controller/runtime-spec.js';
import { TsboxError, messageOf } from '../base/errors.js';
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
import { toStatus } from './status.js';

/**
 * The Sandbox Controller service: each RPC validated, mapped to the controller, and its result
 * or error answered as gRPC (SPEC.md). How the socket is served is server.ts's job.
 */

export interface ControllerServiceOptions {
  readonly controller: Controller;
  readonly log: Logger;
  /** Told of every answered call: method, gRPC code, seconds since it arrived (metrics). */
  readonly rpcDone: ((method: string, code: number, seconds: number) => void) | undefined;
}

/** The calls of the service, as the server's lifecycle sees them. */
export interface ControllerCalls {
  /** Calls not yet answered. */
  readonly inFlight: number;
  /** Refuses new calls with `reason` and aborts the signal of every call in flight. */
  close(reason: TsboxError): void;
}

type Handler<Req, Res> = (request: Req, ctx: CallContext, namespace: string) => Promise<Res> | Res;
/** A handler that answers through `call.reply` (once), for calls that may stay pending long. */
type CallbackHandler<Req, Res> = (request: Req, call: ServedCall<Res>, namespace: string) => void;

const toAny = (any: AnyValue): Any => ({ typeUrl: any.typeUrl, value: Buffer.from(any.value) });

/** A request that did not decode: grpc-js would answer INTERNAL, SPEC.md says INVALID_ARGUMENT. */
class Malformed {
  constructor(readonly error: unknown) {}
}

/** What the calls of one server share. */
interface Served {
  readonly log: Logger;
  readonly debug: boolean;
  readonly registry: CallRegistry;
  /** Calls not yet answered, for the shutdown log line. */
  inFlight: number;
  readonly rpcDone: ((method: string, code: number, seconds: number) => void) | undefined;
}

/**
 * Waits told of an exit are answered after the current turn: the call that made the exit
 * happen (Stop, Shutdown) is answered first, so that its caller goes on while the answers to
 * the sandbox's watchers follow right behind it.
 */
let waitAnswers: ServedCall<ControllerWaitResponse>[] = [];

function answerWaits(): void {
  const answers = waitAnswers;
  waitAnswers = [];
  for (const call of answers) call.answerExit();
}

/**
 * One call being served: its context (signal, namespace), its answer, and for Wait the exit
 * listener, in one object, so that a pending Wait holds no closure of its own.
 */
class ServedCall<Res> extends CallContext {
  readonly #served: Served;
  readonly #callback: sendUnaryData<Res>;
  readonly #rpc: string;
  /** For the debug log line only. */
  readonly #started: bigint;
  id: string | undefined;
  #replied = false;
  #exit: ExitInfo | undefined;

  constructor(call: ServerUnaryCall<unknown, Res>, callback: sendUnaryData<Res>, served: Served, rpc: string) {
    super(call, served.registry);
    this.#served = served;
    this.#callback = callback;
    this.#rpc = rpc;
    this.#started = served.debug || served.rpcDone !== undefined ? process.hrtime.bigint() : 0n;
    served.inFlight++;
  }

  /** Wait's exit listener (controller/exit-signal.ts). */
  exitKnown(err: TsboxError | undefined, exit: ExitInfo | undefined): void {
    if (err !== undefined || exit === undefined) {
      this.reply(err ?? new TsboxError('Internal', 'no exit'));
      return;
    }
    this.#exit = exit;
    if (waitAnswers.length === 0) setImmediate(answerWaits);
    waitAnswers.push(this as unknown as ServedCall<ControllerWaitResponse>);
  }

  answerExit(): void {
    const exit = this.#exit as ExitInfo;
    this.reply(undefined, { exitStatus: exit.status, exitedAt: exit.exitedAt } as Res);
  }

  /** Answers the call once: the response, or the error as a status. */
  reply(err: unknown, response?: Res): void {
    if (this.#replied) return;
    this.#replied = true;
    this.dispose();
    const served = this.#served;
    served.inFlight--;
    let code = 0;
    if (err === undefined) {
      this.#callback(null, response);
    } else {
      const status = toStatus(err, served.log, this.#rpc);
      code = status.code;
      this.#callback({ code: status.code, details: status.message });
    }
    if (served.debug || served.rpcDone !== undefined) {
      const ms = Number(process.hrtime.bigint() - this.#started) / 1e6;
      served.rpcDone?.(this.#rpc, code, ms / 1000);
      if (served.debug) served.log.debug({ rpc: this.#rpc, ns: this.namespace, id: this.id, code, ms }, 'rpc');
    }
  }
}

interface MethodDefinition<Req, Res> {
  readonly path: string;
  readonly requestStream: false;
  readonly responseStream: false;
  requestSerialize(value: Req): Buffer;
  requestDeserialize(bytes: Buffer): Req;
  responseSerialize(value: Res): Buffer;
  responseDeserialize(bytes: Buffer): Res;
}

/** The generated definition, with requests that fail to decode handed on as Malformed. */
function serviceDefinition(): ServiceDefinition {
  const definition: Record<string, MethodDefinition<unknown, unknown>> = {};
  for (const [name, method] of Object.entries(ControllerService) as [string, MethodDefinition<unknown, unknown>][]) {
    definition[name] = {
      ...method,
      requestDeserialize(bytes) {
        try {
          return method.requestDeserialize(bytes);
        } catch (err) {
          return new Malformed(err);
        }
      },
    };
  }
  return definition;
}

/** Adds the Sandbox Controller service, served by `options.controller`, to `server`. */
export function addControllerService(server: Server, options: ControllerServiceOptions): ControllerCalls {
  const { controller, log } = options;
  const registry = new CallRegistry();
  const served: Served = { log, debug: log.isLevelEnabled('debug'), registry, inFlight: 0, rpcDone: options.rpcDone };

  /** Wraps a handler: validate, run, answer; errors become statuses. */
  function unary<Req extends { sandboxId: string }, Res>(rpc: string, handler: Handler<Req, Res>) {
    return callback<Req, Res>(rpc, (request, call, namespace) => {
      const result = handler(request, call, namespace);
      if (result instanceof Promise) result.then((response) => call.reply(undefined, response), (err: unknown) => call.reply(err));
      else call.reply(undefined, result);
    });
  }

  /** Wraps a callback handler: validate, run; errors become statuses. */
  function callback<Req extends { sandboxId: string }, Res>(rpc: string, handler: CallbackHandler<Req, Res>) {
    return (grpc: ServerUnaryCall<Req | Malformed, Res>, answer: sendUnaryData<Res>): void => {
      const call = new ServedCall<Res>(grpc, answer, served, rpc);
      try {
        const closing = registry.closing;
        if (closing !== undefined) throw closing;
        const request = grpc.request;
        if (request instanceof Malformed) {
          throw new TsboxError('InvalidArgument', `malformed ${rpc} request: ${messageOf(request.error)}`);
        }
        if (served.debug) call.id = request.sandboxId;
        const namespace = validateNamespace(call.namespace);
        validateIdentifier('sandbox_id', request.sandboxId);
        handler(request, call, namespace);
      } catch (err) {
        call.reply(err);
      }
    };
  }

  const implementation = {
    create: unary<ControllerCreateRequest, ControllerCreateResponse>('Create', async (req, _ctx, ns) => {
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
    start: unary<ControllerStartRequest, ControllerStartResponse>('Start', async (req, ctx, ns) => {
      const started = await controller.start(ns, req.sandboxId, ctx.signal);
      return {
        sandboxId: req.sandboxId,
        pid: started.pid,
        createdAt: started.createdAt,
        labels: { ...started.labels },
        address: started.address,
        version: started.version,
        // containerd 2.3 and later keep it (CRI's runtimeSpec, NRI's view of the pod); 2.1 skips the field.
        spec: { typeUrl: OCI_SPEC_TYPE, value: Buffer.from(JSON.stringify(started.spec)) },
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
    // A pod holds its Wait for its whole life: no promise or async frame stays behind.
    wait: callback<ControllerWaitRequest, ControllerWaitResponse>('Wait', (req, call, ns) => {
      controller.listen(ns, req.sandboxId, call.signal, call);
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
        address: status.address,
        version: status.version,
      };
    }),
    shutdown: unary<ControllerShutdownRequest, ControllerShutdownResponse>('Shutdown', async (req, ctx, ns) => {
      await controller.shutdown(ns, req.sandboxId, ctx.signal);
      return {};
    }),
    metrics: unary<ControllerMetricsRequest, ControllerMetricsResponse>('Metrics', async (req, _ctx, ns) => {
      const data = await controller.metrics(ns, req.sandboxId);
      return { metrics: { timestamp: systemClock(), id: req.sandboxId, data: toAny(data) } };
    }),
    update: unary<ControllerUpdateRequest, ControllerUpdateResponse>('Update', async (req, _ctx, ns) => {
      // containerd never fills Update's sandboxer (SPEC.md section 2): it is not checked.
      await controller.update(ns, req.sandboxId, {
        labels: req.sandbox?.labels ?? {},
        extensions: req.sandbox?.extensions ?? {},
        fields: req.fields,
      });
      return {};
    }),
  };

  server.addService(serviceDefinition(), implementation);
  return {
    get inFlight() {
      return served.inFlight;
    },
    close: (reason) => registry.close(reason),
  };
}
