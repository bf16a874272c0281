/**
 * containerd's config as containerd reads it (the main file and, recursively, its `imports`),
 * the CRI runtime handlers in it that put pods on a sandboxer, and the shim binary each one's
 * `runtime_type` names. containerd runs that shim itself for the pods' containers when the
 * sandboxer answers a version-2 task endpoint (SPEC.md section 7), so a handler whose shim
 * does not exist can run pods but no container in them. tsbox checks this at start-up and
 * `tsbox doctor` reports it.
 */
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { basename, dirname, isAbsolute, join, normalize, resolve } from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { isGone, messageOf, withPath } from '../base/errors.js';

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
  /** Each file with its parsed content in the order containerd merges them, the main file first. */
  readonly files: readonly { readonly path: string; readonly toml: Toml }[];
  readonly version: number;
}

/** containerd's config cannot be read as containerd would read it; the message says where and why. */
export class ContainerdConfigError extends Error {
  override readonly name = 'ContainerdConfigError';
}

/** A character matched as itself in a RegExp. */
const literal = (c: string): string => c.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');

/**
 * Go's filepath.Match pattern as a RegExp: `*`, `?`, `[...]` (`^` negates, `a-z` ranges), `\`
 * escapes; none matches `/`. An unclosed or empty class is an error, as in Go.
 */
function globRegExp(pattern: string, full: string): RegExp {
  const bad = (why: string): ContainerdConfigError => new ContainerdConfigError(`bad pattern in imports: ${full} (${why})`);
  let out = '';
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i] as string;
    if (c === '*') out += '[^/]*';
    else if (c === '?') out += '[^/]';
    else if (c === '\\') {
      if (i + 1 >= pattern.length) throw bad('"\\" at the end');
      out += literal(pattern[++i] as string);
    } else if (c === '[') {
      let j = i + 1;
      let cls = '';
      if (pattern[j] === '^') {
        cls = '^/';
        j++;
      }
      const start = j;
      for (; j < pattern.length && (pattern[j] !== ']' || j === start); j++) {
        const d = pattern[j] as string;
        if (d === ']') throw bad('empty "[]"');
        const escaped = d === '\\' && j + 1 < pattern.length ? (pattern[++j] as string) : undefined;
        if (escaped !== undefined) cls += escaped === '-' ? '\\-' : literal(escaped);
        else cls += d === '-' ? (j > start && pattern[j + 1] !== ']' ? '-' : '\\-') : literal(d);
      }
      if (j >= pattern.length) throw bad('unclosed "["');
      out += `[${cls}]`;
      i = j;
    } else out += literal(c);
  }
  try {
    return new RegExp(`^${out}$`, 'u');
  } catch {
    // the only way it is invalid: a reversed class range such as [z-a], which matches nothing in Go
    return /(?!)/u;
  }
}

const hasMeta = (s: string): boolean => /[*?[\\]/.test(s);

/**
 * Go's filepath.Glob: every path matching `pattern`, each directory's names sorted; a directory
 * that cannot be read matches nothing.
 */
function glob(pattern: string): string[] {
  if (!hasMeta(pattern)) return existsSync(pattern) ? [pattern] : [];
  const dir = dirname(pattern);
  const dirs = hasMeta(dir) && dir !== pattern ? glob(dir) : [dir];
  const matcher = globRegExp(basename(pattern), pattern);
  return dirs.flatMap((d) => {
    let names: string[];
    try {
      if (!statSync(d).isDirectory()) return [];
      names = readdirSync(d);
    } catch {
      // Go's Glob ignores I/O errors: a directory that cannot be read matches nothing
      return [];
    }
    return names.filter((n) => matcher.test(n)).sort().map((n) => join(d, n));
  });
}

/**
 * The files one file's `imports` name, as containerd 2.1 resolves them: each entry cleaned, a
 * relative one taken from the importing file's directory, and an entry with `*` expanded as a
 * glob (no match: nothing); any other entry is a file that must exist.
 */
function resolveImports(file: string, imports: readonly string[]): string[] {
  return imports.flatMap((entry) => {
    const path = isAbsolute(entry) ? normalize(entry) : join(dirname(file), entry);
    return path.includes('*') ? glob(path) : [path];
  });
}

function parseFile(file: string, importedBy: string | undefined): Toml {
  const via = importedBy === undefined ? '' : ` (imported by ${importedBy})`;
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'no such file' : code === 'EISDIR' ? 'it is a directory' : messageOf(err);
    throw new ContainerdConfigError(`cannot read containerd config ${file}${via}: ${why}`, { cause: err });
  }
  try {
    return parseToml(text);
  } catch (err) {
    const { line, column } = err as { line?: number; column?: number };
    const where = line === undefined ? '' : ` at line ${line}, column ${String(column)}`;
    throw new ContainerdConfigError(`containerd config ${file}${via} is not valid TOML${where}: ${messageOf(err).split('\n')[0]?.replace(/^Invalid TOML document: /, '')}`, {
      cause: err,
    });
  }
}

