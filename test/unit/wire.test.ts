// Proves that tsbox's wire definitions (proto/) match containerd's own: every
// message, field number, type and label, and the Controller's, Store's and Task API v3's
// methods, are compared with the reference .proto files Debian ships (SPEC.md section 1),
// and so are ttrpc's envelope (Request, Response) and google.rpc.Status. Also
// round-trips the generated code (src/gen/) and decodes its bytes with the
// reference definitions.
//
// Reference dir: $TSBOX_DEBIAN_PROTOS, else <repo>/.cache/debian-protos/root/usr/share/gocode/src,
// filled by scripts/install-containerd.sh.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import protobuf from 'protobufjs';

import {
  Metrics as CgroupV1Metrics,
} from '../../src/gen/cgroups/v1/metrics.js';
import {
  ControllerMetricsResponse,
  ControllerService,
  ControllerStatusResponse,
} from '../../src/gen/containerd/services/sandbox/v1/sandbox.js';
import { StoreService } from '../../src/gen/containerd/services/sandbox/v1/store.js';
import { StateResponse, TaskService } from '../../src/gen/containerd/task/v3/shim.js';
import { Status as TaskStatus } from '../../src/gen/containerd/v1/types/task.js';
import { Request as TtrpcRequest, Response as TtrpcResponse } from '../../src/gen/ttrpc/request.js';
import { ContainerState, ListContainersRequest, RuntimeServiceService } from '../../src/gen/runtime/v1/containers.js';
import { TaskOOM } from '../../src/gen/containerd/events/task.js';
import { EventsService, PublishRequest } from '../../src/gen/containerd/services/events/v1/events.js';

/** Packages whose messages we own and compare; google.protobuf comes from protobufjs itself. */
const OUR_PACKAGES = [
  'containerd.services.sandbox.v1',
  'containerd.types',
  'containerd.task.v3',
  'containerd.v1.types',
  'containerd.runc.v1',
  'containerd.events',
  'containerd.services.events.v1',
  'io.containerd.cgroups.v1',
  'io.containerd.cgroups.v2',
  'ttrpc',
  'google.rpc',
] as const;

/** Reference files, relative to the reference root. Their imports are resolved from there too. */
const REFERENCE_FILES = [
  'github.com/containerd/containerd/api/services/sandbox/v1/sandbox.proto',
  'github.com/containerd/cgroups/v3/cgroup1/stats/metrics.proto',
  'github.com/containerd/cgroups/v3/cgroup2/stats/metrics.proto',
  'k8s.io/cri-api/pkg/apis/runtime/v1/api.proto',
  'github.com/containerd/containerd/api/runtime/task/v3/shim.proto',
  'github.com/gogo/googleapis/google/rpc/status.proto',
  'github.com/containerd/containerd/api/types/runc/options/oci.proto',
  'github.com/containerd/containerd/api/events/task.proto',
  'github.com/containerd/containerd/api/services/events/v1/events.proto',
] as const;

/**
 * ttrpc's envelope, loaded into a root of its own: it imports a placeholder message named
 * `Status` with no package, which would otherwise be what other files' `Status` resolves to.
 */
const TTRPC_REFERENCE_FILES = ['github.com/containerd/ttrpc/request.proto'] as const;

/** ttrpc's Go code, whose imports say which Status its Response carries (see below). */
const TTRPC_REQUEST_GO = 'github.com/containerd/ttrpc/request.pb.go';

/**
 * Fields whose type the reference .proto spells with a stand-in. ttrpc's request.proto imports
 * proto/status.proto, a placeholder `Status { int32 code = 1; }` with no package; the Go code
 * it is compiled into (request.pb.go) uses genproto's google.rpc.Status, which is therefore
 * what containerd's ttrpc puts on the wire. The test checks that claim in request.pb.go.
 */
const STAND_IN_FIELD_TYPES: ReadonlyMap<string, { readonly reference: string; readonly ours: string }> = new Map([
  ['ttrpc.Response.status', { reference: 'Status', ours: 'google.rpc.Status' }],
]);

