/**
 * HTTP/2 (RFC 9113) constants and frame encoding, just what a gRPC server needs.
 */

export const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');
export const FRAME_HEADER_LENGTH = 9;
export const DEFAULT_WINDOW = 65_535;
export const DEFAULT_MAX_FRAME = 16_384;
export const MAX_WINDOW = 2 ** 31 - 1;

export const FrameType = {
  Data: 0,
  Headers: 1,
  Priority: 2,
  RstStream: 3,
  Settings: 4,
  PushPromise: 5,
  Ping: 6,
  GoAway: 7,
  WindowUpdate: 8,
  Continuation: 9,
} as const;

export const Flag = {
  EndStream: 0x1,
  Ack: 0x1,
  EndHeaders: 0x4,
  Padded: 0x8,
  Priority: 0x20,
} as const;

export const Setting = {
  HeaderTableSize: 1,
  EnablePush: 2,
  MaxConcurrentStreams: 3,
  InitialWindowSize: 4,
  MaxFrameSize: 5,
  MaxHeaderListSize: 6,
} as const;

export const ErrorCode = {
  NoError: 0,
  ProtocolError: 1,
  InternalError: 2,
  FlowControlError: 3,
  StreamClosed: 5,
  FrameSizeError: 6,
  RefusedStream: 7,
  Cancel: 8,
  CompressionError: 9,
  EnhanceYourCalm: 11,
} as const;

/** One frame: 9-byte header then payload, as one buffer. */
export function frame(type: number, flags: number, streamId: number, payload?: Uint8Array): Buffer {
  const length = payload?.length ?? 0;
  const out = Buffer.allocUnsafe(FRAME_HEADER_LENGTH + length);
  out.writeUIntBE(length, 0, 3);
  out[3] = type;
  out[4] = flags;
  out.writeUInt32BE(streamId & 0x7fffffff, 5);
  if (payload !== undefined) out.set(payload, FRAME_HEADER_LENGTH);
  return out;
}

export function settingsFrame(settings: readonly (readonly [number, number])[]): Buffer {
  const payload = Buffer.allocUnsafe(settings.length * 6);
  settings.forEach(([id, value], i) => {
    payload.writeUInt16BE(id, i * 6);
    payload.writeUInt32BE(value, i * 6 + 2);
  });
  return frame(FrameType.Settings, 0, 0, payload);
}

export function windowUpdateFrame(streamId: number, increment: number): Buffer {
  const payload = Buffer.allocUnsafe(4);
  payload.writeUInt32BE(increment & 0x7fffffff, 0);
  return frame(FrameType.WindowUpdate, 0, streamId, payload);
}

export function rstStreamFrame(streamId: number, code: number): Buffer {
  const payload = Buffer.allocUnsafe(4);
  payload.writeUInt32BE(code, 0);
  return frame(FrameType.RstStream, 0, streamId, payload);
}

export function goAwayFrame(lastStreamId: number, code: number, debug = ''): Buffer {
  const text = Buffer.from(debug, 'utf8');
  const payload = Buffer.allocUnsafe(8 + text.length);
  payload.writeUInt32BE(lastStreamId & 0x7fffffff, 0);
  payload.writeUInt32BE(code, 4);
  payload.set(text, 8);
  return frame(FrameType.GoAway, 0, 0, payload);
}
