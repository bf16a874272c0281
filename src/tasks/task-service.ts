import { validateNamespace } from '../controller/identifiers.js';
import { TsboxError } from '../base/errors.js';
import { ProcessDetails } from '../gen/containerd/runc/v1/options.js';
import { TaskService } from '../gen/containerd/task/v3/shim.js';
import type { TtrpcCallContext, TtrpcServer } from '../ttrpc/server.js';
import type { TaskTable } from './tasks.js';

/** The ttrpc metadata key containerd's namespace travels in. */
const NAMESPACE_KEY = 'containerd-namespace-ttrpc';

/** containerd's namespace of the call: every task is keyed by it. */
export function namespaceOf(ctx: TtrpcCallContext): string {
  return validateNamespace(ctx.metadata.get(NAMESPACE_KEY)?.[0]);
}

/**
 * Serves containerd's Task API v3 (`containerd.task.v3.Task`) over ttrpc from the task table:
 * the mapping of each method's request and answer, nothing more. Checkpoint is not
 * supported (UNIMPLEMENTED is safe there); Shutdown is a no-op, as the server is shared by
 * every task.
 */
export function registerTaskService(server: TtrpcServer, tasks: TaskTable): void {
  server.registerMethod(TaskService.create, async (req, ctx) => ({
    pid: await tasks.create(
      namespaceOf(ctx),
      {
        id: req.id,
        bundle: req.bundle,
        rootfs: req.rootfs,
        options: req.options,
        checkpoint: req.checkpoint,
        stdin: req.stdin,
        stdout: req.stdout,
        stderr: req.stderr,
        terminal: req.terminal,
      },
      ctx.signal,
    ),
  }));
  server.registerMethod(TaskService.start, async (req, ctx) => ({ pid: await tasks.start(namespaceOf(ctx), req.id, req.execId, ctx.signal) }));
  server.registerMethod(TaskService.state, (req, ctx) => {
    const s = tasks.state(namespaceOf(ctx), req.id, req.execId);
    return Promise.resolve({
      id: s.id,
      bundle: s.bundle,
      pid: s.pid,
      status: s.status,
      stdin: s.stdin,
      stdout: s.stdout,
      stderr: s.stderr,
      terminal: s.terminal,
      exitStatus: s.exit?.status ?? 0,
      exitedAt: s.exit?.exitedAt,
      execId: s.execId,
    });
  });
  server.registerMethod(TaskService.wait, async (req, ctx) => {
    const exit = await tasks.wait(namespaceOf(ctx), req.id, req.execId, ctx.signal);
    return { exitStatus: exit.status, exitedAt: exit.exitedAt };
  });
  server.registerMethod(TaskService.kill, async (req, ctx) => {
    await tasks.kill(namespaceOf(ctx), req.id, req.execId, req.signal, req.all, ctx.signal);
    return {};
  });
  server.registerMethod(TaskService.delete, async (req, ctx) => {
    const { pid, exit } = await tasks.delete(namespaceOf(ctx), req.id, req.execId, ctx.signal);
    return { pid, exitStatus: exit.status, exitedAt: exit.exitedAt };
  });
  server.registerMethod(TaskService.exec, async (req, ctx) => {
    await tasks.exec(namespaceOf(ctx), req.id, req.execId, { stdin: req.stdin, stdout: req.stdout, stderr: req.stderr, terminal: req.terminal }, req.spec);
    return {};
  });
  server.registerMethod(TaskService.resizePty, async (req, ctx) => {
    await tasks.resize(namespaceOf(ctx), req.id, req.execId, req.width, req.height, ctx.signal);
    return {};
  });
  server.registerMethod(TaskService.closeIo, async (req, ctx) => {
    if (req.stdin) await tasks.closeIO(namespaceOf(ctx), req.id, req.execId, ctx.signal);
    return {};
  });
  server.registerMethod(TaskService.pids, async (req, ctx) => ({
    processes: (await tasks.pids(namespaceOf(ctx), req.id, ctx.signal)).map(({ pid, execId }) => ({
      pid,
      info: execId === '' ? undefined : { typeUrl: 'containerd.runc.v1.ProcessDetails', value: Buffer.from(ProcessDetails.encode({ execId }).finish()) },
    })),
  }));
  server.registerMethod(TaskService.stats, async (req, ctx) => {
    const stats = await tasks.stats(namespaceOf(ctx), req.id);
    return { stats: { typeUrl: stats.typeUrl, value: Buffer.from(stats.value) } };
  });
  server.registerMethod(TaskService.update, async (req, ctx) => {
    await tasks.update(namespaceOf(ctx), req.id, req.resources, ctx.signal);
    return {};
  });
  server.registerMethod(TaskService.pause, async (req, ctx) => {
    await tasks.pause(namespaceOf(ctx), req.id, false, ctx.signal);
    return {};
  });
  server.registerMethod(TaskService.resume, async (req, ctx) => {
    await tasks.pause(namespaceOf(ctx), req.id, true, ctx.signal);
    return {};
  });
  server.registerMethod(TaskService.checkpoint, () => Promise.reject(new TsboxError('Unimplemented', 'checkpointing a task is not supported')));
  // Never fails, for any id: containerd's load after its restart depends on it.
  server.registerMethod(TaskService.connect, (req, ctx) =>
    Promise.resolve({ shimPid: process.pid, taskPid: tasks.pidOf(ctx.metadata.get(NAMESPACE_KEY)?.[0] ?? '', req.id), version: '3' }),
  );
  // The server serves every task: one task's Shutdown ends nothing.
  server.registerMethod(TaskService.shutdown, () => Promise.resolve({}));
}
