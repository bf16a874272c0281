/**
 * containerd's root, state and gRPC address, taken from containerd's own config so that
 * pointing tsbox at that config is the only setting a node needs. CRI keeps a pod's hostname,
 * hosts and resolv.conf below the root and its /dev/shm below the state dir, and containerd's
 * runc shim names a pod's task socket after the address: a tsbox that guessed any of them
 * wrong would run pods that are silently incomplete. A value tsbox is given explicitly
 * (flag or tsbox's config file) must agree with containerd's.
 */
import { existsSync } from 'node:fs';
import { isAbsolute, normalize } from 'node:path';
import { ConfigError, DEFAULT_CONTAINERD_CONFIG, type Config } from './config.js';
import { type ContainerdConfigFiles, type Toml, readContainerdConfig } from './containerd-config.js';
import { messageOf } from '../base/errors.js';

/** What containerd 2.x uses for a key its config leaves out (its defaults package, on Linux). */
export const CONTAINERD_DEFAULTS = {
  root: '/var/lib/containerd',
  state: '/run/containerd',
  address: '/run/containerd/containerd.sock',
} as const;

type Key = keyof typeof CONTAINERD_DEFAULTS;
const KEYS: readonly Key[] = ['root', 'state', 'address'];

/** How each key is spelled in containerd's config and in tsbox's. */
const CONTAINERD_KEY: Record<Key, string> = { root: 'root', state: 'state', address: '[grpc] address' };
const TSBOX_KEY = { root: 'containerd_root', state: 'containerd_state', address: 'containerd_address' } as const;
const CONFIG_FIELD = { root: 'containerdRoot', state: 'containerdState', address: 'containerdAddress' } as const;

/** containerd's paths, each with where it came from. */
export interface ContainerdPaths {
  readonly root: string;
  readonly state: string;
  readonly address: string;
  /** The file that set each value, or undefined for containerd's default. */
  readonly from: Readonly<Record<Key, string | undefined>>;
}

/** A path as Go's filepath.Clean leaves it: no `.` or `..` parts, no doubled or trailing slash. */
const clean = (p: string): string => normalize(p).replace(/(.)\/+$/, '$1');

const table = (v: unknown): Toml | undefined => (typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Toml) : undefined);

/**
 * The paths containerd takes from these files: in the order containerd merges them, a later
 * file's non-empty value replaces an earlier one (containerd merges with mergo's override, which
 * skips empty values); a key no file sets keeps containerd's default. `parsed` undefined: no
 * config file, all defaults.
 */
export function pathsFromConfig(parsed: ContainerdConfigFiles | undefined): ContainerdPaths {
  const values: Record<Key, string> = { ...CONTAINERD_DEFAULTS };
  const from: Record<Key, string | undefined> = { root: undefined, state: undefined, address: undefined };
  const problems: string[] = [];
  for (const { path, toml } of parsed?.files ?? []) {
    const found: Record<Key, unknown> = { root: toml['root'], state: toml['state'], address: table(toml['grpc'])?.['address'] };
    for (const key of KEYS) {
      const value = found[key];
      if (value === undefined || value === '') continue;
      if (typeof value !== 'string') problems.push(`containerd config ${path}: ${CONTAINERD_KEY[key]} must be a string, not ${JSON.stringify(value)}`);
      else if (!isAbsolute(value)) {
        problems.push(`containerd config ${path}: ${CONTAINERD_KEY[key]} = ${JSON.stringify(value)} is relative to containerd's working directory, which tsbox cannot know; make it absolute`);
      } else {
        values[key] = clean(value);
        from[key] = path;
      }
    }
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return { ...values, from };
}

/**
 * Reads containerd's paths from its config file. A missing file at containerd's default path
 * means containerd's defaults, as for containerd itself; a missing file named elsewhere, one that
 * cannot be read or parsed, or an import that names a missing file is an error.
 */
export function readContainerdPaths(configPath: string): ContainerdPaths {
  if (configPath === DEFAULT_CONTAINERD_CONFIG && !existsSync(configPath)) return pathsFromConfig(undefined);
  let parsed;
  try {
    parsed = readContainerdConfig(configPath);
  } catch (err) {
    throw new ConfigError([`containerd_config: ${messageOf(err)}`]);
  }
  return pathsFromConfig(parsed);
}

/** Where containerd took a value from, in words. */
function origin(paths: ContainerdPaths, key: Key, configPath: string): string {
  const file = paths.from[key];
  if (file !== undefined) return `containerd's ${CONTAINERD_KEY[key]} in ${file}`;
  return `containerd's default ${CONTAINERD_KEY[key]} (${configPath} and its imports set none)`;
}

/**
 * The settings tsbox was given that disagree with containerd's: one line each, naming both
 * values. A setting that is empty (not given) always agrees.
 */
export function disagreements(config: Config, paths: ContainerdPaths): string[] {
  return KEYS.flatMap((key) => {
    const given = config[CONFIG_FIELD[key]];
    if (given === '' || clean(given) === paths[key]) return [];
    return [
      `${TSBOX_KEY[key]}: ${given} (--${TSBOX_KEY[key].replace('_', '-')} or tsbox's config file) disagrees with ${origin(paths, key, config.containerdConfig)}, ${paths[key]}; leave it out (tsbox follows containerd's config) or make them agree`,
    ];
  });
}

/**
 * The configuration with containerd's root, state and address taken from containerd's config;
 * a ConfigError lists every problem (a config that cannot be read, a setting that disagrees).
 */
export function withContainerdPaths(config: Config): Config {
  const paths = readContainerdPaths(config.containerdConfig);
  const problems = disagreements(config, paths);
  if (problems.length > 0) throw new ConfigError(problems);
  return Object.freeze({ ...config, containerdRoot: paths.root, containerdState: paths.state, containerdAddress: paths.address });
}