/**
 * Kubernetes CRI (package runtime.v1): tsbox defines only the messages it decodes, and of
 * those only the fields it reads; protobuf skips the rest on the wire. Each reference field
 * left out is named here, so that a field we do define can't drift from the reference.
 */
const CRI_PACKAGE = 'runtime.v1';
const CRI_OMITTED_FIELDS: ReadonlySet<string> = new Set([
  'runtime.v1.PodSandboxConfig.windows',
  'runtime.v1.LinuxSandboxSecurityContext.selinux_options',
  'runtime.v1.LinuxSandboxSecurityContext.supplemental_groups_policy',
  'runtime.v1.LinuxSandboxSecurityContext.seccomp',
  'runtime.v1.LinuxSandboxSecurityContext.apparmor',
  'runtime.v1.LinuxSandboxSecurityContext.seccomp_profile_path',
  'runtime.v1.Container.metadata',
  'runtime.v1.Container.image',
  'runtime.v1.Container.image_ref',
  'runtime.v1.Container.created_at',
  'runtime.v1.Container.labels',
  'runtime.v1.Container.annotations',
  'runtime.v1.Container.image_id',
]);

/**
 * Imports that only carry options (Go code generation, containerd's field paths); they are
 * skipped, shipped or not: protobufjs keeps unknown options as
 * plain values, so nothing on the wire depends on these files.
 */
const OPTION_ONLY_IMPORTS = new Set([
  'gogoproto/gogo.proto',
  'github.com/gogo/protobuf/gogoproto/gogo.proto',
  // containerd's field-path options on its events (api/events/*.proto): options only.
  'github.com/containerd/containerd/api/types/fieldpath.proto',
]);

/** How one field looks on the wire. */
interface FieldShape {
  readonly id: number;
  /** Scalar type name, or the fully qualified name of a message/enum type. */
  readonly type: string;
  /** 'single', 'repeated' or 'map<keyType>'. */
  readonly label: string;
}

/**
 * What we define beyond the Debian reference (containerd 2.1.9, containerd/cgroups
 * 3.0.5). Each is excused only while the reference lacks it; once the reference has
 * it, it is compared like any other field. The expected shape is pinned here so a
 * wrong number can't hide behind the excuse.
 */
const NEWER_FIELDS: ReadonlyMap<string, FieldShape & { readonly why: string }> = new Map([
  [
    'containerd.services.sandbox.v1.ControllerStartResponse.spec',
    // SPEC.md section 2: field 7 `spec` was added in containerd 2.3; older peers skip it.
    { id: 7, type: 'google.protobuf.Any', label: 'single', why: 'containerd 2.3 (SPEC.md section 2)' },
  ],
  [
    'io.containerd.cgroups.v2.Metrics.network',
    { id: 9, type: 'io.containerd.cgroups.v2.NetworkStat', label: 'repeated', why: 'containerd/cgroups after 3.0.5' },
  ],
  [
    'io.containerd.cgroups.v2.CPUStat.nr_bursts',
    { id: 8, type: 'uint64', label: 'single', why: 'containerd/cgroups after 3.0.5' },
  ],
  [
    'io.containerd.cgroups.v2.CPUStat.burst_usec',
    { id: 9, type: 'uint64', label: 'single', why: 'containerd/cgroups after 3.0.5' },
  ],
]);

/**
 * Messages we define that the reference predates, mapped to a reference message with
 * the same fields: upstream cgroup2's NetworkStat repeats cgroup1's field for field.
 */
const NEWER_MESSAGES: ReadonlyMap<string, string> = new Map([
  ['io.containerd.cgroups.v2.NetworkStat', 'io.containerd.cgroups.v1.NetworkStat'],
]);

/** The repository root: the nearest ancestor holding package.json and proto/. */
function findRepoRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(path.join(dir, 'package.json')) && existsSync(path.join(dir, 'proto'))) return dir;
    const parent = path.dirname(dir);
    if (parent === dir) throw new Error('wire.test: cannot find the repository root (package.json + proto/)');
    dir = parent;
  }
}

