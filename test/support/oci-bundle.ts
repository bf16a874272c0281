/**
 * OCI bundles and CRI-style FIFOs for the tests that drive runc directly (the container holder,
 * the Task API server): a bundle made by `runc spec` running a command of Debian's static
 * busybox, and FIFOs read as CRI reads a container's output.
 */
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/**
 * An OCI bundle at `dir` running `args` with PATH=/bin; `root` is the config's root.path
 * (absolute, or relative to the bundle); `edit` may change the config before it is written.
 */
export function makeBundle(dir: string, root: string, args: string[], edit: (config: Record<string, unknown>) => void = () => undefined): string {
  mkdirSync(dir, { recursive: true });
  execFileSync('runc', ['spec', '--bundle', dir]);
  const config = JSON.parse(readFileSync(path.join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  config['root'] = { path: root, readonly: true };
  config['process'] = { ...(config['process'] as object), args, terminal: false, env: ['PATH=/bin'] };
  edit(config);
  writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config));
  return dir;
}

/** A FIFO at `p` (mode 0600), as CRI makes a container's stdio. */
export function makeFifo(p: string): string {
  execFileSync('mkfifo', ['-m', '0600', p]);
  return p;
}

/** Everything written to a FIFO until its last writer closes (as CRI's reader sees it). */
export function readFifo(p: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const cat = spawn('cat', [p], { stdio: ['ignore', 'pipe', 'inherit'] });
    let text = '';
    cat.stdout.setEncoding('utf8').on('data', (chunk: string) => (text += chunk));
    cat.once('error', reject);
    cat.once('close', () => resolve(text));
  });
}
