import type { Config } from '../config.js';
import type { Output } from './sandbox-commands.js';
export interface InstallOptions { readonly config: Config; readonly root: string; readonly containerdConfig: string; readonly execPath?: string | undefined; readonly output: Output }
export function install(_o: InstallOptions): Promise<number> { return Promise.resolve(1); }
export function uninstall(_o: InstallOptions): Promise<number> { return Promise.resolve(1); }
