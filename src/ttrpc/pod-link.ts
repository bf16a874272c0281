/**
 * What a pod's process (native/tsbox-shim.c with native/relay.c: the pod's supervisor, which owns
 * the pod's task socket and containerd's connections to it) says to tsbox of its own on their
 * private connection, the pod's link, beside the calls it relays. Requests of a service no client
 * of the task socket can reach: the relay closes a client that names it, and tsbox serves it only
 * on a link.
 *
 * - POD_HELLO, the first request on every new link: its payload is the pod process's protocol
 *   version, in ASCII decimal. tsbox answers OK when it speaks that version; otherwise it answers
 *   FailedPrecondition and closes the link (the pod is left as it is, and reported).
 * - POD_CANCEL: containerd's connection carrying some calls has closed, so nobody waits for their
 *   answers (ttrpc itself has no cancel). Its payload is the abandoned calls' stream ids (of the
 *   link), each as 4 bytes, big-endian.
 */
export const POD_SERVICE = 'tsbox.pod.v1.Pod';
export const POD_HELLO = 'Hello';
export const POD_CANCEL = 'Cancel';
/** The version of the protocol between tsbox and a pod's process that this build speaks. */
export const POD_PROTOCOL_VERSION = 1;

/**
 * The node-wide task front of earlier builds (one process for every pod) sent the same cancel
 * under this service. A tsbox that finds such a front still running serves the pods it carries.
 */
export const FORMER_FRONT_SERVICE = 'tsbox.front.v1.Front';

/** The stream ids of a cancel request's payload; undefined when it is not a list of them. */
export function decodeCancel(payload: Uint8Array): number[] | undefined {
  if (payload.length % 4 !== 0) return undefined;
  const view = Buffer.from(payload.buffer, payload.byteOffset, payload.length);
  const ids: number[] = [];
  for (let i = 0; i < payload.length; i += 4) ids.push(view.readUInt32BE(i));
  return ids;
}

/** The protocol version a Hello's payload names; undefined when it names none. */
export function decodeHello(payload: Uint8Array): number | undefined {
  const text = Buffer.from(payload.buffer, payload.byteOffset, payload.length).toString('latin1');
  return /^[1-9]\d{0,8}$/.test(text) ? Number(text) : undefined;
}
