/**
 * `tsbox install` / `tsbox uninstall`: the systemd unit, the containerd drop-in that
 * registers tsbox, and one `imports` entry in containerd's config.toml (containerd 2.x,
 * version 3) that pulls the drop-in in. An existing containerd config is edited in place,
 * only at its `imports` line, and checked by parsing it again: every other setting must read
 * back the same, or nothing is written. Everything goes below `--root` (default /), so an
 * image build or a test can install into a directory.
 */
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { parse as parseToml } from 'smol-toml';
import type { Config } from '../config/config.js';
import { messageOf } from '../base/errors.js';
import { DAEMON_NODE_FLAGS } from '../base/node-flags.js';
import { systemdIsInit } from '../runtime/systemd.js';
import { EXIT, OperatorError } from './exit-codes.js';
import { releaseOfBinary, traitsOf } from './containerd-release.js';
import { findOnPath } from '../config/containerd-config.js';
import { SANDBOXER, type Output } from './sandbox-commands.js';

/** Where install puts things, as the node sees them (below --root in tests). */
const UNIT_PATH = '/etc/systemd/system/tsbox.service';
const DROP_IN_PATH = '/etc/containerd/conf.d/tsbox.toml';

/** What install and uninstall need. */
export interface InstallOptions {
  readonly config: Config;
  /** Prefix of every path written. */
  readonly root: string;
  /** containerd's config.toml, as the node sees it. */
  readonly containerdConfig: string;
  /** The tsbox command the unit runs; default: this program as it was started. */
  readonly execPath?: string | undefined;
  /** PATH to find containerd on, whose release decides disable_pause_image_pull (default: the environment's). */
  readonly path?: string;
  /** runc's systemd cgroup driver for the CRI handler; default: whether systemd is this machine's init. */
  readonly systemdCgroup?: boolean;
  readonly output: Output;
}

/** The command line that runs this tsbox: the release's launcher, or node (with the daemon's flags) and main.js. */
function defaultExec(): string {
  const launcher = process.env['TSBOX_LAUNCHER'];
  if (launcher !== undefined && launcher !== '') return launcher;
  return [process.execPath, ...DAEMON_NODE_FLAGS, process.argv[1] ?? ''].join(' ');
}

/** systemd quoting of one word of an Exec line. */
function execWord(word: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(word) ? word : `"${word.replace(/(["\\])/g, '\\$1')}"`;
}

/**
 * The unit. `KillMode=process`: stopping or restarting tsbox ends only tsbox, never the
 * sandboxes (their supervisors live in its cgroup, as shims do in containerd's).
 * `Delegate=yes`: tsbox manages the cgroups below its own. Readiness: tsbox binds its
 * socket only after recovery, so `ExecStartPost=tsbox ready` (which returns once the socket
 * accepts a connection) makes systemd call the unit started exactly when tsbox serves; with
 * `Type=exec` no notify library is needed.
 */
function systemdUnit(exec: string, config: Config): string {
  // containerd's config names its root, state and socket: tsbox reads them there.
  const serve = [...exec.split(' '), 'serve', '--socket', config.socket, '--state-dir', config.stateDir, '--containerd-config', config.containerdConfig, '--log-format', 'json']
    .map(execWord)
    .join(' ');
  const ready = [...exec.split(' '), 'ready', '--socket', config.socket, '--timeout', '600'].map(execWord).join(' ');
  return `# Installed by "tsbox install"; "tsbox uninstall" removes it.
[Unit]
Description=tsbox, a sandboxer for containerd
After=local-fs.target network.target
# containerd dials tsbox lazily; starting first lets its pods be watched at once after boot.
Before=containerd.service

[Service]
Type=exec
ExecStart=${serve}
ExecStartPost=${ready}
# Sandboxes outlive tsbox: only the daemon is signalled on stop and restart.
KillMode=process
Delegate=yes
Restart=on-failure
# Exit 2 is a bad command line or configuration: restarting cannot fix it.
RestartPreventExitStatus=2
RestartSec=2s
# tsbox drains calls for shutdown_drain_ms (5 s by default) on SIGTERM.
TimeoutStopSec=30s
TimeoutStartSec=660s
LimitNOFILE=1048576
OOMScoreAdjust=-500

[Install]
WantedBy=multi-user.target
`;
}

