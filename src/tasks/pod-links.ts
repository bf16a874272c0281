import { connect, type Socket } from 'node:net';
import type { Logger } from 'pino';
import { TsboxError, errnoOf, withPath } from '../base/errors.js';
import { FORMER_FRONT_SERVICE, POD_CANCEL, POD_HELLO, POD_PROTOCOL_VERSION, POD_SERVICE, decodeCancel, decodeHello } from '../ttrpc/pod-link.js';
import type { HandedOptions, OwnRequestHandler, TtrpcServer } from '../ttrpc/server.js';

/** A pod whose process relays containerd's task calls to tsbox over the pod's link socket. */
export interface LinkedPod {
  /** `<namespace>/<sandbox id>`, for the log and for detach(). */
  readonly key: string;
  /** The link socket the pod's process listens on. */
  readonly path: string;
  /** True while the pod's process is the one recorded (its pid with its start time). */
  alive(): Promise<boolean>;
  /** The pod's process is gone: called once, after which the link is forgotten. */
  lost(): void;
}

/** Waits between attempts to reach a pod's process that lives but does not accept: 50 ms, doubling to 5 s. */
const FIRST_RETRY_MS = 50;
const LAST_RETRY_MS = 5_000;

class Link {
  socket: Socket | undefined;
  retryMs = FIRST_RETRY_MS;
  timer: NodeJS.Timeout | undefined;
  detached = false;
  /** The pod's process speaks a protocol version this tsbox does not: it is not reached again. */
  refused = false;
  /** Called once the link's connection has closed, when its pod's process is being ended (release()). */
  onClosed: (() => void) | undefined;

  constructor(readonly pod: LinkedPod) {}
}

/** containerd's connection carrying the calls closed: nobody waits for their answers. */
const cancel: OwnRequestHandler = (payload, connection) => {
  const ids = decodeCancel(payload);
  if (ids === undefined) return new TsboxError('InvalidArgument', `${POD_CANCEL}: the payload is not whole 4-byte stream ids (${payload.length} bytes)`);
  connection.abort(ids, new TsboxError('Cancelled', "containerd's connection closed"));
  return undefined;
};

/**
 * What a pod's process asks of its own on its link (src/ttrpc/pod-link.ts): its Hello, which
 * `hello` answers (undefined to go on, or the refusal, after which the link is closed), and the
 * calls containerd abandoned; also the cancel of an earlier build's node-wide task front.
 */
export function podRequests(hello: (version: number | undefined) => TsboxError | undefined): HandedOptions {
  return {
    own: new Map<string, OwnRequestHandler>([
      [
        `${POD_SERVICE}/${POD_HELLO}`,
        (payload, connection) => {
          const refused = hello(decodeHello(payload));
          if (refused !== undefined) connection.end();
          return refused;
        },
      ],
      [`${POD_SERVICE}/${POD_CANCEL}`, cancel],
      [`${FORMER_FRONT_SERVICE}/${POD_CANCEL}`, cancel],
    ]),
  };
}

/** A connection to a unix socket; undefined when nobody listens there (no file, or refused). */
export function dialUnix(path: string): Promise<Socket | undefined> {
  return new Promise((resolve, reject) => {
    const socket = connect(path);
    socket.once('connect', () => {
      socket.removeAllListeners('error');
      resolve(socket);
    });
    socket.once('error', (err) => {
      const code = errnoOf(err);
      if (code === 'ENOENT' || code === 'ECONNREFUSED') resolve(undefined);
      else reject(withPath(err, path, 'connect to'));
    });
  });
}

/**
 * tsbox's links to the pods' processes: one connection per pod, opened by tsbox to the pod's link
 * socket, over which the pod's process relays the calls containerd makes on the pod's task socket
 * (served by the task service on `server`). A link that closes is opened again while the pod's
 * process lives; when it is gone, the pod is told lost. Each pod is independent of the others:
 * nothing here is shared by two pods but tsbox itself.
 */
