/**
 * An NRI plugin, as an operator's node agent would be: it connects to containerd's NRI socket,
 * registers, asks for RunPodSandbox events and records each pod as NRI shows it (its
 * namespaces, cgroups path, resources, pid). NRI multiplexes one unix connection: each frame is
 * a 4-byte connection id and a 4-byte length (big-endian) before that connection's bytes. On
 * connection 1 containerd calls the plugin (the Plugin service); on connection 2 the plugin
 * calls containerd (the Runtime service). Both carry ttrpc, framed and decoded with tsbox's own
 * ttrpc frame code; the messages come from test/fixtures/nri.proto.
 */
import net from 'node:net';
import path from 'node:path';
import * as protoLoader from '@grpc/proto-loader';
import { Request, Response } from '../../src/gen/ttrpc/request.js';
import { FrameDecoder, FrameType, encodeFrame } from '../../src/ttrpc/frame.js';
import { repoRoot } from './containerd-clients.js';

const PLUGIN_CONN = 1;
const RUNTIME_CONN = 2;
const MUX_HEADER = 8;
const PACKAGE = 'nri.pkg.api.v1alpha1';
/** NRI's event bit of RunPodSandbox (1 << (RUN_POD_SANDBOX - 1)). */
const RUN_POD_SANDBOX_EVENTS = 1;

/** A pod as NRI shows it to a plugin (the fields the test plugin reads). */
export interface NriPod {
  id: string;
  name: string;
  runtime_handler: string;
  pid: number;
  annotations: Record<string, string>;
  linux: {
    cgroup_parent: string;
    cgroups_path: string;
    namespaces: { type: string; path: string }[];
    resources: { memory: { limit: { value: string } | null } | null; cpu: { shares: { value: string } | null } | null } | null;
  } | null;
}

export interface NriPlugin {
  /** Resolves once containerd has configured and synchronized the plugin. */
  readonly ready: Promise<{ runtimeName: string; runtimeVersion: string }>;
  /** The pods of the RunPodSandbox events so far, by id. */
  readonly pods: Map<string, NriPod>;
  /** Resolves with pod `id` once its RunPodSandbox event came (at once if it did). */
  pod(id: string): Promise<NriPod>;
  close(): void;
}

interface Codec {
  requestDeserialize(bytes: Buffer): unknown;
  requestSerialize(value: unknown): Buffer;
  responseDeserialize(bytes: Buffer): unknown;
  responseSerialize(value: unknown): Buffer;
}

function loadCodecs(): Record<string, Codec> {
  const definition = protoLoader.loadSync(path.join(repoRoot, 'test', 'fixtures', 'nri.proto'), { keepCase: true, longs: String, defaults: true, oneofs: true });
  const codecs: Record<string, Codec> = {};
  for (const service of ['Runtime', 'Plugin']) {
    const methods = definition[`${PACKAGE}.${service}`] as unknown as Record<string, Codec>;
    for (const [method, codec] of Object.entries(methods)) codecs[`${service}/${method}`] = codec;
  }
  return codecs;
}

