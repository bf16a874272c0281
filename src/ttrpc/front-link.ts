/**
 * What the task front (native/tsbox-front.c) says to tsbox of its own on their private
 * connection, beside the calls it relays: that containerd's connection carrying some calls has
 * closed, so nobody waits for their answers (ttrpc itself has no cancel). It is a ttrpc request
 * (service FRONT_SERVICE, method FRONT_CANCEL, on a stream id of the front's own) to a service
 * no client of the task socket can reach: the front closes a client that names it, and tsbox
 * serves it only on the front's connection. Its payload is the abandoned calls' stream ids (of
 * the front's connection), each as 4 bytes, big-endian.
 */
export const FRONT_SERVICE = 'tsbox.front.v1.Front';
export const FRONT_CANCEL = 'Cancel';

/** The stream ids of a cancel request's payload; undefined when it is not a list of them. */
export function decodeCancel(payload: Uint8Array): number[] | undefined {
  if (payload.length % 4 !== 0) return undefined;
  const view = Buffer.from(payload.buffer, payload.byteOffset, payload.length);
  const ids: number[] = [];
  for (let i = 0; i < payload.length; i += 4) ids.push(view.readUInt32BE(i));
  return ids;
}
