import { z } from 'zod';
import { podSpecSchema } from '../controller/pod-spec.js';

const identifier = z.string().regex(/^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$/).max(76);
const timestamp = z.object({ seconds: z.number().int(), nanos: z.number().int().min(0).max(999_999_999) });

/** The on-disk record, version 1. Anything else is quarantined, never guessed at. */
export const recordSchema = z.object({
  version: z.literal(1),
  namespace: identifier,
  id: identifier,
  state: z.enum(['created', 'starting', 'running', 'exited']),
  registeredAt: timestamp,
  startedAt: timestamp.optional(),
  pid: z.number().int().min(0).optional(),
  launch: z.object({
    hostname: z.string().optional(),
    netnsPath: z.string().optional(),
    command: z
      .object({ args: z.array(z.string()).min(1), env: z.array(z.string()), cwd: z.string() })
      .optional(),
    pod: podSpecSchema.optional(),
  }),
  labels: z.record(z.string(), z.string()),
  annotations: z.record(z.string(), z.string()),
  extensions: z.record(z.string(), z.object({ typeUrl: z.string(), value: z.string() })),
  backend: z.unknown().optional(),
  endpoint: z.object({ address: z.string(), version: z.number().int().min(0) }).optional(),
  exit: z
    .object({ status: z.number().int().min(0).max(255), exitedAt: timestamp, reason: z.string() })
    .optional(),
});
