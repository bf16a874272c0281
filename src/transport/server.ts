import { createServer as createNetServer, type Server as NetServer } from 'node:net';
import { Server, ServerCredentials } from '@grpc/grpc-js';
import { HealthImplementation } from 'grpc-health-check';
import type { Logger } from 'pino';
import type { Controller } from '../controller/controller.js';
import { TsboxError } from '../base/errors.js';
import { admitStreams, injectorHttp2Server } from './admission.js';
import { ConnectionTable } from './connections.js';
import { addControllerService } from './controller-service.js';
import { GRPC_SERVER_OPTIONS, LISTEN_BACKLOG, maxArrivingConnections, maxConnections } from './limits.js';
import { listenUnixSocket } from './socket.js';

export { MAX_MESSAGE_BYTES } from './limits.js';

/** The service name the health service reports for, besides the server as a whole (""). */
export const CONTROLLER_SERVICE_NAME = 'containerd.services.sandbox.v1.Controller';

export interface ServerOptions {
  readonly controller: Controller;
  readonly logger: Logger;
  readonly socketPath: string;
  readonly socketMode: number;
  /** Told of every answered call: method, gRPC code, seconds since it arrived (metrics). */
  readonly rpcDone?: (method: string, code: number, seconds: number) => void;
}

/** The daemon's gRPC server, started and stopped by the entry point. */
export interface TsboxServer {
  /** Binds the socket; from now on calls are accepted. Health says NOT_SERVING until told. */
  listen(): Promise<void>;
  /** What the standard health service (grpc.health.v1.Health) reports. */
  setServing(serving: boolean): void;
  /**
   * Says NOT_SERVING, stops accepting connections and calls, ends pending Waits as
   * UNAVAILABLE (which containerd retries), lets other calls finish for up to `drainMs`, then
   * closes every connection and removes the socket.
   */
  close(drainMs: number): Promise<void>;
}

/**
 * Builds the server around the controller: the controller service (controller-service.ts)
 * and the health service on grpc-js, served on a listening socket of our own whose
 * connections the connection table bounds; binding, draining and closing it.
 */
export function createServer(options: ServerOptions): TsboxServer {
  const log = options.logger.child({ component: 'transport' });
  const server = new Server(GRPC_SERVER_OPTIONS);
  const calls = addControllerService(server, { controller: options.controller, log, rpcDone: options.rpcDone });
  const health = new HealthImplementation({ '': 'NOT_SERVING', [CONTROLLER_SERVICE_NAME]: 'NOT_SERVING' });
  health.addToServer(server);
  const setServing = (serving: boolean): void => {
    const status = serving ? 'SERVING' : 'NOT_SERVING';
    health.setStatus('', status);
    health.setStatus(CONTROLLER_SERVICE_NAME, status);
  };

  // The listening socket is ours, so that connections can be tracked and bounded; grpc-js
  // serves each one through its connection injector.
  const injector = server.createConnectionInjector(ServerCredentials.createInsecure());
  const http2Server = injectorHttp2Server(server);
  const stopAdmission = admitStreams(http2Server, log);
  const connectionLimit = maxConnections();
  const connections = new ConnectionTable({
    http2Server,
    inject: (connection) => injector.injectConnection(connection),
    limit: connectionLimit,
    maxArriving: maxArrivingConnections(),
    log,
  });
  const listener: NetServer = createNetServer((connection) => connections.accept(connection));
  let socket: { remove(): Promise<void> } | undefined;

  return {
    async listen() {
      socket = await listenUnixSocket(listener, options.socketPath, options.socketMode, LISTEN_BACKLOG);
      listener.on('error', (err) => log.error({ err }, 'listening socket error'));
      log.info(
        { socket: options.socketPath, mode: options.socketMode.toString(8), maxConnections: connectionLimit },
        'listening',
      );
    },
    setServing,
    async close(drainMs) {
      log.info({ inFlight: calls.inFlight, drainMs }, 'shutting down: refusing new calls, ending pending Waits');
      setServing(false);
      const listenerClosed = new Promise<void>((resolve) => listener.close(() => resolve()));
      calls.close(new TsboxError('Unavailable', 'tsbox is shutting down; retry'));
      // tryShutdown refuses new streams (GOAWAY) and waits for the calls in flight; whatever is
      // left when the drain time is over is cut off with its connection (UNAVAILABLE).
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          log.warn({ inFlight: calls.inFlight }, 'drain time is over; closing connections');
          server.forceShutdown();
          resolve();
        }, drainMs);
        server.tryShutdown(() => {
          clearTimeout(timer);
          resolve();
        });
      });
      injector.destroy();
      stopAdmission();
      connections.close();
      await listenerClosed;
      await socket?.remove();
      log.info('server closed');
    },
  };
}
