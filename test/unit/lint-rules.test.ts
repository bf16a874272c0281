// The repository's own lint rule against errors dropped in silence (eslint.config.js), run
// through ESLint on snippets: the bare forms fail lint; the same code with a comment saying
// why, or with ignoreError('why'), passes.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ESLint } from 'eslint';
import { repoRoot } from '../support/containerd-clients.js';

async function silentCatches(code: string): Promise<number[]> {
  const eslint = new ESLint({ cwd: repoRoot });
  const [result] = await eslint.lintText(`export const f = async (p, ignoreError) => {\n${code}\n};\n`, { filePath: 'scripts/probe.mjs' });
  return (result?.messages ?? []).filter((m) => m.ruleId === 'tsbox/no-silent-catch').map((m) => m.line - 1);
}

test('a catch or rejection handler that drops its error without a word fails lint', async () => {
  const bare = [
    'try { await p; } catch { return 1; }',
    'try { await p; } catch (_err) { return 2; }',
    'await p.catch(() => undefined);',
    'await p.catch(() => {});',
    'await p.then(() => 1, () => 0);',
  ];
  assert.deepEqual(await silentCatches(bare.join('\n')), [1, 2, 3, 4, 5]);
});

test('the same with a reason, or using the error, passes', async () => {
  const explained = [
    'try { await p; } catch {\n  // the file may be gone: nothing to do\n  return 1;\n}',
    'try { await p; } catch (err) { console.log(err); }',
    "await p.catch(ignoreError('the notice may already be gone'));",
    'await p.catch(() => /* the caller retries */ undefined);',
    '// Either answer will do here.\nawait p.catch(() => undefined);',
  ];
  assert.deepEqual(await silentCatches(explained.join('\n')), []);
});
