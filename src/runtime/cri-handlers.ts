import { accessSync, constants, existsSync, readFileSync, readdirSync } from 'node:fs';
import { basename, dirname, isAbsolute, join, resolve } from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { messageOf } from '../errors.js';

/**
 * The CRI runtime handlers of a containerd config that put pods on a sandboxer, and whether
 * their `runtime_type` names a shim binary that exists. containerd runs that shim itself for
 * the pods' containers when the sandboxer answers a version-2 task endpoint (SPEC.md section
 * 7), so a handler whose shim does not exist can run pods but no container in them.
 */

/** containerd's rule: `io.containerd.runc.v2` is the binary `containerd-shim-runc-v2`; a path is the binary itself. */
export function shimBinaryName(runtimeType: string): string {
  if (isAbsolute(runtimeType)) return runtimeType;
  const parts = runtimeType.split('.');
  const tail = parts[0] === 'io' && parts[1] === 'containerd' ? parts.slice(2) : parts;
  return `containerd-shim-${tail.join('-')}`;
}

/** The absolute path of a shim binary, searched on PATH as containerd does, or undefined. */
export function findShimBinary(runtimeType: string, path = process.env['PATH'] ?? ''): string | undefined {
  const name = shimBinaryName(runtimeType);
  const candidates = isAbsolute(name) ? [name] : path.split(':').filter((d) => d !== '').map((d) => join(d, name));
  for (const candidate of candidates) {
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here: next directory
    }
  }
  return undefined;
}

/** One CRI runtime handler whose sandboxer is the one asked about. */
export interface SandboxerHandler {
  readonly name: string;
  readonly runtimeType: string;
  /** Where the shim binary is, or undefined when none exists. */
  readonly shim: string | undefined;
  /** The config file that defines it. */
  readonly file: string;
}

type Table = Record<string, unknown>;
const table = (v: unknown): Table | undefined => (typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Table) : undefined);

/** containerd's `imports`: paths relative to the importing file, `*` globs in the last part. */
function expandImports(file: string, imports: unknown): string[] {
  if (!Array.isArray(imports)) return [];
  const out: string[] = [];
  for (const entry of imports) {
    if (typeof entry !== 'string') continue;
    const full = resolve(dirname(file), entry);
    if (!full.includes('*')) {
      out.push(full);
      continue;
    }
    const pattern = new RegExp(`^${basename(full).replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*')}$`);
    try {
      for (const name of readdirSync(dirname(full)).sort()) if (pattern.test(name)) out.push(join(dirname(full), name));
    } catch {
      // the import directory does not exist: containerd skips it too
    }
  }
  return out;
}

/**
 * The handlers with `sandboxer = <sandboxer>` in containerd's config file and its imports
 * (config versions 2 and 3). Throws with the file and reason when a file cannot be parsed.
 */
export function sandboxerHandlers(configFile: string, sandboxer: string): SandboxerHandler[] {
  const out: SandboxerHandler[] = [];
  const seen = new Set<string>();
  const visit = (file: string): void => {
    if (seen.has(file) || !existsSync(file)) return;
    seen.add(file);
    let doc: Table;
    try {
      doc = parseToml(readFileSync(file, 'utf8'));
    } catch (err) {
      throw new Error(`${file}: ${messageOf(err).split('\n')[0]}`);
    }
    const plugins = table(doc['plugins']);
    for (const plugin of ['io.containerd.cri.v1.runtime', 'io.containerd.grpc.v1.cri']) {
      const runtimes = table(table(table(plugins?.[plugin])?.['containerd'])?.['runtimes']);
      for (const [name, value] of Object.entries(runtimes ?? {})) {
        const runtime = table(value);
        if (runtime?.['sandboxer'] !== sandboxer) continue;
        const runtimeType = typeof runtime['runtime_type'] === 'string' ? runtime['runtime_type'] : '';
        out.push({ name, runtimeType, shim: runtimeType === '' ? undefined : findShimBinary(runtimeType), file });
      }
    }
    for (const imported of expandImports(file, doc['imports'])) visit(imported);
  };
  visit(configFile);
  return out;
}
