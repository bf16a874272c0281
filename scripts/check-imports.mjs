// Checks that layers import one way (DESIGN.md, "Layers"): main.ts and daemon.ts → cli, ops,
// config, metrics, containerd's clients → transport, ttrpc, tasks → controller → its
// interfaces, which state and runtime implement; base, under all of them, imports no other part
// of tsbox. The controller and state layers must not reach into transports or child processes,
// and nothing may import upward. Exits 1 on a violation.
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const src = join(root, 'src');

// The entry and the composition root, the two files at the top of src/: no layer imports them.
const ENTRY = ['daemon.ts', 'main.ts'];
// The command line, the configuration and the metrics, and the daemon's clients of containerd:
// what the entry and the composition root wire, above every layer that serves an RPC.
const EDGE = ['cli', 'config', 'metrics', 'containerd'];

// For each layer: the packages (banned), folders (bannedDirs) and root files (bannedFiles) it
// must not import, or the only folders it may import (onlyDirs); onlyFrom names, for a folder,
// the only files the layer may take from it.
const RULES = [
  // Errors, the root logger, file calls made at once, the serial queue: what every layer uses.
  { layer: 'base', banned: ['@grpc/grpc-js', 'node:child_process'], onlyDirs: ['base'] },
  // tsbox's configuration, what it reads of containerd's config and paths, and which handlers
  // take the Task API route: read once at the edge, a frozen object flows inward.
  { layer: 'config', banned: ['@grpc/grpc-js', 'node:child_process'], onlyDirs: ['config', 'base'] },
  // The command line: parsing is pure (it returns a Command and runs nothing).
  {
    layer: 'cli',
    banned: ['@grpc/grpc-js', 'node:child_process'],
    bannedDirs: ['controller', 'state', 'transport', 'ttrpc', 'tasks', 'metrics', 'containerd', 'gen'],
    bannedFiles: ENTRY,
    onlyFrom: { runtime: ['runtime/systemd.ts'] },
  },
  // Prometheus metrics and their HTTP endpoint: wrap the controller's interfaces, listen
  // through the transport's socket handling.
  {
    layer: 'metrics',
    banned: ['node:child_process'],
    bannedDirs: ['runtime', 'state', 'ttrpc', 'tasks', 'ops', 'cli', 'containerd', 'gen'],
    bannedFiles: ENTRY,
    onlyFrom: { controller: ['controller/types.ts', 'controller/controller.ts'], transport: ['transport/socket.ts'], config: ['config/config.ts'] },
  },
  // The daemon's clients of containerd's own socket (its event bus, CRI's RuntimeService): each
  // implements an interface of the layer it serves and knows nothing else of it.
  {
    layer: 'containerd',
    banned: ['node:child_process'],
    bannedDirs: ['transport', 'ttrpc', 'runtime', 'state', 'ops', 'cli', 'config', 'metrics'],
    bannedFiles: ENTRY,
    onlyFrom: { controller: ['controller/types.ts'], tasks: ['tasks/tasks.ts'] },
  },
  // The operator's commands (doctor, install, the sandbox commands), which the command line
  // parses and the entry runs.
  { layer: 'ops', banned: [], bannedDirs: ['cli'], bannedFiles: ENTRY },
  { layer: 'controller', banned: ['@grpc/grpc-js', 'node:child_process', 'node:fs', 'node:fs/promises', 'node:net', 'pino-pretty'], bannedDirs: ['transport', 'runtime', 'state', 'gen', ...EDGE], bannedFiles: ENTRY },
  { layer: 'state', banned: ['@grpc/grpc-js', 'node:child_process'], bannedDirs: ['transport', 'runtime', 'gen', ...EDGE], bannedFiles: ENTRY },
  { layer: 'runtime', banned: ['@grpc/grpc-js'], bannedDirs: ['transport', ...EDGE], bannedFiles: ENTRY },
  { layer: 'transport', banned: ['node:child_process'], bannedDirs: ['runtime', 'state', ...EDGE], bannedFiles: ENTRY },
  // The ttrpc transport is a protocol layer beside the gRPC one: it takes from the gRPC side
  // only the error mapping, the socket handling and the shared limits, and knows nothing of
  // what it serves.
  {
    layer: 'ttrpc',
    banned: ['@grpc/grpc-js', 'node:child_process', 'node:http2'],
    bannedDirs: ['controller', 'runtime', 'state', 'ops', ...EDGE],
    bannedFiles: ENTRY,
    onlyFrom: { transport: ['transport/status.ts', 'transport/socket.ts', 'transport/limits.ts'], gen: ['gen/ttrpc/', 'gen/google/'] },
  },
  // The Task API server: the task table over the container holders, served through the ttrpc
  // layer. It takes from the controller only its types, clock and identifier rule, and
  // reaches containerd (the event bus) through what the daemon hands it.
  {
    layer: 'tasks',
    banned: ['@grpc/grpc-js', 'node:http2'],
    bannedDirs: ['transport', 'state', 'ops', ...EDGE],
    bannedFiles: ENTRY,
    onlyFrom: { controller: ['controller/types.ts', 'controller/clock.ts', 'controller/identifiers.ts'] },
  },
];