export class PodLinks {
  readonly #log: Logger;
  readonly #server: TtrpcServer;
  readonly #links = new Map<string, Link>();
  #closing = false;

  constructor(options: { readonly logger: Logger; readonly server: TtrpcServer }) {
    this.#log = options.logger;
    this.#server = options.server;
  }

  /** Links kept now (one per pod whose process tsbox reaches or tries to). */
  get size(): number {
    return this.#links.size;
  }

  /** Starts reaching the pod's process (again, after a restart of tsbox); one link per key. */
  attach(pod: LinkedPod): void {
    if (this.#closing) return;
    this.detach(pod.key);
    const link = new Link(pod);
    this.#links.set(pod.key, link);
    void this.#reach(link);
  }

  /** Stops serving the pod (its process is being ended): its link closes, and is not opened again. */
  detach(key: string): void {
    this.#forget(key)?.socket?.destroy();
  }

  /**
   * The pod's process is being ended: its link is not opened again nor its loss reported, but the
   * connection is left open. Resolves once it has closed (the process ended, or it closed its
   * end on its way out), at once when there is none: the end of the process, told as it happens.
   */
  release(key: string): Promise<void> {
    const link = this.#forget(key);
    if (link?.socket === undefined || link.socket.destroyed) return Promise.resolve();
    return new Promise((resolve) => {
      link.onClosed = resolve;
    });
  }

  /** The pod's link, no longer kept nor opened again; undefined when there was none. */
  #forget(key: string): Link | undefined {
    const link = this.#links.get(key);
    if (link === undefined) return undefined;
    this.#links.delete(key);
    link.detached = true;
    clearTimeout(link.timer);
    return link;
  }

  /** tsbox stops: no link is opened again (the server's close ends those open). */
  close(): void {
    this.#closing = true;
    for (const link of this.#links.values()) clearTimeout(link.timer);
  }

  async #reach(link: Link): Promise<void> {
    if (link.detached || this.#closing) return;
    let socket: Socket | undefined;
    try {
      socket = await dialUnix(link.pod.path);
    } catch (err) {
      this.#log.warn({ pod: link.pod.key, err }, "cannot reach the pod's process");
    }
    if (socket === undefined) {
      await this.#closed(link);
      return;
    }
    if (link.detached || this.#closing) {
      socket.destroy();
      return;
    }
    link.socket = socket;
    link.retryMs = FIRST_RETRY_MS;
    void this.#server.serveConnection(socket, podRequests((version) => this.#hello(link, version))).then(() => this.#closed(link));
  }

  #hello(link: Link, version: number | undefined): TsboxError | undefined {
    if (version === POD_PROTOCOL_VERSION) return undefined;
    link.refused = true;
    const said = version === undefined ? 'no protocol version' : `protocol version ${version}`;
    const message = `the process of pod ${link.pod.key} speaks ${said}; this tsbox speaks version ${POD_PROTOCOL_VERSION}: its containers are not served (start the tsbox build that started the pod, or remove the pod)`;
    this.#log.error({ pod: link.pod.key, link: link.pod.path, version }, message);
    return new TsboxError('FailedPrecondition', message);
  }

  async #closed(link: Link): Promise<void> {
    link.socket = undefined;
    link.onClosed?.();
    link.onClosed = undefined;
    if (link.detached || this.#closing || link.refused) return;
    if (!(await link.pod.alive())) {
      if (link.detached || this.#links.get(link.pod.key) !== link) return;
      this.#links.delete(link.pod.key);
      this.#log.warn({ pod: link.pod.key }, "the pod's process is gone");
      link.pod.lost();
      return;
    }
    this.#log.debug({ pod: link.pod.key, retryMs: link.retryMs }, "the link to the pod's process closed; reaching it again");
    link.timer = setTimeout(() => void this.#reach(link), link.retryMs);
    link.retryMs = Math.min(link.retryMs * 2, LAST_RETRY_MS);
  }
}