/** Connects a plugin named `name` (index `idx`, two digits) to containerd's NRI socket. */
export function connectNriPlugin(socketPath: string, name = 'tsbox-test', idx = '10'): NriPlugin {
  const codecs = loadCodecs();
  const codec = (key: string): Codec => {
    const found = codecs[key];
    if (found === undefined) throw new Error(`no method ${key} in nri.proto`);
    return found;
  };
  const socket = net.connect(socketPath);
  const pods = new Map<string, NriPod>();
  const podWaiters = new Map<string, ((pod: NriPod) => void)[]>();
  const send = (conn: number, bytes: Buffer): void => {
    const header = Buffer.alloc(MUX_HEADER);
    header.writeUInt32BE(conn, 0);
    header.writeUInt32BE(bytes.length, 4);
    socket.write(Buffer.concat([header, bytes]));
  };
  let ready: (value: { runtimeName: string; runtimeVersion: string }) => void = () => undefined;
  let failed: (err: Error) => void = () => undefined;
  const readyPromise = new Promise<{ runtimeName: string; runtimeVersion: string }>((resolve, reject) => {
    ready = resolve;
    failed = reject;
  });
  let runtime = { runtimeName: '', runtimeVersion: '' };

  // containerd's calls to the plugin (connection 1): answered at once.
  const answer = (method: string, payload: Uint8Array): Buffer => {
    const c = codec(`Plugin/${method}`);
    const request = c.requestDeserialize(Buffer.from(payload));
    switch (method) {
      case 'Configure': {
        const r = request as { runtime_name: string; runtime_version: string };
        runtime = { runtimeName: r.runtime_name, runtimeVersion: r.runtime_version };
        return c.responseSerialize({ events: RUN_POD_SANDBOX_EVENTS });
      }
      case 'Synchronize':
        if (!(request as { more: boolean }).more) ready(runtime);
        return c.responseSerialize({ more: false });
      case 'RunPodSandbox': {
        const pod = (request as { pod: NriPod }).pod;
        pods.set(pod.id, pod);
        for (const waiter of podWaiters.get(pod.id) ?? []) waiter(pod);
        podWaiters.delete(pod.id);
        return c.responseSerialize({});
      }
      default:
        return c.responseSerialize({});
    }
  };
  const pluginSide = new FrameDecoder();
  const runtimeSide = new FrameDecoder();
  const onPluginBytes = (bytes: Buffer): void => {
    for (const decoded of pluginSide.push(bytes)) {
      if (decoded.kind !== 'frame' || decoded.frame.type !== FrameType.Request) continue;
      const request = Request.decode(decoded.frame.payload);
      let response: Response;
      try {
        const payload = answer(request.method, request.payload);
        response = { status: { code: 0, message: '', details: [] }, payload };
      } catch (err) {
        response = { status: { code: 13, message: err instanceof Error ? err.message : String(err), details: [] }, payload: Buffer.alloc(0) };
      }
      send(PLUGIN_CONN, encodeFrame(decoded.frame.streamId, FrameType.Response, Response.encode(response).finish()));
    }
  };
  // The plugin's own call (connection 2): RegisterPlugin, whose answer must be OK.
  const onRuntimeBytes = (bytes: Buffer): void => {
    for (const decoded of runtimeSide.push(bytes)) {
      if (decoded.kind !== 'frame' || decoded.frame.type !== FrameType.Response) continue;
      const response = Response.decode(decoded.frame.payload);
      if ((response.status?.code ?? 0) !== 0) failed(new Error(`NRI RegisterPlugin: ${response.status?.message ?? ''}`));
    }
  };

  // The trunk: frames of both connections, split by id.
  let pending = Buffer.alloc(0);
  socket.on('data', (chunk: Buffer) => {
    pending = Buffer.concat([pending, chunk]);
    while (pending.length >= MUX_HEADER) {
      const conn = pending.readUInt32BE(0);
      const length = pending.readUInt32BE(4);
      if (pending.length < MUX_HEADER + length) break;
      const body = pending.subarray(MUX_HEADER, MUX_HEADER + length);
      pending = pending.subarray(MUX_HEADER + length);
      if (conn === PLUGIN_CONN) onPluginBytes(body);
      else if (conn === RUNTIME_CONN) onRuntimeBytes(body);
    }
  });
  socket.on('error', (err) => failed(err));
  socket.on('close', () => failed(new Error('containerd closed the NRI connection')));
  socket.on('connect', () => {
    const register = Request.encode({
      service: `${PACKAGE}.Runtime`,
      method: 'RegisterPlugin',
      payload: codec('Runtime/RegisterPlugin').requestSerialize({ plugin_name: name, plugin_idx: idx }),
      timeoutNano: 0,
      metadata: [],
    }).finish();
    send(RUNTIME_CONN, encodeFrame(1, FrameType.Request, register));
  });

  return {
    ready: readyPromise,
    pods,
    pod(id) {
      const seen = pods.get(id);
      if (seen !== undefined) return Promise.resolve(seen);
      return new Promise((resolve) => podWaiters.set(id, [...(podWaiters.get(id) ?? []), resolve]));
    },
    close() {
      socket.destroy();
    },
  };
}
