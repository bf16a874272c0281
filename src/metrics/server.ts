/**
 * The HTTP endpoint beside tsbox's gRPC socket: `/metrics` (Prometheus text format),
 * `/healthz` (200 while the process runs its event loop), `/readyz` (200 only while tsbox
 * serves: after recovery, before shutdown; 503 otherwise). On `HOST:PORT` or a unix socket.
 */
import { lstat } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { Logger } from 'pino';
import { parseListenAddress } from '../config/config.js';
import { TsboxError, isGone, withPath } from '../base/errors.js';
import type { DaemonMetrics } from './metrics.js';
import { prepareSocketPath } from '../transport/socket.js';

/** A running metrics endpoint. */
export interface MetricsServer {
  /** Where it listens, as configured. */
  readonly address: string;
  close(): Promise<void>;
}

/** A metrics address that cannot be used: in use, or not a listen address. */
export class MetricsAddressError extends Error {
  override readonly name = 'MetricsAddressError';
}

/** Whether a socket file is at `path` (anything else, or nothing, is left to listen()). */
async function isSocketFile(path: string): Promise<boolean> {
  try {
    return (await lstat(path)).isSocket();
  } catch (err) {
    // Nothing there: listen() creates it. Anything else is the caller's, with the path.
    if (isGone(err, ['ENOTDIR'])) return false;
    throw withPath(err, path, 'check');
  }
}

/** Starts the endpoint; rejects with a MetricsAddressError naming the address when it is taken. */
export async function startMetricsServer(address: string, metrics: DaemonMetrics, logger: Logger): Promise<MetricsServer> {
  const listen = parseListenAddress(address);
  if (listen === undefined) throw new MetricsAddressError(`metrics_address ${JSON.stringify(address)} is not HOST:PORT or an absolute socket path`);
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    if (path === '/metrics') {
      metrics.registry.metrics().then(
        (text) => res.writeHead(200, { 'content-type': metrics.registry.contentType }).end(text),
        (err: unknown) => {
          logger.error({ err }, 'metrics collection failed');
          res.writeHead(500).end('metrics collection failed\n');
        },
      );
    } else if (path === '/healthz') {
      res.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n');
    } else if (path === '/readyz') {
      const ready = metrics.ready;
      res.writeHead(ready ? 200 : 503, { 'content-type': 'text/plain' }).end(ready ? 'ready\n' : 'not ready: recovering or shutting down\n');
    } else {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: /metrics, /healthz, /readyz\n');
    }
  });
  // A socket file left by a crash is replaced; a live one is another server's.
  if (listen.kind === 'unix' && (await isSocketFile(listen.path))) {
    try {
      await prepareSocketPath(listen.path);
    } catch (err) {
      if (err instanceof TsboxError) throw new MetricsAddressError(`metrics address ${address} is in use: another server answers on it; stop it or pick another metrics_address`);
      throw err;
    }
  }
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EADDRINUSE') reject(new MetricsAddressError(`metrics address ${address} is in use by another process; stop it or pick another metrics_address`));
      else reject(new MetricsAddressError(`cannot listen on metrics address ${address}: ${err.message}`));
    });
    if (listen.kind === 'unix') server.listen(listen.path, resolve);
    else server.listen(listen.port, listen.host, resolve);
  });
  logger.info({ address }, 'metrics endpoint listening (/metrics, /healthz, /readyz)');
  return {
    address,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
