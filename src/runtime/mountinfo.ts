import { readFile } from 'node:fs/promises';

/** Field 5 of a mountinfo line, the mount point, as the kernel escapes it (space, tab, newline, backslash as octal). */
function escapeMountPoint(path: string): string {
  return path.replace(/[ \t\n\\]/g, (c) => `\\${c.charCodeAt(0).toString(8).padStart(3, '0')}`);
}

/**
 * True when something is mounted at `path` (or, with `below`, anywhere under it) in this mount
 * namespace: reading the kernel's table costs far less than starting a helper to find nothing.
 */
export async function isMountedAt(path: string, options: { below: boolean }): Promise<boolean> {
  const info = await readFile('/proc/self/mountinfo', 'utf8');
  const escaped = escapeMountPoint(path);
  return info.split('\n').some((line) => {
    const point = line.split(' ')[4];
    return point !== undefined && (point === escaped || (options.below && point.startsWith(`${escaped}/`)));
  });
}
