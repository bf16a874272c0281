/**
 * The command line: the operator commands parse into what main runs, help lists the exit
 * codes, and the bash completion generated from the program completes real commands.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { describe, test } from 'node:test';
import { UsageError, parseCommand } from '../../src/cli/cli.js';

describe('sandbox commands', () => {
  test('run with id, hostname, labels and a command after --', () => {
    const c = parseCommand(['sandbox', 'run', '--id', 'a1', '--hostname', 'h', '--label', 'a=1', '--label', 'b=2', '-n', 'ns1', '--address', '/x/c.sock', '--', 'sh', '-c', 'echo hi']);
    assert.equal(c.kind, 'sandbox');
    assert.ok(c.kind === 'sandbox');
    assert.deepEqual(c.target, { address: '/x/c.sock', namespace: 'ns1' });
    assert.deepEqual(c.action, { op: 'run', options: { id: 'a1', hostname: 'h', labels: { a: '1', b: '2' }, command: ['sh', '-c', 'echo hi'] } });
  });

  test("defaults are containerd's: its socket and the namespace default", () => {
    const c = parseCommand(['sandbox', 'ls']);
    assert.ok(c.kind === 'sandbox');
    assert.deepEqual(c.target, { address: '/run/containerd/containerd.sock', namespace: 'default' });
    assert.deepEqual(c.action, { op: 'ls', json: false });
  });

  test('rm takes many ids and --force; stop a --timeout in whole seconds', () => {
    const rm = parseCommand(['sandbox', 'rm', '-f', 'a', 'b']);
    assert.ok(rm.kind === 'sandbox');
    assert.deepEqual(rm.action, { op: 'rm', ids: ['a', 'b'], force: true });
    const stop = parseCommand(['sandbox', 'stop', 'a', '--timeout', '3']);
    assert.ok(stop.kind === 'sandbox');
    assert.deepEqual(stop.action, { op: 'stop', id: 'a', timeoutSeconds: 3 });
    assert.throws(() => parseCommand(['sandbox', 'stop', 'a', '--timeout', 'soon']), UsageError);
    assert.throws(() => parseCommand(['sandbox', 'inspect']), UsageError);
  });

  test('help lists the exit codes', () => {
    const help = parseCommand(['sandbox', '--help']);
    assert.ok(help.kind === 'help');
    assert.match(help.text, /Exit codes:\n {2}0 {3}done/);
    assert.match(help.text, /3 {3}containerd is not running at --address/);
  });
});

describe('bash completion', () => {
  const completion = parseCommand(['completion', 'bash']);
  assert.ok(completion.kind === 'completion');
  /** What bash completes for the words typed so far (the last one being completed). */
  function complete(...words: string[]): string[] {
    const script = `${completion.kind === 'completion' ? completion.text : ''}
COMP_WORDS=(tsbox ${words.map((w) => `'${w}'`).join(' ')}); COMP_CWORD=${words.length}
_tsbox_complete; printf '%s\\n' "\${COMPREPLY[@]}"`;
    const r = spawnSync('bash', ['-c', script], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    return r.stdout.split('\n').filter(Boolean).sort();
  }

  test('completes commands, subcommands and their options', () => {
    assert.deepEqual(complete('sa'), ['sandbox', 'sandboxes']);
    assert.deepEqual(complete('sandbox', 'i'), ['inspect']);
    assert.ok(complete('sandbox', 'rm', '--').includes('--force'));
    assert.ok(complete('sandbox', 'ls', '-').includes('--namespace'));
    assert.ok(complete('serve', '--so').includes('--socket'));
    assert.ok(!complete('serve', '--').includes('--shim-path'), 'hidden options stay hidden');
  });
});
