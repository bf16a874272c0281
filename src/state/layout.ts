import { join } from 'node:path';

/**
 * Where things live under the state dir:
 *   sandboxes/<namespace>/<id>/record.json   the sandbox's record (state/record-store.ts)
 *   sandboxes/<namespace>/<id>/pid, exit     written by the sandbox's supervisor
 *   sandboxes/<namespace>/<id>/console.log   the sandbox process's stdout and stderr
 *   exits/<namespace>@<id>                   touched by a supervisor when its sandbox exits
 *   quarantine/                              records that could not be read
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
  };
}
