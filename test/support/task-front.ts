/**
 * The task front as the tests meet it: its program (native/tsbox-front.c, built into
 * dist/bin/tsbox-front), the bounds it is built with, read from its source so that a test and
 * the program cannot disagree, and the payload of its cancel request, which tsbox reads with
 * decodeCancel (src/ttrpc/front-link.ts).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** This file compiles to `<repo>/dist/test/support/`. */
const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** The front's program. */
export const tsboxFront = path.join(repoRoot, 'dist', 'bin', 'tsbox-front');

/**
 * A bound the front's source defines (`#define NAME expression`, of whole numbers, `*` and other
 * such names), as a number.
 */
export function frontBound(name: string): number {
  const source = readFileSync(path.join(repoRoot, 'native', 'tsbox-front.c'), 'utf8');
  const found = new RegExp(`^#define ${name} (.+)$`, 'm').exec(source);
  if (found?.[1] === undefined) throw new Error(`native/tsbox-front.c defines no ${name}`);
  const terms = found[1].replace(/[()]/g, ' ').split('*').map((t) => t.trim());
  return terms.reduce((product, term) => {
    if (/^\d+(u|ull)?$/.test(term)) return product * Number(term.replace(/u(ll)?$/, ''));
    if (/^[A-Z_]+$/.test(term)) return product * frontBound(term);
    throw new Error(`native/tsbox-front.c: ${name} is not a product of numbers: ${found[1]}`);
  }, 1);
}

/** Connections from containerd the front keeps at most. */
export const MAX_FRONT_CONNECTIONS = frontBound('MAX_FRONT_CONNECTIONS');

/** Bytes of calls the front keeps unanswered at most (whole frames, headers included). */
export const MAX_PENDING_BYTES = frontBound('MAX_PENDING_BYTES');

/** A cancel request's payload: each stream id as 4 bytes, big-endian. */
export function cancelPayload(streamIds: Iterable<number>): Buffer {
  const ids = [...streamIds];
  const payload = Buffer.alloc(4 * ids.length);
  ids.forEach((id, i) => payload.writeUInt32BE(id, 4 * i));
  return payload;
}