const repoRoot = findRepoRoot();
const protoDir = path.join(repoRoot, 'proto');
const referenceDir =
  process.env['TSBOX_DEBIAN_PROTOS'] ?? path.join(repoRoot, '.cache/debian-protos/root/usr/share/gocode/src');

/** Loads .proto files into a fresh root, resolving imports below importRoot. */
function loadRoot(importRoot: string, files: readonly string[]): protobuf.Root {
  const root = new protobuf.Root();
  root.resolvePath = (origin: string, target: string): string | null => {
    if (path.isAbsolute(target)) return target;
    if (OPTION_ONLY_IMPORTS.has(target)) return null;
    const candidate = path.join(importRoot, target);
    if (existsSync(candidate)) return candidate;
    // ttrpc's request.proto imports its own proto/status.proto relative to its module's root.
    const besideOrigin = path.join(path.dirname(origin), target);
    if (existsSync(besideOrigin)) return besideOrigin;
    throw new Error(`wire.test: ${origin} imports ${target}, which is not under ${importRoot}`);
  };
  root.loadSync(
    files.map((f) => path.join(importRoot, f)),
    { keepCase: true },
  );
  root.resolveAll();
  return root;
}

function listProtoFiles(dir: string): string[] {
  return readdirSync(dir, { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.proto'))
    .sort();
}

let referenceRoot: protobuf.Root | undefined;
/** The reference definitions; fails (never skips) when they are not unpacked. */
function reference(): protobuf.Root {
  if (referenceRoot === undefined) {
    const missing = [...REFERENCE_FILES, ...TTRPC_REFERENCE_FILES].filter((f) => !existsSync(path.join(referenceDir, f)));
    if (missing.length > 0) {
      assert.fail(
        `reference .proto files not found under ${referenceDir} (missing ${missing.join(', ')}). ` +
          'Run scripts/install-containerd.sh (as root) to unpack them, or point TSBOX_DEBIAN_PROTOS at them.',
      );
    }
    referenceRoot = loadRoot(referenceDir, REFERENCE_FILES);
  }
  return referenceRoot;
}

let ttrpcRoot: protobuf.Root | undefined;
/** The reference for package ttrpc (TTRPC_REFERENCE_FILES). */
function ttrpcReference(): protobuf.Root {
  reference();
  ttrpcRoot ??= loadRoot(referenceDir, TTRPC_REFERENCE_FILES);
  return ttrpcRoot;
}

/** The reference root holding the type `name`. */
function referenceFor(name: string): protobuf.Root {
  return name.startsWith('ttrpc.') ? ttrpcReference() : reference();
}

let oursRoot: protobuf.Root | undefined;
function ours(): protobuf.Root {
  oursRoot ??= loadRoot(protoDir, listProtoFiles(protoDir));
  return oursRoot;
}

/** Fully qualified name without protobufjs's leading dot. */
function fqn(obj: protobuf.ReflectionObject): string {
  return obj.fullName.replace(/^\./, '');
}

function shapeOf(field: protobuf.Field): FieldShape {
  const type = field.resolvedType === null ? field.type : fqn(field.resolvedType);
  let label = 'single';
  if (field instanceof protobuf.MapField) label = `map<${field.keyType}>`;
  else if (field.repeated) label = 'repeated';
  return { id: field.id, type, label };
}

/** Every message type (nested ones included) below a namespace. */
function messagesIn(ns: protobuf.NamespaceBase): protobuf.Type[] {
  const out: protobuf.Type[] = [];
  for (const obj of ns.nestedArray) {
    if (obj instanceof protobuf.Type) out.push(obj);
    if (obj instanceof protobuf.Namespace || obj instanceof protobuf.Type) out.push(...messagesIn(obj));
  }
  return out;
}

function ourMessages(pkg: string): protobuf.Type[] {
  const types = messagesIn(ours().lookup(pkg) as protobuf.Namespace);
  assert.ok(types.length > 0, `no messages of ours in package ${pkg}`);
  return types;
}

function lookupTypeOrNull(root: protobuf.Root, name: string): protobuf.Type | null {
  const found = root.lookup(name);
  return found instanceof protobuf.Type ? found : null;
}

/** Compares one of our messages field by field with the reference message of the same name. */
function assertSameMessage(mine: protobuf.Type, omitted: ReadonlySet<string> = new Set()): void {
  const name = fqn(mine);
  const standIn = NEWER_MESSAGES.get(name);
  let theirs = lookupTypeOrNull(referenceFor(name), name);
  if (theirs === null && standIn !== undefined) theirs = lookupTypeOrNull(referenceFor(standIn), standIn);
  assert.ok(theirs !== null, `${name}: no such message in the reference`);

  for (const field of mine.fieldsArray) {
    const key = `${name}.${field.name}`;
    const theirField = theirs.fields[field.name];
    const mineShape = shapeOf(field);
    if (theirField === undefined) {
      const newer = NEWER_FIELDS.get(key);
      assert.ok(newer !== undefined, `${key}: the reference has no such field`);
      assert.deepEqual(mineShape, { id: newer.id, type: newer.type, label: newer.label }, `${key} (${newer.why})`);
      continue;
    }
    const theirShape = shapeOf(theirField);
    const standInType = STAND_IN_FIELD_TYPES.get(key);
    if (standInType !== undefined) {
      assert.deepEqual(theirShape, { ...mineShape, type: standInType.reference }, `${key} (reference)`);
      assert.equal(mineShape.type, standInType.ours, key);
      continue;
    }
    if (standIn !== undefined && theirs.fullName !== mine.fullName) {
      // Types of a stand-in live in the other package: compare their short names.
      assert.deepEqual(
        { ...mineShape, type: mineShape.type.split('.').pop() },
        { ...theirShape, type: theirShape.type.split('.').pop() },
        key,
      );
    } else {
      assert.deepEqual(mineShape, theirShape, key);
    }
  }
  for (const theirField of theirs.fieldsArray) {
    if (omitted.has(`${name}.${theirField.name}`)) continue;
    assert.ok(
      mine.fields[theirField.name] !== undefined,
      `${name}.${theirField.name} (field ${theirField.id}) is in the reference but not in proto/`,
    );
  }
  assert.deepEqual(
    mine.oneofsArray.map((o) => o.name),
    theirs.oneofsArray.map((o) => o.name),
    `${name}: oneofs`,
  );
}

/** Every message reachable through fields from the given roots, google.protobuf excluded. */
function reachable(roots: readonly protobuf.Type[]): Set<string> {
  const seen = new Set<string>();
  const queue = [...roots];
  for (let t = queue.pop(); t !== undefined; t = queue.pop()) {
    const name = fqn(t);
    if (seen.has(name) || name.startsWith('google.protobuf.')) continue;
    seen.add(name);
    for (const field of t.fieldsArray) {
      if (field.resolvedType instanceof protobuf.Type) queue.push(field.resolvedType);
    }
  }
  return seen;
}

function controller(root: protobuf.Root): protobuf.Service {
  return root.lookupService('containerd.services.sandbox.v1.Controller');
}

/** containerd's sandbox metadata store, which the operator CLI calls (SPEC.md section 5). */
function store(root: protobuf.Root): protobuf.Service {
  return root.lookupService('containerd.services.sandbox.v1.Store');
}

/** A service's methods with their request/response types and streaming flags. */
function describeService(s: protobuf.Service): Record<string, unknown> {
  return Object.fromEntries(
    s.methodsArray.map((m) => [
      m.name,
      {
        request: m.resolvedRequestType === null ? m.requestType : fqn(m.resolvedRequestType),
        response: m.resolvedResponseType === null ? m.responseType : fqn(m.resolvedResponseType),
        requestStream: m.requestStream === true,
        responseStream: m.responseStream === true,
      },
    ]),
  );
}

test('the reference definitions are present and load', () => {
  const ref = reference();
  assert.ok(controller(ref).methodsArray.length > 0);
});

for (const pkg of OUR_PACKAGES) {
  test(`every message in ${pkg} matches the reference field by field`, () => {
    for (const mine of ourMessages(pkg)) assertSameMessage(mine);
  });
}

test(`the CRI messages tsbox decodes (${CRI_PACKAGE}) match Kubernetes' api.proto, less the fields named as left out`, () => {
  const mine = ourMessages(CRI_PACKAGE);
  assert.ok(mine.some((m) => fqn(m) === 'runtime.v1.PodSandboxConfig'));
  for (const message of mine) assertSameMessage(message, CRI_OMITTED_FIELDS);
  const enumValues = (root: protobuf.Root, name: string): Record<string, number> => ({ ...root.lookupEnum(name).values });
  for (const name of ['runtime.v1.NamespaceMode', 'runtime.v1.Protocol', 'runtime.v1.ContainerState']) {
    assert.deepEqual(enumValues(ours(), name), enumValues(reference(), name), name);
  }
  for (const field of CRI_OMITTED_FIELDS) {
    const [message, fieldName] = [field.slice(0, field.lastIndexOf('.')), field.slice(field.lastIndexOf('.') + 1)];
    assert.ok(reference().lookupType(message).fields[fieldName] !== undefined, `${field} is not in the reference`);
    assert.equal(ours().lookupType(message).fields[fieldName], undefined, `${field} is defined after all: drop it from the list`);
  }
});

test('CRI RuntimeService: ListContainers, the one method tsbox calls, is Kubernetes\' and at Kubernetes\' path', () => {
  const mine = ours().lookupService('runtime.v1.RuntimeService');
  const theirs = reference().lookupService('runtime.v1.RuntimeService');
  assert.deepEqual(mine.methodsArray.map((m) => m.name), ['ListContainers']);
  assert.deepEqual(describeService(mine)['ListContainers'], describeService(theirs)['ListContainers']);
  assert.equal(RuntimeServiceService.listContainers.path, '/runtime.v1.RuntimeService/ListContainers');
  const bytes = ListContainersRequest.encode({
    filter: { id: '', podSandboxId: 'p0d', state: { state: ContainerState.CONTAINER_RUNNING }, labelSelector: {} },
  }).finish();
  assert.deepEqual(decodeWithReference('runtime.v1.ListContainersRequest', bytes), {
    filter: { pod_sandbox_id: 'p0d', state: { state: 1 } },
  });
});

test("Events service: Publish, the one method tsbox calls, is containerd's, and a TaskOOM in it reads back with the reference", () => {
  const mine = ours().lookupService('containerd.services.events.v1.Events');
  const theirs = reference().lookupService('containerd.services.events.v1.Events');
  assert.deepEqual(mine.methodsArray.map((m) => m.name), ['Publish']);
  assert.deepEqual(describeService(mine)['Publish'], describeService(theirs)['Publish']);
  assert.equal(EventsService.publish.path, '/containerd.services.events.v1.Events/Publish');
  const bytes = PublishRequest.encode({ topic: '/tasks/oom', event: { typeUrl: 'containerd.events.TaskOOM', value: Buffer.from(TaskOOM.encode({ containerId: 'c1' }).finish()) } }).finish();
  const decoded = decodeWithReference('containerd.services.events.v1.PublishRequest', bytes) as { topic: string; event: { type_url: string; value: string } };
  assert.equal(decoded.topic, '/tasks/oom');
  assert.equal(decoded.event.type_url, 'containerd.events.TaskOOM');
  assert.deepEqual(decodeWithReference('containerd.events.TaskOOM', Buffer.from(decoded.event.value, 'base64')), { container_id: 'c1' });
});

test('Controller service: same nine unary methods with the same request and response types', () => {
  const mine = controller(ours());
  const theirs = controller(reference());
  assert.deepEqual(describeService(mine), describeService(theirs));
  assert.deepEqual(
    mine.methodsArray.map((m) => m.name).sort(),
    ['Create', 'Metrics', 'Platform', 'Shutdown', 'Start', 'Status', 'Stop', 'Update', 'Wait'],
  );
});

test('Store service: same five unary methods with the same request and response types', () => {
  assert.deepEqual(describeService(store(ours())), describeService(store(reference())));
  assert.deepEqual(store(ours()).methodsArray.map((m) => m.name).sort(), ['Create', 'Delete', 'Get', 'List', 'Update']);
  const paths = Object.values(StoreService).map((m) => m.path).sort();
  assert.deepEqual(
    paths,
    store(reference()).methodsArray.map((m) => `/containerd.services.sandbox.v1.Store/${m.name}`).sort(),
  );
});

test('we define every message the reference Controller, Store and cgroups Metrics trees use', () => {
  const ref = reference();
  const roots: protobuf.Type[] = [
    ...[...controller(ref).methodsArray, ...store(ref).methodsArray].flatMap((m) => {
      const types: protobuf.Type[] = [];
      if (m.resolvedRequestType !== null) types.push(m.resolvedRequestType);
      if (m.resolvedResponseType !== null) types.push(m.resolvedResponseType);
      return types;
    }),
    ref.lookupType('io.containerd.cgroups.v1.Metrics'),
    ref.lookupType('io.containerd.cgroups.v2.Metrics'),
    // Sandbox and Metric carry Anys; the types they point at are not reachable through fields.
    ref.lookupType('containerd.types.Sandbox'),
    ref.lookupType('containerd.types.Metric'),
  ];
  const needed = [...reachable(roots)].sort();
  const missing = needed.filter((name) => lookupTypeOrNull(ours(), name) === null);
  assert.deepEqual(missing, [], 'reference messages missing from proto/');
  assert.ok(needed.includes('io.containerd.cgroups.v1.MemoryStat'));
  assert.ok(needed.includes('io.containerd.cgroups.v2.PSIData'));
});

test('generated service paths are containerd\'s', () => {
  const paths = Object.values(ControllerService).map((m) => m.path).sort();
  assert.deepEqual(
    paths,
    controller(reference())
      .methodsArray.map((m) => `/containerd.services.sandbox.v1.Controller/${m.name}`)
      .sort(),
  );
  for (const m of Object.values(ControllerService)) {
    assert.equal(m.requestStream, false);
    assert.equal(m.responseStream, false);
  }
});

/**
 * Decodes bytes with a reference message type into plain JSON data: longs as numbers,
 * bytes as base64, fields absent from the wire omitted.
 */
function decodeWithReference(typeName: string, bytes: Uint8Array): Record<string, unknown> {
  const type = referenceFor(typeName).lookupType(typeName);
  const plain = type.toObject(type.decode(bytes), { longs: Number, bytes: String, defaults: false });
  return JSON.parse(JSON.stringify(plain)) as Record<string, unknown>;
}

test('ControllerStatusResponse round-trips and reads back with the reference definition', () => {
  const status = ControllerStatusResponse.fromPartial({
    sandboxId: 'c0ffee',
    pid: 4242,
    state: 'SANDBOX_NOTREADY',
    info: { info: '{"pid":4242}' },
    // Go's zero time, as CRI sends it for host-network pods (SPEC.md section 2).
    createdAt: { seconds: -62135596800, nanos: 0 },
    exitedAt: { seconds: 1_700_000_000, nanos: 123_000_000 },
    extra: { typeUrl: 'example.com/Extra', value: Buffer.from([1, 2, 3]) },
    address: 'ttrpc+unix:///run/tsbox/s.sock',
    version: 3,
  });
  const bytes = ControllerStatusResponse.encode(status).finish();
  assert.deepEqual(ControllerStatusResponse.decode(bytes), status);

  assert.deepEqual(decodeWithReference('containerd.services.sandbox.v1.ControllerStatusResponse', bytes), {
    sandbox_id: 'c0ffee',
    pid: 4242,
    state: 'SANDBOX_NOTREADY',
    info: { info: '{"pid":4242}' },
    created_at: { seconds: -62135596800 },
    exited_at: { seconds: 1_700_000_000, nanos: 123_000_000 },
    extra: { type_url: 'example.com/Extra', value: Buffer.from([1, 2, 3]).toString('base64') },
    address: 'ttrpc+unix:///run/tsbox/s.sock',
    version: 3,
  });
});

test('a Metric holding cgroups v1 Metrics in an Any round-trips', () => {
  const stats = CgroupV1Metrics.fromPartial({
    pids: { current: 3, limit: 0 },
    cpu: { usage: { total: 1_500_000, kernel: 500_000, user: 1_000_000, perCpu: [700_000, 800_000] } },
    memory: { rss: 4096, totalRss: 8192, usage: { limit: 1 << 30, usage: 8192, max: 16384, failcnt: 0 } },
    hugetlb: [{ pagesize: '2MB', usage: 0, max: 0, failcnt: 0 }],
  });
  const typeUrl = 'io.containerd.cgroups.v1.Metrics';
  const response = ControllerMetricsResponse.fromPartial({
    metrics: {
      id: 'c0ffee',
      timestamp: { seconds: 1_700_000_000, nanos: 1 },
      data: { typeUrl, value: Buffer.from(CgroupV1Metrics.encode(stats).finish()) },
    },
  });
  const bytes = ControllerMetricsResponse.encode(response).finish();
  const decoded = ControllerMetricsResponse.decode(bytes);
  assert.deepEqual(decoded, response);
  const data = decoded.metrics?.data;
  assert.ok(data !== undefined);
  assert.equal(data.typeUrl, typeUrl);
  assert.deepEqual(CgroupV1Metrics.decode(data.value), stats);

  // containerd's side: the Any's payload decodes as the reference cgroups message.
  const theirs = decodeWithReference(typeUrl, data.value);
  assert.deepEqual(theirs['pids'], { current: 3 });
  assert.deepEqual(theirs['cpu'], {
    usage: { total: 1_500_000, kernel: 500_000, user: 1_000_000, per_cpu: [700_000, 800_000] },
  });
  assert.deepEqual(theirs['memory'], {
    rss: 4096,
    total_rss: 8192,
    usage: { limit: 1 << 30, usage: 8192, max: 16384 },
  });
  assert.deepEqual(theirs['hugetlb'], [{ pagesize: '2MB' }]);
});

function task(root: protobuf.Root): protobuf.Service {
  return root.lookupService('containerd.task.v3.Task');
}

test('Task service (v3): same seventeen unary methods with the same request and response types', () => {
  assert.deepEqual(describeService(task(ours())), describeService(task(reference())));
  assert.deepEqual(
    task(ours()).methodsArray.map((m) => m.name).sort(),
    ['Checkpoint', 'CloseIO', 'Connect', 'Create', 'Delete', 'Exec', 'Kill', 'Pause', 'Pids', 'ResizePty', 'Resume', 'Shutdown', 'Start', 'State', 'Stats', 'Update', 'Wait'],
  );
  const generated = Object.values(TaskService);
  assert.deepEqual(
    generated.map((m) => m.path).sort(),
    task(reference()).methodsArray.map((m) => `/containerd.task.v3.Task/${m.name}`).sort(),
  );
  for (const m of generated) assert.equal(m.requestStream || m.responseStream, false, m.path);
});

test("the task Status enum has containerd's names and numbers", () => {
  const enumValues = (root: protobuf.Root): Record<string, number> => ({ ...root.lookupEnum('containerd.v1.types.Status').values });
  assert.deepEqual(enumValues(ours()), enumValues(reference()));
  assert.deepEqual(
    Object.fromEntries(Object.entries(TaskStatus as Record<string, string | number>).filter(([, v]) => typeof v === 'number' && v >= 0)),
    enumValues(reference()),
  );
});

test('we define every message the reference Task service and ttrpc envelope use', () => {
  const ref = reference();
  const roots: protobuf.Type[] = [
    ...task(ref).methodsArray.flatMap((m) => [m.resolvedRequestType, m.resolvedResponseType].filter((t): t is protobuf.Type => t !== null)),
    ttrpcReference().lookupType('ttrpc.Request'),
    ttrpcReference().lookupType('ttrpc.Response'),
    ttrpcReference().lookupType('ttrpc.StringList'),
    // What Response.status carries on the wire (STAND_IN_FIELD_TYPES).
    ref.lookupType('google.rpc.Status'),
  ];
  // The reference's placeholder Status (no package) is replaced by google.rpc.Status.
  const needed = [...reachable(roots)].filter((name) => name !== 'Status').sort();
  const missing = needed.filter((name) => lookupTypeOrNull(ours(), name) === null);
  assert.deepEqual(missing, [], 'reference messages missing from proto/');
  assert.ok(needed.includes('containerd.v1.types.ProcessInfo'));
  assert.ok(needed.includes('ttrpc.KeyValue'));
});

test("ttrpc's Go code carries google.rpc.Status in Response.status, as proto/ttrpc/request.proto says", () => {
  const file = path.join(referenceDir, TTRPC_REQUEST_GO);
  assert.ok(existsSync(file), `${file} not found: run scripts/install-containerd.sh (as root)`);
  const go = readFileSync(file, 'utf8');
  const alias = /^\s*(\w+)\s+"google\.golang\.org\/genproto\/googleapis\/rpc\/status"$/m.exec(go)?.[1];
  assert.ok(alias !== undefined, 'request.pb.go does not import genproto status');
  assert.match(go, new RegExp(`^\\s*Status\\s+\\*${alias}\\.Status\\s+\`protobuf:"bytes,1,opt,name=status`, 'm'));
});

test('a ttrpc Request and Response round-trip and read back with the reference definitions', () => {
  const request = TtrpcRequest.fromPartial({
    service: 'containerd.task.v3.Task',
    method: 'Wait',
    payload: Buffer.from([0x0a, 0x01, 0x61]),
    timeoutNano: 5_000_000_000,
    metadata: [{ key: 'containerd-namespace-ttrpc', value: 'k8s.io' }],
  });
  const requestBytes = TtrpcRequest.encode(request).finish();
  assert.deepEqual(TtrpcRequest.decode(requestBytes), request);
  assert.deepEqual(decodeWithReference('ttrpc.Request', requestBytes), {
    service: 'containerd.task.v3.Task',
    method: 'Wait',
    payload: Buffer.from([0x0a, 0x01, 0x61]).toString('base64'),
    timeout_nano: 5_000_000_000,
    metadata: [{ key: 'containerd-namespace-ttrpc', value: 'k8s.io' }],
  });

  const response = TtrpcResponse.fromPartial({
    status: { code: 5, message: 'task c0ffee not found', details: [] },
  });
  const responseBytes = TtrpcResponse.encode(response).finish();
  assert.deepEqual(TtrpcResponse.decode(responseBytes), response);
  const status = decodeWithReference('ttrpc.Response', responseBytes)['status'];
  // The reference's placeholder reads the code; google.rpc.Status reads all of it.
  assert.deepEqual(status, { code: 5 });
  const reader = protobuf.Reader.create(responseBytes);
  assert.equal(reader.uint32(), (1 << 3) | 2, 'Response.status comes first, length-delimited');
  assert.deepEqual(decodeWithReference('google.rpc.Status', reader.bytes()), { code: 5, message: 'task c0ffee not found' });
});

test('a Task StateResponse round-trips and reads back with the reference definition', () => {
  const state = StateResponse.fromPartial({
    id: 'c0ffee',
    bundle: '/run/containerd/io.containerd.runtime.v2.task/k8s.io/c0ffee',
    pid: 4242,
    status: TaskStatus.STOPPED,
    stdout: '/run/containerd/fifo/1/c0ffee-stdout',
    stderr: '/run/containerd/fifo/1/c0ffee-stderr',
    exitStatus: 137,
    exitedAt: { seconds: 1_700_000_000, nanos: 5 },
    execId: 'probe-1',
  });
  const bytes = StateResponse.encode(state).finish();
  assert.deepEqual(StateResponse.decode(bytes), state);
  assert.deepEqual(decodeWithReference('containerd.task.v3.StateResponse', bytes), {
    id: 'c0ffee',
    bundle: '/run/containerd/io.containerd.runtime.v2.task/k8s.io/c0ffee',
    pid: 4242,
    status: 3,
    stdout: '/run/containerd/fifo/1/c0ffee-stdout',
    stderr: '/run/containerd/fifo/1/c0ffee-stderr',
    exit_status: 137,
    exited_at: { seconds: 1_700_000_000, nanos: 5 },
    exec_id: 'probe-1',
  });
});
