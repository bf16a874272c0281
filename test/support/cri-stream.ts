/**
 * A client of CRI's streaming server, as kubectl exec and attach reach it through kubelet: a
 * WebSocket (the `ws` package) on the URL that CRI's Exec or Attach answered, speaking
 * Kubernetes' `v4.channel.k8s.io` protocol: each message starts with its channel (0 stdin,
 * 1 stdout, 2 stderr, 3 the session's final status, 4 terminal resize).
 */
import WebSocket from 'ws';

const STDIN = 0;
const STDOUT = 1;
const STDERR = 2;
const STATUS = 3;
const RESIZE = 4;

export interface CriStream {
  /** Everything the process wrote to stdout (with a tty: to its terminal) so far. */
  stdout(): string;
  stderr(): string;
  /** Text to the process's stdin. */
  write(text: string): void;
  /** A new terminal size, as kubectl sends when its window changes. */
  resize(width: number, height: number): void;
  /** The session's end: the exit code CRI reported in its final status, when it sent one. */
  readonly ended: Promise<{ exitCode: number | undefined; status: string }>;
  close(): void;
}

/** Opens the session at `url` (http://… as CRI answers it). */
export function openCriStream(url: string): Promise<CriStream> {
  const ws = new WebSocket(url.replace(/^http/, 'ws'), ['v4.channel.k8s.io']);
  let out = '';
  let err = '';
  let status = '';
  const ended = new Promise<{ exitCode: number | undefined; status: string }>((resolve, reject) => {
    ws.on('message', (data: Buffer) => {
      const channel = data[0];
      const text = data.subarray(1).toString('utf8');
      if (channel === STDOUT) out += text;
      else if (channel === STDERR) err += text;
      else if (channel === STATUS) status += text;
    });
    ws.on('close', () => resolve({ exitCode: exitCodeOf(status), status }));
    ws.on('error', reject);
  });
  const send = (channel: number, text: string): void => ws.send(Buffer.concat([Buffer.from([channel]), Buffer.from(text, 'utf8')]));
  return new Promise((resolve, reject) => {
    ws.once('open', () =>
      resolve({
        stdout: () => out,
        stderr: () => err,
        write: (text) => send(STDIN, text),
        resize: (width, height) => send(RESIZE, JSON.stringify({ Width: width, Height: height })),
        ended,
        close: () => ws.close(),
      }),
    );
    ws.once('error', reject);
  });
}

/**
 * The exit code in a final status: Success is 0; a failure names the code as the cause
 * `ExitCode` (`{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":
 * "ExitCode","message":"3"}]}}`); undefined when there is none.
 */
export function exitCodeOf(status: string): number | undefined {
  if (status.trim() === '') return undefined;
  const parsed = JSON.parse(status) as { status?: string; details?: { causes?: { reason?: string; message?: string }[] } };
  if (parsed.status === 'Success') return 0;
  const cause = parsed.details?.causes?.find((c) => c.reason === 'ExitCode');
  return cause?.message === undefined ? undefined : Number(cause.message);
}
