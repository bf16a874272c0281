/**
 * A process of its own that creates and starts a container through a holder, prints
 * "ok <holder-pid> <init-pid>" and then waits to be killed: the integration tests SIGKILL it
 * to show that the container and its exit do not depend on the process that made them.
 * Argument: the CreateOptions as JSON.
 */
import { createContainer, type CreateOptions } from '../../src/runtime/container-holder.js';

const options = JSON.parse(process.argv[2] ?? '{}') as CreateOptions;
const holder = await createContainer(options);
await holder.start();
process.stdout.write(`ok ${holder.record.holderPid} ${holder.pid}\n`);
// Kept alive by stdin (a pipe from the test) until the test kills it.
process.stdin.resume();