/**
 * The tables that register tsbox with containerd 2.x (SPEC.md section 1): the sandbox proxy
 * plugin on tsbox's socket and the CRI runtime handler whose pods run on it. `reference`
 * ends the comment on the handler (a pointer into SPEC.md, or nothing).
 */
export function sandboxerTables(config: Config, reference = '', systemdCgroup = false, disablePausePull = false): string {
  // kubelet's systemd cgroup driver sends slices as cgroup parents; runc must then make its
  // containers' cgroups through systemd too, as the sandbox's are.
  const options = systemdCgroup
    ? `
# systemd is this node's init: runc makes the containers' cgroups as systemd scopes, matching
# kubelet's cgroupDriver: systemd.
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.${SANDBOXER}.options]
  SystemdCgroup = true
`
    : '';
  return `[proxy_plugins.${SANDBOXER}]
  type = "sandbox"
  address = ${JSON.stringify(config.socket)}

# Kubernetes pods whose RuntimeClass handler is "${SANDBOXER}" run on tsbox; tsbox runs their
# containers with runc, in the sandbox's namespaces, without a shim per pod (its Task API route;
# with task_api_handlers = [] containerd's runc shim runs them)${reference}.
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.${SANDBOXER}]
  runtime_type = "io.containerd.runc.v2"
  sandboxer = "${SANDBOXER}"
${disablePausePull ? '  # tsbox pods run no pause container: CRI pulls no sandbox image for them (containerd ≥ 2.4).\n  disable_pause_image_pull = true\n' : ''}${options}`;
}

/** The drop-in containerd imports: tsbox as sandboxer and as CRI runtime handler. */
function containerdDropIn(config: Config, systemdCgroup: boolean, disablePausePull: boolean): string {
  return `# Installed by "tsbox install"; "tsbox uninstall" removes it.
version = 3

${sandboxerTables(config, '', systemdCgroup, disablePausePull)}`;
}

/**
 * The release of the containerd on PATH (the one the restart that follows install starts) and
 * what install must say or set for it: from 2.3, CRI pulls the sandbox image for every pod; 2.4
 * lets a handler turn that off.
 */
function releaseAdvice(path: string | undefined): { disablePausePull: boolean; line: string } {
  const binary = findOnPath('containerd', path);
  if (binary === undefined) return { disablePausePull: false, line: 'containerd is not on PATH: its release is unknown, disable_pause_image_pull is not set (tsbox doctor checks the running one)' };
  const found = releaseOfBinary(binary);
  if ('error' in found) return { disablePausePull: false, line: `${found.error}: disable_pause_image_pull is not set (tsbox doctor checks the running containerd)` };
  const traits = traitsOf(found.release);
  const name = `containerd ${found.release.join('.')}`;
  if (traits.knowsDisablePausePull) return { disablePausePull: true, line: `${name}: disable_pause_image_pull is set on handler ${SANDBOXER} (CRI pulls no pause image for tsbox pods)` };
  if (traits.pullsPauseImage) {
    return { disablePausePull: false, line: `${name} pulls the sandbox image (${traits.defaultSandboxImage} unless pinned_images.sandbox names another) for every pod, also tsbox's: keep it on the node (tsbox doctor checks)` };
  }
  return { disablePausePull: false, line: `${name}: pulls no sandbox image for tsbox pods` };
}

/** The config install creates when containerd has none. */
function freshContainerdConfig(): string {
  return `# Created by "tsbox install"; containerd's defaults apply to everything not set here.
version = 3
imports = [${JSON.stringify(DROP_IN_PATH)}]
`;
}

type Toml = Record<string, unknown>;

