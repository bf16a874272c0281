/**
 * Task records in the exact format builds wrote before the record had a version (src/tasks/
 * task-record.ts): `JSON.stringify` of the record, its keys in this order, no `version`. A
 * task started by such a build must be served after an upgrade, so these texts are what the
 * tests write where a record is read back.
 */

/** The fields of a task's record. */
export interface FormerTaskFields {
  readonly namespace: string;
  readonly id: string;
  readonly bundle: string;
  readonly stdin: string;
  readonly stdout: string;
  readonly stderr: string;
  readonly terminal: boolean;
  readonly systemdCgroup: boolean;
  readonly runcPath: string;
  /** Absent in the records of a tsbox that kept one runc root. */
  readonly runcRoot?: string;
  /** Absent in the records of a tsbox before the tasks named their sandbox. */
  readonly sandboxId?: string;
}

const q = (s: string): string => JSON.stringify(s);

/** task.json as an earlier build wrote it. */
export function formerTaskJson(f: FormerTaskFields): string {
  return (
    `{"namespace":${q(f.namespace)},"id":${q(f.id)},"bundle":${q(f.bundle)},"stdin":${q(f.stdin)},"stdout":${q(f.stdout)},"stderr":${q(f.stderr)},` +
    `"terminal":${f.terminal},"systemdCgroup":${f.systemdCgroup},"runcPath":${q(f.runcPath)}` +
    (f.runcRoot === undefined ? '' : `,"runcRoot":${q(f.runcRoot)}`) +
    (f.sandboxId === undefined ? '' : `,"sandboxId":${q(f.sandboxId)}`) +
    '}'
  );
}

/** exec.json as an earlier build wrote it: the exec id, its OCI process, its IO. */
export function formerExecJson(f: { readonly execId: string; readonly spec: object; readonly stdin: string; readonly stdout: string; readonly stderr: string; readonly terminal: boolean }): string {
  return `{"execId":${q(f.execId)},"spec":${JSON.stringify(f.spec)},"stdin":${q(f.stdin)},"stdout":${q(f.stdout)},"stderr":${q(f.stderr)},"terminal":${f.terminal}}`;
}

/** A task.json of a CRI container, as the build before the record's version wrote it on a node. */
export const FORMER_TASK_JSON =
  '{"namespace":"k8s.io","id":"4f1c0a6e2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f",' +
  '"bundle":"/run/containerd/io.containerd.runtime.v2.task/k8s.io/4f1c0a6e2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f",' +
  '"stdin":"","stdout":"/run/containerd/io.containerd.grpc.v1.cri/containers/4f1c0a6e2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f/io/2211839514/4f1c0a6e2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f-stdout",' +
  '"stderr":"/run/containerd/io.containerd.grpc.v1.cri/containers/4f1c0a6e2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f/io/2211839514/4f1c0a6e2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f-stderr",' +
  '"terminal":false,"systemdCgroup":false,"runcPath":"runc","runcRoot":"/run/containerd/tsbox/runc/k8s.io",' +
  '"sandboxId":"9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b"}';

/** An exec.json of CRI's ExecSync, as the build before the record's version wrote it. */
export const FORMER_EXEC_JSON =
  '{"execId":"0b6f1a2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8",' +
  '"spec":{"user":{"uid":0,"gid":0},"args":["/bin/sh","-c","echo hello; exit 5"],"env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","HOSTNAME=pod"],"cwd":"/","capabilities":{"bounding":["CAP_CHOWN"],"effective":["CAP_CHOWN"],"permitted":["CAP_CHOWN"]},"noNewPrivileges":false,"oomScoreAdj":-998},' +
  '"stdin":"","stdout":"/run/containerd/io.containerd.grpc.v1.cri/containers/4f1c0a6e2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f/io/907441250/0b6f1a2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8-stdout",' +
  '"stderr":"/run/containerd/io.containerd.grpc.v1.cri/containers/4f1c0a6e2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f/io/907441250/0b6f1a2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8-stderr",' +
  '"terminal":false}';
