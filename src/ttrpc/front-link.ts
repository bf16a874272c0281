import { Request } from '../gen/ttrpc/request.js';
import { FrameType, encodeFrame } from './frame.js';

/**
 * What the task front says to tsbox of its own on their private connection, beside the calls
 * it relays: that containerd's connection carrying some calls has closed, so nobody waits for
 * their answers (ttrpc itself has no cancel). It is a ttrpc request to a service no client
 * of the task socket can reach: the front relays only containerd's frames, and tsbox serves it
 * only on the front's connection.
 */
export const FRONT_SERVICE = 'tsbox.front.v1.Front';
export const FRONT_CANCEL = 'Cancel';

/** The request frame telling tsbox that the calls on `streamIds` (of the front's connection) are abandoned. */
export function encodeCancel(streamId: number, streamIds: Iterable<number>): Buffer {
  const payload = cancelPayload(streamIds);
  return encodeFrame(streamId, FrameType.Request, Request.encode({ service: FRONT_SERVICE, method: FRONT_CANCEL, payload, timeoutNano: 0, metadata: [] }).finish());
}

/** A cancel request's payload: each stream id as 4 bytes, big-endian. */
export function cancelPayload(streamIds: Iterable<number>): Buffer {
  const ids = [...streamIds];
  const payload = Buffer.alloc(4 * ids.length);
  ids.forEach((id, i) => payload.writeUInt32BE(id, 4 * i));
  return payload;
}

/** The stream ids of a cancel request's payload; undefined when it is not a list of them. */
export function decodeCancel(payload: Uint8Array): number[] | undefined {
  if (payload.length % 4 !== 0) return undefined;
  const view = Buffer.from(payload.buffer, payload.byteOffset, payload.length);
  const ids: number[] = [];
  for (let i = 0; i < payload.length; i += 4) ids.push(view.readUInt32BE(i));
  return ids;
}

/**
 * True when a request frame's payload calls the front's own service: no client of the task
 * socket may, or it could end other clients' calls. What does not decode is not one.
 */
export function namesFrontService(payload: Uint8Array): boolean {
  try {
    return Request.decode(payload).service === FRONT_SERVICE;
  } catch {
    return false; // not a request: tsbox answers it as such
  }
}
