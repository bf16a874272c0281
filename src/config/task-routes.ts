/**
 * Which CRI runtime handlers' pods have their containers run by tsbox over the Task API route
 * (version 3: no runc shim per pod), and which keep the version-2 route (containerd runs the
 * handler's shim). The setting is `task_api_handlers`; its default `*` means every handler
 * containerd's config puts on tsbox whose runtime_type is runc's: the Task API route runs runc
 * itself, so a handler naming another runtime keeps the shim it names. Read once, at start-up,
 * as containerd reads its handlers.
 */
import type { SandboxerHandler } from './containerd-config.js';

/** The runtime_type whose containers the Task API route can run: runc's. */
export const RUNC_RUNTIME_TYPE = 'io.containerd.runc.v2';

/** Where each handler's pods' containers run. */
export interface HandlerRoutes {
  /** Handlers whose pods' containers tsbox runs over the Task API. */
  readonly taskApi: readonly string[];
  /** Handlers of tsbox in containerd's config that keep the version-2 route, and why. */
  readonly version2: readonly { readonly handler: SandboxerHandler; readonly why: string }[];
  /** Handlers named in the setting whose runtime_type is another runtime's: tsbox runs them with runc all the same. */
  readonly notRunc: readonly { readonly name: string; readonly runtimeType: string }[];
}

/**
 * The routes of the handlers: `setting` is task_api_handlers (names, `*`, or nothing);
 * `handlers` are the handlers containerd's config puts on tsbox, or undefined when that
 * config could not be read (then `*` names no handler: which runtime each has is unknown).
 */
export function routeHandlers(setting: readonly string[], handlers: readonly SandboxerHandler[] | undefined): HandlerRoutes {
  const all = setting.includes('*');
  const named = new Set(setting.filter((name) => name !== '*'));
  const taskApi = new Set(named);
  const version2: { handler: SandboxerHandler; why: string }[] = [];
  const notRunc: { name: string; runtimeType: string }[] = [];
  // A handler defined in several of containerd's files: the last one read is the one that counts.
  const byName = new Map((handlers ?? []).map((h) => [h.name, h]));
  for (const handler of byName.values()) {
    const runc = handler.runtimeType === RUNC_RUNTIME_TYPE;
    if (named.has(handler.name)) {
      if (!runc) notRunc.push({ name: handler.name, runtimeType: handler.runtimeType });
    } else if (all && runc) {
      taskApi.add(handler.name);
    } else {
      version2.push({ handler, why: all ? `its runtime_type is ${JSON.stringify(handler.runtimeType)}, not runc's` : 'not in task_api_handlers' });
    }
  }
  return { taskApi: [...taskApi], version2, notRunc };
}
