import { readFile } from 'node:fs/promises';

/** Field 5 of a mountinfo line, the mount point, as the kernel escapes it (space, tab, newline, backslash as octal). */
function escapeMountPoint(path: string): string {
  return path.replace(/[ \t\n\\]/g, (c) => `\\${c.charCodeAt(0).toString(8).padStart(3, '0')}`);
}

/**
 * The mount points at `path` and below it in this mount namespace (escaped as mountinfo has
 * them): reading the kernel's table costs far less than starting a helper to find nothing.
 */
export async function mountPointsAt(path: string, options: { below: boolean }): Promise<string[]> {
  const info = await readFile('/proc/self/mountinfo', 'utf8');
  const escaped = escapeMountPoint(path);
  const out: string[] = [];
  for (const line of info.split('\n')) {
    const point = line.split(' ')[4];
    if (point === undefined) continue;
    if (point === escaped || (options.below && point.startsWith(`${escaped}/`))) out.push(point);
  }
  return out;
}
