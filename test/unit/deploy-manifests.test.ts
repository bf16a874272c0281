/**
 * The Kubernetes manifests under deploy/kubernetes/, checked offline: each document parses,
 * and the fields tsbox relies on have the shape Kubernetes expects (zod schemas of just
 * those fields), and fit together (selectors, volumes, the node label the RuntimeClass
 * schedules onto, the image the Dockerfile builds from the release artifact).
 */
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { z } from 'zod';
import { repoRoot } from '../support/containerd-clients.js';

const dir = path.join(repoRoot, 'deploy', 'kubernetes');
const quantity = z.string().regex(/^\d+(\.\d+)?(m|Ki|Mi|Gi)?$/, 'a Kubernetes quantity');
const labels = z.record(z.string(), z.string());
const metadata = z.object({ name: z.string().regex(/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/), namespace: z.string().optional(), labels: labels.optional() });

const runtimeClass = z.object({
  apiVersion: z.literal('node.k8s.io/v1'),
  kind: z.literal('RuntimeClass'),
  metadata,
  handler: z.literal('tsbox'),
  overhead: z.object({ podFixed: z.object({ memory: quantity, cpu: quantity }) }),
  scheduling: z.object({ nodeSelector: labels }),
});

const container = z.object({
  name: z.string(),
  image: z.string().min(1),
  command: z.array(z.string()).optional(),
  args: z.array(z.string()).optional(),
  securityContext: z.object({ privileged: z.boolean() }).optional(),
  volumeMounts: z.array(z.object({ name: z.string(), mountPath: z.string().startsWith('/') })).optional(),
  env: z.array(z.object({ name: z.string() }).loose()).optional(),
});

const daemonSet = z.object({
  apiVersion: z.literal('apps/v1'),
  kind: z.literal('DaemonSet'),
  metadata: metadata.extend({ namespace: z.string() }),
  spec: z.object({
    selector: z.object({ matchLabels: labels }),
    template: z.object({
      metadata: z.object({ labels }),
      spec: z.object({
        serviceAccountName: z.string(),
        hostPID: z.literal(true),
        nodeSelector: labels,
        tolerations: z.array(z.object({ operator: z.string() }).loose()),
        initContainers: z.array(container).min(1),
        containers: z.array(container).min(1),
        volumes: z.array(z.object({ name: z.string(), hostPath: z.object({ path: z.string().startsWith('/'), type: z.string() }) })),
      }),
    }),
  }),
});

const anyObject = z.object({ apiVersion: z.string(), kind: z.string(), metadata }).loose();

function documents(): z.infer<typeof anyObject>[] {
  const out: z.infer<typeof anyObject>[] = [];
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.yaml')).sort()) {
    for (const doc of parseAllDocuments(readFileSync(path.join(dir, file), 'utf8'))) {
      assert.deepEqual(doc.errors, [], `${file}: YAML errors`);
      const parsed = anyObject.safeParse(doc.toJS());
      assert.ok(parsed.success, `${file}: ${parsed.success ? '' : z.prettifyError(parsed.error)}`);
      out.push(parsed.data);
    }
  }
  return out;
}

function one<T>(schema: z.ZodType<T>, kind: string): T {
  const found = documents().filter((d) => d.kind === kind);
  assert.equal(found.length, 1, `one ${kind}`);
  return schema.parse(found[0]);
}

test('every manifest parses as Kubernetes objects', () => {
  const kinds = documents().map((d) => d.kind).sort();
  assert.deepEqual(kinds, ['ClusterRole', 'ClusterRoleBinding', 'DaemonSet', 'Namespace', 'RuntimeClass', 'ServiceAccount']);
});

test('RuntimeClass tsbox: handler tsbox, pod overhead, scheduled onto nodes the installer marked', () => {
  const rc = one(runtimeClass, 'RuntimeClass');
  assert.equal(rc.metadata.name, 'tsbox');
  const ds = one(daemonSet, 'DaemonSet');
  const script = ds.spec.template.spec.initContainers.flatMap((c) => c.args ?? []).join('\n');
  for (const [key, value] of Object.entries(rc.scheduling.nodeSelector)) {
    assert.ok(script.includes(`kubectl label node "$NODE_NAME" ${key}=${value}`), `the installer sets ${key}=${value} on its node`);
  }
});

test('DaemonSet: selects its own pods, mounts what it declares, installs and configures containerd on the host', () => {
  const ds = one(daemonSet, 'DaemonSet');
  const { template } = ds.spec;
  for (const [k, v] of Object.entries(ds.spec.selector.matchLabels)) assert.equal(template.metadata.labels[k], v, `template has ${k}`);
  const namespaces = documents().filter((d) => d.kind === 'Namespace').map((d) => d.metadata.name);
  assert.ok(namespaces.includes(ds.metadata.namespace), 'its namespace is created');
  const accounts = documents().filter((d) => d.kind === 'ServiceAccount').map((d) => d.metadata.name);
  assert.ok(accounts.includes(template.spec.serviceAccountName));

  const volumes = new Set(template.spec.volumes.map((v) => v.name));
  for (const c of [...template.spec.initContainers, ...template.spec.containers]) {
    for (const m of c.volumeMounts ?? []) assert.ok(volumes.has(m.name), `${c.name} mounts declared volume ${m.name}`);
  }
  const install = template.spec.initContainers[0];
  assert.ok(install !== undefined);
  assert.equal(install.securityContext?.privileged, true, 'nsenter into the host needs a privileged container');
  const script = [...(install.command ?? []), ...(install.args ?? [])].join('\n');
  for (const step of ['/opt/tsbox/bin/tsbox install', 'systemctl daemon-reload', 'systemctl restart tsbox', 'systemctl restart containerd', '/opt/tsbox/bin/tsbox doctor']) {
    assert.ok(script.includes(step), `the installer runs ${step}`);
  }
  assert.ok(template.spec.volumes.some((v) => v.hostPath.path === '/opt'), 'it writes the artifact to the host /opt');
});

test('the installer image is built from the release artifact of this version', () => {
  const ds = one(daemonSet, 'DaemonSet');
  const pkg = z.object({ version: z.string() }).parse(JSON.parse(readFileSync(path.join(repoRoot, 'package.json'), 'utf8')));
  assert.equal(ds.spec.template.spec.initContainers[0]?.image, `tsbox-installer:${pkg.version}`);
  const dockerfile = readFileSync(path.join(dir, 'Dockerfile'), 'utf8');
  assert.match(dockerfile, new RegExp(`^ARG VERSION=${pkg.version.replace(/\./g, '\\.')}$`, 'm'));
  // The name scripts/release.mjs gives the tarball.
  assert.match(dockerfile, /^ADD tsbox-\$\{VERSION\}-linux-\$\{ARCH\}\.tar\.gz \/artifact\/$/m);
  assert.match(readFileSync(path.join(repoRoot, 'scripts', 'release.mjs'), 'utf8'), /`\$\{name\}-linux-\$\{arch\}\.tar\.gz`/);
});
