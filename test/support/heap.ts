/**
 * A census of a Node process's heap, for the tests that check what a daemon keeps: the process
 * runs with `--heapsnapshot-signal=SIGUSR2 --diagnostic-dir=DIR`, SIGUSR2 makes it write a V8
 * heap snapshot there (after a full garbage collection, so only what is still reachable is in
 * it), and the census counts the objects the program holds by kind: node type and constructor
 * name.
 */
import { readFileSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { waitFor } from './processes.js';

/** Node flags that make a Node process write a heap snapshot into `dir` on SIGUSR2. */
export function heapSnapshotFlags(dir: string): string[] {
  return ['--heapsnapshot-signal=SIGUSR2', `--diagnostic-dir=${dir}`];
}

export interface HeapCensus {
  /** Objects and bytes (self sizes) by kind, `type:name` (strings counted as one kind each type). */
  readonly kinds: ReadonlyMap<string, { count: number; bytes: number }>;
  /** Self sizes of every counted object. */
  readonly bytes: number;
  /** The snapshot ids of the objects of each kind (V8 keeps an object's id across snapshots). */
  readonly ids: ReadonlyMap<string, readonly number[]>;
  /**
   * For failure messages: what object `id` is, by its properties and what holds it (the
   * names of the edges to and from it, a few levels up).
   */
  explain(id: number): string;
}

/**
 * V8's own bookkeeping, left out: compiled code, hidden and synthetic nodes (roots, internal
 * structures) and object shapes (maps), which grow and shrink with what was optimised, not
 * with what the program keeps.
 */
const UNCOUNTED = new Set(['code', 'hidden', 'synthetic', 'object shape']);
const STRING_TYPES = new Set(['string', 'concatenated string', 'sliced string']);
/** The synthetic root of V8's string table in a heap snapshot. */
const STRING_TABLE = '(Internalized strings)';

interface Snapshot {
  snapshot: { meta: { node_fields: string[]; node_types: [string[], ...unknown[]]; edge_fields: string[]; edge_types: [string[], ...unknown[]] } };
  nodes: number[];
  edges: number[];
  strings: string[];
}

/** The census of one `.heapsnapshot` file. */
export function censusOf(text: string): HeapCensus {
  const snap = JSON.parse(text) as Snapshot;
  const fields = snap.snapshot.meta.node_fields;
  const types = snap.snapshot.meta.node_types[0];
  const stride = fields.length;
  const [typeAt, nameAt, sizeAt] = ['type', 'name', 'self_size'].map((f) => fields.indexOf(f)) as [number, number, number];
  const idAt = fields.indexOf('id');
  const held = heldByProgram(snap);
  const kinds = new Map<string, { count: number; bytes: number }>();
  const ids = new Map<string, number[]>();
  let bytes = 0;
  for (let i = 0; i < snap.nodes.length; i += stride) {
    const type = types[snap.nodes[i + typeAt] as number] ?? '?';
    if (UNCOUNTED.has(type) || held[i / stride] === 0) continue;
    const size = snap.nodes[i + sizeAt] as number;
    const kind = STRING_TYPES.has(type) ? type : `${type}:${snap.strings[snap.nodes[i + nameAt] as number] ?? '?'}`;
    const k = kinds.get(kind) ?? { count: 0, bytes: 0 };
    k.count += 1;
    k.bytes += size;
    kinds.set(kind, k);
    let list = ids.get(kind);
    if (list === undefined) ids.set(kind, (list = []));
    list.push(snap.nodes[i + idAt] as number);
    bytes += size;
  }
  return { kinds, bytes, ids, explain: (id) => explainNode(snap, id) };
}

/** Where each node's edges start in `edges` (one more entry: the end of the last node's). */
function firstEdges(snap: Snapshot): Uint32Array {
  const stride = snap.snapshot.meta.node_fields.length;
  const edgeCountAt = snap.snapshot.meta.node_fields.indexOf('edge_count');
  const edgeStride = snap.snapshot.meta.edge_fields.length;
  const count = snap.nodes.length / stride;
  const first = new Uint32Array(count + 1);
  for (let n = 0; n < count; n++) first[n + 1] = (first[n] as number) + (snap.nodes[n * stride + edgeCountAt] as number) * edgeStride;
  return first;
}

/**
 * The objects the program holds: reachable from the snapshot's root by strong edges without
 * passing through V8's own bookkeeping, which grows as more code warms up, not with the pods:
 * compiled code and its feedback (whose allocation sites keep the first object made at each
 * site), object shapes (the property names of every hidden class made so far) and the string
 * table ("(Internalized strings)": every name and literal the code has met, lazily compiled
 * functions adding theirs when they first run). What the program keeps is still counted: its
 * objects are reached from its own, and a string it holds is too.
 */
function heldByProgram(snap: Snapshot): Uint8Array {
  const fields = snap.snapshot.meta.node_fields;
  const stride = fields.length;
  const edgeStride = snap.snapshot.meta.edge_fields.length;
  const edgeTypes = snap.snapshot.meta.edge_types[0];
  const types = snap.snapshot.meta.node_types[0];
  const typeAt = fields.indexOf('type');
  const [edgeTypeAt, toAt] = ['type', 'to_node'].map((f) => snap.snapshot.meta.edge_fields.indexOf(f)) as [number, number];
  const weak = edgeTypes.indexOf('weak');
  const code = types.indexOf('code');
  const synthetic = types.indexOf('synthetic');
  const shape = types.indexOf('object shape');
  const nameAt = fields.indexOf('name');
  const count = snap.nodes.length / stride;
  const firstEdge = firstEdges(snap);
  const held = new Uint8Array(count);
  const queue = [0];
  held[0] = 1;
  while (queue.length > 0) {
    const n = queue.pop() as number;
    const type = snap.nodes[n * stride + typeAt];
    if (type === code || type === shape) continue;
    if (type === synthetic && snap.strings[snap.nodes[n * stride + nameAt] as number] === STRING_TABLE) continue;
    for (let e = firstEdge[n] as number; e < (firstEdge[n + 1] as number); e += edgeStride) {
      if (snap.edges[e + edgeTypeAt] === weak) continue;
      const to = (snap.edges[e + toAt] as number) / stride;
      if (held[to] === 0) {
        held[to] = 1;
        queue.push(to);
      }
    }
  }
  return held;
}

/** Object `id` of a snapshot: its own edges' names, and a chain of what holds it. */
function explainNode(snap: Snapshot, id: number): string {
  const fields = snap.snapshot.meta.node_fields;
  const stride = fields.length;
  const edgeStride = snap.snapshot.meta.edge_fields.length;
  const edgeTypes = snap.snapshot.meta.edge_types[0];
  const [typeAt, nameAt, idAt, edgeCountAt] = ['type', 'name', 'id', 'edge_count'].map((f) => fields.indexOf(f)) as [number, number, number, number];
  const types = snap.snapshot.meta.node_types[0];
  // Every edge's source node (its offset in `nodes`).
  const firstEdge = firstEdges(snap);
  const from = new Int32Array(snap.edges.length / edgeStride);
  for (let n = 0; n < firstEdge.length - 1; n++) {
    for (let e = firstEdge[n] as number; e < (firstEdge[n + 1] as number); e += edgeStride) from[e / edgeStride] = n * stride;
  }
  const label = (n: number): string => `${types[snap.nodes[n + typeAt] as number] ?? '?'} ${String(snap.strings[snap.nodes[n + nameAt] as number] ?? '?').slice(0, 60)}`;
  const edgeName = (e: number): string => {
    const type = edgeTypes[snap.edges[e] as number] ?? '?';
    const nameOrIndex = snap.edges[e + 1] as number;
    return type === 'element' || type === 'hidden' ? `[${nameOrIndex}]` : String(snap.strings[nameOrIndex] ?? '?');
  };
  let node = -1;
  for (let n = 0; n < snap.nodes.length; n += stride) if (snap.nodes[n + idAt] === id) node = n;
  if (node < 0) return `@${id}: gone`;
  const own: string[] = [];
  const start = firstEdge[node / stride] as number;
  for (let k = 0; k < Math.min(12, snap.nodes[node + edgeCountAt] as number); k++) own.push(edgeName(start + k * edgeStride));
  // Up the first retainer that is not a weak or shortcut edge, four levels.
  const chain: string[] = [];
  for (let n = node, level = 0; level < 4; level++) {
    let holder = -1;
    for (let e = 0; e < snap.edges.length; e += edgeStride) {
      if (snap.edges[e + 2] !== n) continue;
      const type = edgeTypes[snap.edges[e] as number];
      if (type === 'weak' || type === 'shortcut') continue;
      holder = e;
      break;
    }
    if (holder < 0) break;
    n = from[holder / edgeStride] as number;
    chain.push(`${edgeName(holder)} of ${label(n)}`);
  }
  return `@${id} ${label(node)} {${own.join(', ')}} held as ${chain.join(' <- ') || 'nothing'}`;
}

/**
 * Makes process `pid` write a heap snapshot into `dir` (its `--diagnostic-dir`), waits until
 * the snapshot is whole, and returns its census; the file is removed.
 */
export async function takeHeapCensus(pid: number, dir: string): Promise<HeapCensus> {
  const snapshots = (): string[] => readdirSync(dir).filter((f) => f.endsWith('.heapsnapshot'));
  const earlier = new Set(snapshots());
  process.kill(pid, 'SIGUSR2');
  // The process writes the file in pieces; it is whole when it parses.
  const census = await waitFor(
    () => {
      const file = snapshots().find((f) => !earlier.has(f));
      if (file === undefined) return undefined;
      try {
        const c = censusOf(readFileSync(path.join(dir, file), 'utf8'));
        rmSync(path.join(dir, file));
        return c;
      } catch (err) {
        if (err instanceof SyntaxError) return undefined; // still being written
        throw err;
      }
    },
    { what: `a heap snapshot of process ${pid} in ${dir}`, timeoutMs: 120_000, intervalMs: 200 },
  );
  return census;
}

/** What grew between two censuses, most objects first. */
export function heapGrowth(before: HeapCensus, after: HeapCensus): { kind: string; count: number; bytes: number }[] {
  const out: { kind: string; count: number; bytes: number }[] = [];
  for (const [kind, a] of after.kinds) {
    const b = before.kinds.get(kind) ?? { count: 0, bytes: 0 };
    if (a.count !== b.count || a.bytes !== b.bytes) out.push({ kind, count: a.count - b.count, bytes: a.bytes - b.bytes });
  }
  for (const [kind, b] of before.kinds) if (!after.kinds.has(kind)) out.push({ kind, count: -b.count, bytes: -b.bytes });
  return out.sort((x, y) => y.count - x.count || y.bytes - x.bytes);
}
