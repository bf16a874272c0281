/**
 * containerd's config as containerd reads it (the main file and, recursively, its `imports`),
 * the CRI runtime handlers in it that put pods on a sandboxer, and the shim binary each one's
 * `runtime_type` names. containerd runs that shim itself for the pods' containers when the
 * sandboxer answers a version-2 task endpoint (SPEC.md section 7), so a handler whose shim
 * does not exist can run pods but no container in them. tsbox checks this at start-up and
 * `tsbox doctor` reports it.
 */
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { basename, dirname, isAbsolute, join } from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { isGone, messageOf, withPath } from './errors.js';

/** Finds a binary on PATH. */
export function findOnPath(binary: string, path = process.env['PATH'] ?? ''): string | undefined {
  for (const dir of path.split(':')) {
    if (dir === '') continue;
    const candidate = join(dir, binary);
    try {
      if (statSync(candidate).isFile() && (statSync(candidate).mode & 0o111) !== 0) return candidate;
    } catch (err) {
      // Not in this directory (or no such directory); anything else is reported with the path.
      if (!isGone(err, ['ENOTDIR'])) throw withPath(err, candidate, 'check');
    }
  }
  return undefined;
}

/**
 * The shim binary containerd runs for a runtime_type: `io.containerd.runc.v2` →
 * `containerd-shim-runc-v2` (containerd's shim naming rule); an absolute path is itself.
 */
export function shimBinaryName(runtimeType: string): string {
  if (isAbsolute(runtimeType)) return runtimeType;
  const parts = runtimeType.split('.');
  const version = parts.pop() ?? '';
  const name = parts.pop() ?? '';
  return `containerd-shim-${name}-${version}`;
}

export type Toml = Record<string, unknown>;
const table = (v: unknown): Toml | undefined => (typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Toml) : undefined);

/** A containerd config with its imports, as containerd reads them. */
export interface ContainerdConfigFiles {
  /** Each file with its parsed content, the main file first. */
  readonly files: readonly { readonly path: string; readonly toml: Toml }[];
  readonly version: number;
}

/** Expands one `imports` entry: a path, or a glob with `*` in its last component. */
function expandImport(entry: string, base: string): string[] {
  const full = isAbsolute(entry) ? entry : join(base, entry);
  if (!basename(full).includes('*')) return existsSync(full) ? [full] : [];
  const dir = dirname(full);
  const pattern = new RegExp(`^${basename(full).replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*')}$`);
  try {
    return readdirSync(dir).filter((f) => pattern.test(f)).sort().map((f) => join(dir, f));
  } catch (err) {
    // No such directory: the glob matches nothing, as containerd treats it.
    if (isGone(err, ['ENOTDIR'])) return [];
    throw withPath(err, dir, 'list');
  }
}

/** Reads containerd's config and, recursively, the files its `imports` name. Throws on bad TOML. */
export function readContainerdConfig(path: string): ContainerdConfigFiles {
  const files: { path: string; toml: Toml }[] = [];
  const seen = new Set<string>();
  const visit = (file: string): void => {
    if (seen.has(file)) return;
    seen.add(file);
    let toml: Toml;
    try {
      toml = parseToml(readFileSync(file, 'utf8'));
    } catch (err) {
      throw new Error(`${file} is not valid TOML: ${messageOf(err).split('\n')[0]}`);
    }
    files.push({ path: file, toml });
    const imports = toml['imports'];
    if (Array.isArray(imports)) {
      for (const entry of imports) if (typeof entry === 'string') for (const f of expandImport(entry, dirname(file))) visit(f);
    }
  };
  visit(path);
  const version = files[0]?.toml['version'];
  return { files, version: typeof version === 'number' ? version : 1 };
}

/** The CRI runtimes tables of a config (version 3 and version 2 keys). */
function criRuntimes(toml: Toml): Toml[] {
  const plugins = table(toml['plugins']);
  const out: Toml[] = [];
  for (const key of ['io.containerd.cri.v1.runtime', 'io.containerd.grpc.v1.cri']) {
    const runtimes = table(table(table(plugins?.[key])?.['containerd'])?.['runtimes']);
    if (runtimes !== undefined) out.push(runtimes);
  }
  return out;
}

/** One CRI runtime handler whose sandboxer is the one asked about. */
export interface SandboxerHandler {
  readonly name: string;
  /** Its runtime_type; '' when it has none. */
  readonly runtimeType: string;
  /** Where the shim binary is, or undefined when none exists. */
  readonly shim: string | undefined;
  /** The config file that defines it. */
  readonly file: string;
}

/** The handlers with `sandboxer = <sandboxer>`, each with its shim binary found on `path` or not. */
export function sandboxerHandlers(parsed: ContainerdConfigFiles, sandboxer: string, path?: string): SandboxerHandler[] {
  return parsed.files.flatMap((f) =>
    criRuntimes(f.toml).flatMap((runtimes) =>
      Object.entries(runtimes).flatMap(([name, value]) => {
        const t = table(value);
        if (t?.['sandboxer'] !== sandboxer) return [];
        const runtimeType = typeof t['runtime_type'] === 'string' ? t['runtime_type'] : '';
        return [{ name, runtimeType, shim: runtimeType === '' ? undefined : findShim(runtimeType, path), file: f.path }];
      }),
    ),
  );
}

/** The shim binary of a runtime_type, searched on PATH as containerd does, or undefined. */
export function findShim(runtimeType: string, path?: string): string | undefined {
  const shim = shimBinaryName(runtimeType);
  return isAbsolute(shim) ? (existsSync(shim) ? shim : undefined) : findOnPath(shim, path);
}