/**
 * Reads containerd's config the way containerd 2.1 does (cmd/containerd/server/config
 * LoadConfig): the main file, then the files its `imports` name, breadth first (each file's
 * imports after every file already queued), each file once. An import that names a missing
 * file is an error, as it stops containerd; a glob that matches nothing is not.
 */
export function readContainerdConfig(path: string): ContainerdConfigFiles {
  const files: { path: string; toml: Toml }[] = [];
  const loaded = new Set<string>();
  const pending: { file: string; importedBy: string | undefined }[] = [{ file: resolve(path), importedBy: undefined }];
  for (let next = pending.shift(); next !== undefined; next = pending.shift()) {
    const { file, importedBy } = next;
    if (loaded.has(file)) continue;
    const toml = parseFile(file, importedBy);
    const imports = toml['imports'];
    if (imports !== undefined && (!Array.isArray(imports) || imports.some((i) => typeof i !== 'string'))) {
      throw new ContainerdConfigError(`containerd config ${file}: imports must be a list of file names`);
    }
    files.push({ path: file, toml });
    loaded.add(file);
    for (const f of resolveImports(file, (imports ?? []) as string[])) pending.push({ file: f, importedBy: file });
  }
  const version = files[0]?.toml['version'];
  return { files, version: typeof version === 'number' ? version : 1 };
}

/**
 * The sandbox (pause) image CRI is told to use (version 3: the images plugin's
 * `pinned_images.sandbox`; version 2: the CRI plugin's `sandbox_image`), the last file
 * that sets it winning as containerd merges them; undefined when none does.
 */
export function pinnedSandboxImage(parsed: ContainerdConfigFiles): string | undefined {
  let image: string | undefined;
  for (const { toml } of parsed.files) {
    const plugins = table(toml['plugins']);
    const v3 = table(table(plugins?.['io.containerd.cri.v1.images'])?.['pinned_images'])?.['sandbox'];
    const v2 = table(plugins?.['io.containerd.grpc.v1.cri'])?.['sandbox_image'];
    for (const value of [v2, v3]) if (typeof value === 'string' && value !== '') image = value;
  }
  return image;
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
  /** `disable_pause_image_pull = true` (containerd 2.4): CRI pulls no sandbox image for its pods. */
  readonly disablePauseImagePull: boolean;
}

/** The handlers with `sandboxer = <sandboxer>`, each with its shim binary found on `path` or not. */
export function sandboxerHandlers(parsed: ContainerdConfigFiles, sandboxer: string, path?: string): SandboxerHandler[] {
  return parsed.files.flatMap((f) =>
    criRuntimes(f.toml).flatMap((runtimes) =>
      Object.entries(runtimes).flatMap(([name, value]) => {
        const t = table(value);
        if (t?.['sandboxer'] !== sandboxer) return [];
        const runtimeType = typeof t['runtime_type'] === 'string' ? t['runtime_type'] : '';
        return [{ name, runtimeType, shim: runtimeType === '' ? undefined : findShim(runtimeType, path), file: f.path, disablePauseImagePull: t['disable_pause_image_pull'] === true }];
      }),
    ),
  );
}

/** The shim binary of a runtime_type, searched on PATH as containerd does, or undefined. */
export function findShim(runtimeType: string, path?: string): string | undefined {
  const shim = shimBinaryName(runtimeType);
  return isAbsolute(shim) ? (existsSync(shim) ? shim : undefined) : findOnPath(shim, path);
}
