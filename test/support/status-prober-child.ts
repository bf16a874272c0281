/**
 * The prober process of status-prober.ts: `node status-prober-child.js <socket> <namespace>
 * <sandbox id> <timeout ms>`, forked with an IPC channel. It says 'ready', then answers each
 * 'probe' with a ProbeResult, and exits when the channel closes.
 */
import { SandboxClient, codeName, isServiceError } from './grpc-client.js';
import type { ProbeResult } from './status-prober.js';

const args = process.argv.slice(2);
if (args.length !== 4 || process.send === undefined) {
  process.stderr.write('usage (forked with IPC): status-prober-child.js <socket> <namespace> <sandbox id> <timeout ms>\n');
  process.exit(2);
}
const [socketPath, namespace, sandboxId, timeoutMs] = [args[0] as string, args[1] as string, args[2] as string, Number(args[3])];
const send = process.send.bind(process);

async function probe(): Promise<ProbeResult> {
  const started = performance.now();
  const fresh = new SandboxClient(socketPath, namespace, { ownConnection: true });
  try {
    const { state } = await fresh.status({ sandboxId }, { timeoutMs });
    return { ms: performance.now() - started, state };
  } catch (err) {
    return { ms: performance.now() - started, error: isServiceError(err) ? `${codeName(err.code)} (${err.details})` : String(err) };
  } finally {
    fresh.close();
  }
}

process.on('message', (message) => {
  if (message === 'probe') void probe().then((result) => send(result));
});
process.on('disconnect', () => process.exit(0));
send('ready');
