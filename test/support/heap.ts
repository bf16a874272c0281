/**
 * A census of a Node process's heap, for the tests that check what a daemon keeps: the process
 * runs with `--heapsnapshot-signal=SIGUSR2 --diagnostic-dir=DIR`, SIGUSR2 makes it write a V8
 * heap snapshot there (after a full garbage collection, so only what is still reachable is in
 * it), and the census counts the snapshot's objects by kind: node type and constructor name.
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
}

/**
 * V8's own bookkeeping, left out: compiled code, hidden and synthetic nodes (roots, internal
 * structures) and object shapes (maps), which grow and shrink with what was optimised, not
 * with what the program keeps.
 */
const UNCOUNTED = new Set(['code', 'hidden', 'synthetic', 'object shape']);
const STRING_TYPES = new Set(['string', 'concatenated string', 'sliced string']);

interface Snapshot {
  snapshot: { meta: { node_fields: string[]; node_types: [string[], ...unknown[]] } };
  nodes: number[];
  strings: string[];
}

/** The census of one `.heapsnapshot` file. */
export function censusOf(text: string): HeapCensus {
  const snap = JSON.parse(text) as Snapshot;
  const fields = snap.snapshot.meta.node_fields;
  const types = snap.snapshot.meta.node_types[0];
  const stride = fields.length;
  const [typeAt, nameAt, sizeAt] = ['type', 'name', 'self_size'].map((f) => fields.indexOf(f)) as [number, number, number];
  const kinds = new Map<string, { count: number; bytes: number }>();
  let bytes = 0;
  for (let i = 0; i < snap.nodes.length; i += stride) {
    const type = types[snap.nodes[i + typeAt] as number] ?? '?';
    if (UNCOUNTED.has(type)) continue;
    const size = snap.nodes[i + sizeAt] as number;
    const kind = STRING_TYPES.has(type) ? type : `${type}:${snap.strings[snap.nodes[i + nameAt] as number] ?? '?'}`;
    const k = kinds.get(kind) ?? { count: 0, bytes: 0 };
    k.count += 1;
    k.bytes += size;
    kinds.set(kind, k);
    bytes += size;
  }
  return { kinds, bytes };
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
