import { createHash } from 'node:crypto';
import { join } from 'node:path';

/**
 * Where things live under the state dir:
 *   sandboxes/<namespace>/<id>/record.json   the sandbox's record (state/record-store.ts)
 *   sandboxes/<namespace>/<id>/pid, exit     written by the sandbox's supervisor
 *   sandboxes/<namespace>/<id>/console.log   the sandbox process's stdout and stderr
 *   exits/<namespace>@<id>                   touched by a supervisor when its sandbox exits
 *   quarantine/                              records that could not be read
 *   s/<hash>, s/<hash>.link                  a pod's task socket and link (its process binds them)
 * Namespaces and ids are containerd identifiers ([A-Za-z0-9._-]), so they are safe path
 * components and never contain '@'.
 */
export interface StateLayout {
  readonly root: string;
  readonly sandboxes: string;
  readonly exits: string;
  readonly quarantine: string;
  sandboxDir(namespace: string, id: string): string;
  exitNotice(namespace: string, id: string): string;
  /**
   * The pod's task socket (the address containerd is told) and its link (tsbox's own
   * connection to the pod's process). Named by a hash of the namespace and id, 32 hex digits,
   * because a unix socket's path has at most 107 bytes.
   */
  podSockets(namespace: string, id: string): { readonly task: string; readonly link: string };
}

/** The longest path a unix socket may have (sun_path less its NUL). */
export const MAX_SOCKET_PATH = 107;

/** The longest pod socket path below `root` (podSockets' link). */
export function longestPodSocket(root: string): number {
  return Buffer.byteLength(join(root, 's', `${'0'.repeat(32)}.link`));
}

export function stateLayout(root: string): StateLayout {
  const sandboxes = join(root, 'sandboxes');
  const exits = join(root, 'exits');
  return {
    root,
    sandboxes,
    exits,
    quarantine: join(root, 'quarantine'),
    sandboxDir: (namespace, id) => join(sandboxes, namespace, id),
    exitNotice: (namespace, id) => join(exits, `${namespace}@${id}`),
    podSockets: (namespace, id) => {
      const task = join(root, 's', createHash('sha256').update(`${namespace}/${id}`).digest('hex').slice(0, 32));
      return { task, link: `${task}.link` };
    },
  };
}