function walk(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? walk(path) : path.endsWith('.ts') ? [path] : [];
  });
}

const problems = [];
for (const file of walk(src)) {
  const rel = relative(src, file);
  const layer = rel.split('/')[0];
  const rule = RULES.find((r) => r.layer === layer);
  const text = readFileSync(file, 'utf8');
  for (const match of text.matchAll(/^\s*(?:import|export)\s[^'"]*?from\s+['"]([^'"]+)['"]/gm)) {
    const spec = match[1];
    if (spec.startsWith('.')) {
      const target = relative(src, resolve(dirname(file), spec));
      const targetTop = target.split('/')[0];
      if (target.startsWith('..')) problems.push(`${rel}: imports ${spec}, outside src/`);
      // The controller reads Kubernetes' PodSandboxConfig, which reaches it as the bytes of an
      // Any: the generated CRI messages (gen/runtime/) are how it decodes them, and all it may
      // take from gen/.
      const criMessages = layer === 'controller' && target.startsWith('gen/runtime/');
      const targetFile = target.replace(/\.js$/, '.ts');
      if (rule && !criMessages && (rule.bannedDirs?.includes(targetTop) || rule.bannedFiles?.includes(targetFile))) {
        if (!(layer === 'controller' && targetTop === 'controller')) problems.push(`${rel}: the ${layer} layer must not import ${spec}`);
      }
      // A layer that may import only some folders (a root file, daemon.ts or main.ts, is none).
      if (rule?.onlyDirs && !target.startsWith('..') && !rule.onlyDirs.includes(targetTop)) {
        problems.push(`${rel}: the ${layer} layer may import only from ${rule.onlyDirs.map((d) => `${d}/`).join(', ')}, not ${spec}`);
      }
      // A folder the layer may take only some files from (each entry a file, or a folder ending in /).
      const allowed = rule?.onlyFrom?.[targetTop];
      if (allowed && !allowed.some((a) => (a.endsWith('/') ? targetFile.startsWith(a) : targetFile === a))) {
        problems.push(`${rel}: the ${layer} layer may import from ${targetTop}/ only ${allowed.join(', ')}, not ${spec}`);
      }
    } else if (rule && rule.banned.includes(spec)) {
      problems.push(`${rel}: the ${layer} layer must not import ${spec}`);
    }
  }
}

// Import cycles between files.
const graph = new Map();
for (const file of walk(src)) {
  const deps = [];
  for (const match of readFileSync(file, 'utf8').matchAll(/^\s*import\s(?!type\s)[^'"]*?from\s+['"](\.[^'"]+)['"]/gm)) {
    deps.push(resolve(dirname(file), match[1]).replace(/\.js$/, '.ts'));
  }
  graph.set(file, deps);
}
const state = new Map();
const stack = [];
function visit(node) {
  state.set(node, 'open');
  stack.push(node);
  for (const dep of graph.get(node) ?? []) {
    if (state.get(dep) === 'open') {
      const cycle = stack.slice(stack.indexOf(dep)).map((f) => relative(src, f));
      problems.push(`import cycle: ${[...cycle, relative(src, dep)].join(' → ')}`);
    } else if (!state.has(dep)) visit(dep);
  }
  stack.pop();
  state.set(node, 'done');
}
for (const node of graph.keys()) if (!state.has(node)) visit(node);

if (problems.length > 0) {
  console.error(`import boundaries violated:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
  process.exit(1);
}
console.log(`import boundaries ok (${graph.size} files)`);
