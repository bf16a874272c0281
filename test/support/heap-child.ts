/**
 * A process whose heap the heap census tests look at (test/unit/heap-census.test.ts): each line
 * on stdin is a command, answered with "done" on stdout once carried out.
 *   hold N  — keeps N new strings in an array
 *   named N — keeps N new objects, each with a property name of its own (a hidden class each)
 *   lazy N  — compiles N functions and then runs each once, keeping the functions but nothing
 *             they made: their bodies, and the property names in them, are compiled on that
 *             first run, as a daemon's code is when a request first takes a path
 */
import { randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import { runInThisContext } from 'node:vm';

const held: unknown[] = [];

for await (const line of createInterface({ input: process.stdin })) {
  const [command, count] = line.split(' ');
  const n = Number(count);
  if (command === 'hold') {
    for (let i = 0; i < n; i++) held.push(`held ${i} ${randomUUID()}`);
  } else if (command === 'named') {
    const nonce = randomUUID().replaceAll('-', '');
    for (let i = 0; i < n; i++) held.push({ [`p_${i}_${nonce}`]: i });
  } else if (command === 'lazy') {
    const nonce = randomUUID().replaceAll('-', '');
    const fns = Array.from({ length: n }, (_, i) => runInThisContext(`(function () { return Object.keys({ k_${i}_${nonce}: 1 }).length; })`) as () => number);
    held.push(fns);
    let keys = 0;
    for (const fn of fns) keys += fn();
    if (keys !== n) throw new Error(`ran ${keys} of ${n} functions`);
  } else {
    throw new Error(`unknown command: ${line}`);
  }
  process.stdout.write('done\n');
}
