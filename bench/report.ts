/**
 * Turns the control-plane part of a bench run into one table (median, min–max, tsbox/goref)
 * and a JSON file. These figures are information: what a node feels is in the pod benchmark
 * (bench/pods.ts), through CRI against containerd's podsandbox.
 *
 *   node dist/bench/report.js --compare runs.jsonl --real-work real-work.json --json out.json --machine "..."
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: { compare: { type: 'string' }, 'real-work': { type: 'string' }, json: { type: 'string' }, machine: { type: 'string' } },
});

type Run = Record<string, unknown> & { label?: string; scenario?: string; kind?: string };
const runs: Run[] = readFileSync(values.compare ?? '', 'utf8')
  .trim()
  .split('\n')
  .filter((l) => l !== '')
  .map((l) => JSON.parse(l) as Run);
const realWork = values['real-work'] === undefined ? {} : (JSON.parse(readFileSync(values['real-work'], 'utf8')) as Record<string, number>);

const get = (run: Run, path: string): number | undefined => {
  let v: unknown = run;
  for (const key of path.split('.')) v = (v as Record<string, unknown> | undefined)?.[key];
  return typeof v === 'number' ? v : undefined;
};

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

interface Figure {
  readonly name: string;
  readonly select: (r: Run) => boolean;
  readonly value: (r: Run) => number | undefined;
}

const is = (scenario: string, concurrency?: number, conns = 1) => (r: Run) =>
  r.scenario === scenario && (concurrency === undefined || r['concurrency'] === concurrency) && (r['conns'] ?? 1) === conns;

const figures: Figure[] = [
  { name: 'status c=1: requests/s', select: is('status', 1), value: (r) => get(r, 'rps') },
  { name: 'status c=1: p50 µs', select: is('status', 1), value: (r) => get(r, 'latency.p50_us') },
  { name: 'status c=1: server CPU µs/RPC', select: is('status', 1), value: (r) => get(r, 'server.cpu_us_per_op') },
  { name: 'status c=16: requests/s', select: is('status', 16), value: (r) => get(r, 'rps') },
  { name: 'status c=16: server CPU µs/RPC', select: is('status', 16), value: (r) => get(r, 'server.cpu_us_per_op') },
  { name: 'status c=64×4 conns: requests/s', select: is('status', 64, 4), value: (r) => get(r, 'rps') },
  { name: 'lifecycle c=16: lifecycles/s', select: is('lifecycle', 16), value: (r) => get(r, 'lifecycles_per_s') },
  { name: 'lifecycle c=16: server CPU µs/lifecycle', select: is('lifecycle', 16), value: (r) => get(r, 'server.cpu_us_per_op') },
  { name: 'waitfanout: first Stop → last Wait, ms', select: is('waitfanout'), value: (r) => get(r, 'first_stop_to_last_wait_ms') },
  {
    name: 'waitfanout: RSS per pending Wait, KiB',
    select: is('waitfanout'),
    value: (r) => {
      const a = get(r, 'server.rss_kb_sandboxes_created');
      const b = get(r, 'server.rss_kb_waits_pending');
      const n = get(r, 'total_waits');
      return a === undefined || b === undefined || !n ? undefined : (b - a) / n;
    },
  },
  {
    name: 'waitfanout: RSS after release / before, ratio',
    select: is('waitfanout'),
    value: (r) => {
      const a = get(r, 'server.rss_kb_sandboxes_created');
      const b = get(r, 'server.rss_kb_waits_returned');
      return a === undefined || b === undefined ? undefined : b / a;
    },
  },
  { name: 'idle RSS at start, MiB', select: (r) => r.kind === 'server_start', value: (r) => (get(r, 'rss_kb_idle') ?? NaN) / 1024 },
];

interface Row {
  name: string;
  goref?: { median: number; min: number; max: number };
  tsbox?: { median: number; min: number; max: number };
  ratio?: number;
}

const rows: Row[] = figures.map((f) => {
  const row: Row = { name: f.name };
  for (const label of ['goref', 'tsbox'] as const) {
    const xs = runs.filter((r) => r.label === label && f.select(r)).map(f.value).filter((v): v is number => v !== undefined && Number.isFinite(v));
    if (xs.length > 0) row[label] = { median: median(xs), min: Math.min(...xs), max: Math.max(...xs) };
  }
  if (row.goref && row.tsbox && row.goref.median !== 0) row.ratio = row.tsbox.median / row.goref.median;
  return row;
});

const fmt = (n: number | undefined): string =>
  n === undefined || !Number.isFinite(n) ? '–' : Math.abs(n) >= 100 ? n.toFixed(0) : Math.abs(n) >= 10 ? n.toFixed(1) : n.toFixed(2);
const cell = (s?: { median: number; min: number; max: number }): string => (s ? `${fmt(s.median)} (${fmt(s.min)}–${fmt(s.max)})` : '–');

const lines: string[] = [];
lines.push(`tsbox benchmark — ${new Date().toISOString().slice(0, 10)} — ${values.machine ?? ''}`);
lines.push('');
lines.push('| figure (control plane, noop backend) | goref | tsbox | tsbox/goref |');
lines.push('|---|---:|---:|---:|');
for (const r of rows) lines.push(`| ${r.name} | ${cell(r.goref)} | ${cell(r.tsbox)} | ${fmt(r.ratio)} |`);
lines.push('');
lines.push('| real work (process backend) | tsbox |');
lines.push('|---|---:|');
for (const [k, v] of Object.entries(realWork)) lines.push(`| ${k} | ${fmt(v)} |`);
process.stdout.write(`${lines.join('\n')}\n`);
if (values.json !== undefined) {
  writeFileSync(values.json, `${JSON.stringify({ date: new Date().toISOString(), machine: values.machine, rows, realWork }, null, 2)}\n`);
}