function parseContainerd(path: string, text: string): Toml {
  let toml: Toml;
  try {
    toml = parseToml(text);
  } catch (err) {
    throw new OperatorError(EXIT.refused, `${path} is not valid TOML, so tsbox will not edit it: ${messageOf(err).split('\n')[0]}`, 'fix its syntax ("containerd config dump" shows what containerd reads), then run tsbox install again');
  }
  const version = toml['version'] ?? 1;
  if (version !== 3) {
    throw new OperatorError(
      EXIT.refused,
      `${path} is a version ${typeof version === 'number' ? version : JSON.stringify(version)} config; tsbox installs a version 3 drop-in, which containerd 2.x imports only into a version 3 config`,
      `migrate it first: containerd config migrate > ${path}.new && mv ${path}.new ${path}`,
    );
  }
  return toml;
}

/** Where the top-level `imports = [...]` is in the text, or undefined. */
function findImports(text: string): { start: number; end: number } | undefined {
  const firstTable = text.search(/^\s*\[/m);
  const head = firstTable < 0 ? text : text.slice(0, firstTable);
  const match = /^[ \t]*imports[ \t]*=[ \t]*\[/m.exec(head);
  if (match === null) return undefined;
  let i = match.index + match[0].length;
  let quote: string | undefined;
  for (; i < text.length; i++) {
    const c = text[i];
    if (quote !== undefined) {
      if (c === '\\' && quote === '"') i++;
      else if (c === quote) quote = undefined;
    } else if (c === '"' || c === "'") quote = c;
    else if (c === '#') i = text.indexOf('\n', i) < 0 ? text.length : text.indexOf('\n', i);
    else if (c === ']') return { start: match.index, end: i + 1 };
  }
  return undefined;
}

/** Ends an `imports` line that install added, so that uninstall removes the line and nothing else. */
const ADDED_MARK = ' # added by tsbox install';

/**
 * The text with `imports` set to `list`. A line install added goes when the list becomes empty;
 * a line that was there before stays (as `imports = []` when it was empty), so that install then
 * uninstall gives back the file byte for byte.
 */
function withImports(text: string, list: readonly string[]): string {
  const line = `imports = [${list.map((s) => JSON.stringify(s)).join(', ')}]`;
  const found = findImports(text);
  if (found !== undefined) {
    const lineEnd = text.indexOf('\n', found.end);
    const rest = text.slice(found.end, lineEnd < 0 ? text.length : lineEnd);
    if (list.length === 0 && rest === ADDED_MARK) {
      return text.slice(0, found.start) + text.slice(lineEnd < 0 ? text.length : lineEnd + 1);
    }
    return text.slice(0, found.start) + line + text.slice(found.end);
  }
  if (list.length === 0) return text;
  // Top-level keys must come before the first table: right after `version`, else at the top.
  const version = /^[ \t]*version[ \t]*=.*$/m.exec(text);
  if (version !== null) {
    const at = version.index + version[0].length;
    return `${text.slice(0, at)}\n${line}${ADDED_MARK}${text.slice(at)}`;
  }
  return `${line}${ADDED_MARK}\n${text}`;
}

/** Writes a file atomically (temp file, rename), keeping the mode of the one it replaces. */
function writeAtomic(path: string, text: string, mode: number): void {
  mkdirSync(dirname(path), { recursive: true });
  const tmp = `${path}.tsbox-tmp`;
  writeFileSync(tmp, text, { mode });
  renameSync(tmp, path);
}

/** Edits containerd's config so its `imports` hold (or no longer hold) the drop-in. */
function editContainerdConfig(path: string, add: boolean): 'created' | 'changed' | 'unchanged' | 'removed' {
  if (!existsSync(path)) {
    if (!add) return 'unchanged';
    writeAtomic(path, freshContainerdConfig(), 0o644);
    return 'created';
  }
  const text = readFileSync(path, 'utf8');
  if (!add && text === freshContainerdConfig()) {
    rmSync(path);
    return 'removed';
  }
  const before = parseContainerd(path, text);
  const imports = Array.isArray(before['imports']) ? (before['imports'] as unknown[]) : [];
  if (before['imports'] !== undefined && !Array.isArray(before['imports'])) {
    throw new OperatorError(EXIT.refused, `${path}: imports is not a list`, 'make it a list of paths, then run tsbox install again');
  }
  const has = imports.includes(DROP_IN_PATH);
  if (has === add) return 'unchanged';
  const list = add ? [...imports.map(String), DROP_IN_PATH] : imports.map(String).filter((p) => p !== DROP_IN_PATH);
  const next = withImports(text, list);
  // Proof that nothing else moved: the edited file reads back as the old one with new imports.
  let after: Toml;
  try {
    after = parseToml(next);
  } catch (err) {
    throw new OperatorError(EXIT.refused, `editing ${path} would break it (${messageOf(err)}); nothing was written`, `add ${JSON.stringify(DROP_IN_PATH)} to its imports by hand`);
  }
  const expected: Toml = { ...before, imports: list };
  if (list.length === 0 && !Array.isArray(after['imports'])) delete expected['imports'];
  // JSON makes both plain objects (smol-toml's tables have no prototype) with dates as text.
  if (!isDeepStrictEqual(JSON.parse(JSON.stringify(after)), JSON.parse(JSON.stringify(expected)))) {
    throw new OperatorError(EXIT.refused, `editing ${path} would change more than its imports; nothing was written`, `add ${JSON.stringify(DROP_IN_PATH)} to its imports by hand`);
  }
  writeAtomic(path, next, statSync(path).mode & 0o777);
  return 'changed';
}

function writeOwned(path: string, text: string): 'created' | 'changed' | 'unchanged' {
  if (existsSync(path)) {
    if (readFileSync(path, 'utf8') === text) return 'unchanged';
    writeAtomic(path, text, 0o644);
    return 'changed';
  }
  writeAtomic(path, text, 0o644);
  return 'created';
}

/** Installs the unit and the drop-in and adds the drop-in to containerd's imports; prints each change. */
export function install(options: InstallOptions): number {
  const { config, root, output } = options;
  const exec = options.execPath ?? defaultExec();
  const at = (p: string): string => join(root, p);
  // containerd's config first: if it is refused, nothing else is written.
  const containerdConfigPath = at(options.containerdConfig);
  if (existsSync(containerdConfigPath)) parseContainerd(containerdConfigPath, readFileSync(containerdConfigPath, 'utf8'));
  const release = releaseAdvice(options.path);
  const changes: [string, string][] = [
    [writeOwned(at(UNIT_PATH), systemdUnit(exec, config)), at(UNIT_PATH)],
    [writeOwned(at(DROP_IN_PATH), containerdDropIn(config, options.systemdCgroup ?? systemdIsInit(), release.disablePausePull)), at(DROP_IN_PATH)],
  ];
  const edit = editContainerdConfig(containerdConfigPath, true);
  changes.push([edit === 'changed' ? `added ${DROP_IN_PATH} to the imports of` : edit, containerdConfigPath]);
  for (const [what, path] of changes) output.out(`${what.padEnd(8)} ${path}\n`);
  output.out(`${release.line}\n`);
  if (changes.some(([what]) => what !== 'unchanged')) {
    output.out('next: systemctl daemon-reload && systemctl enable --now tsbox && systemctl restart containerd\n');
  }
  return EXIT.ok;
}

/** Removes what install put in place, and the drop-in from containerd's imports; prints each change. */
export function uninstall(options: InstallOptions): number {
  const { root, output } = options;
  const at = (p: string): string => join(root, p);
  const edit = editContainerdConfig(at(options.containerdConfig), false);
  output.out(`${edit === 'changed' ? `removed ${DROP_IN_PATH} from the imports of` : edit} ${at(options.containerdConfig)}\n`);
  for (const p of [DROP_IN_PATH, UNIT_PATH]) {
    const path = at(p);
    if (existsSync(path)) {
      rmSync(path);
      output.out(`removed  ${path}\n`);
    } else output.out(`absent   ${path}\n`);
  }
  output.out('next: systemctl daemon-reload && systemctl restart containerd (sandboxes still running keep running until removed)\n');
  return EXIT.ok;
}
