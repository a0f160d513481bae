// The body the backend gets, built from the client's own bytes. Streamed upstream (every mode but
// a pass-through), it must say `"stream": true` and ask for the usage chunk; with
// `upstream.forward_priority` it carries the class priority; a body that named no model names the
// one the gateway gave it; with tenants configured, an isolated tenant's request, and any that
// names a salt, carries the cache_salt the gateway makes (src/server/cache-salt.ts). Those few members are appended to
// the client's JSON object just before its closing brace instead of re-serialising the whole body:
// a prompt of 32,000 characters is then copied once, never walked by JSON.stringify.
//
// Invariant: JSON.parse(payload) equals the client's body with the appended members set (JSON
// parsers, Python's json that vLLM reads requests with among them, keep the last of duplicate
// keys, so an appended `stream` overrides the client's). The parsed `stream_options` is merged,
// not replaced: the client's other options (continuous_usage_stats, ...) go through.
// A leading UTF-8 byte-order mark is dropped (the body parser skips it too). When the raw bytes
// are not a plain object text (absent, trailing bytes after the object) or not valid UTF-8 (vLLM's
// parser would refuse the bytes), the body is re-serialised instead: the same JSON value, slower,
// except that a number beyond double precision (a 64-bit seed) is rounded as JSON.parse read it;
// spliced bytes keep it exact.
import { isUtf8 } from 'node:buffer';

const CLOSE_BRACE = 0x7d;
const OPEN_BRACE = 0x7b;

/** JSON whitespace (RFC 8259): space, tab, line feed, carriage return. */
function isJsonSpace(b: number): boolean {
  return b === 0x20 || b === 0x09 || b === 0x0a || b === 0x0d;
}

export interface PayloadSpec {
  /** The client's body bytes as received, or null when only the parsed body is at hand. */
  raw: Buffer | null;
  /** The parsed, validated body (an object). */
  body: Record<string, unknown>;
  /** Ask the backend for a stream with usage (every mode but a pass-through). */
  streamed: boolean;
  /** vLLM's `priority` field, or null to leave the client's body as it is. */
  priority: number | null;
  /** The client asked for usage itself (its stream_options, as vLLM reads them: asksForUsage). */
  clientWantsUsage: boolean;
  /** The model to name when the client's body named none, else null (the body's own stands). */
  model: string | null;
  /** The cache_salt to send instead of the body's own, else null (the body's own, if any, stands). */
  cacheSalt: string | null;
}

/** The members the gateway sets on the upstream body, in the order they are appended. */
function overrides(spec: PayloadSpec): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (spec.model !== null) out.model = spec.model;
  if (spec.priority !== null) out.priority = spec.priority;
  if (spec.cacheSalt !== null) out.cache_salt = spec.cacheSalt;
  if (spec.streamed) {
    const opts = spec.body.stream_options;
    const streamOptions = opts !== null && typeof opts === 'object' ? opts : {};
    out.stream = true;
    const merged: Record<string, unknown> = { ...streamOptions, include_usage: true };
    // vLLM puts usage on every chunk only when include_usage holds too: forcing include_usage must
    // not turn on the continuous_usage_stats of a client that declined usage.
    if (!spec.clientWantsUsage && merged.continuous_usage_stats) merged.continuous_usage_stats = false;
    out.stream_options = merged;
  }
  return out;
}

export function upstreamPayload(spec: PayloadSpec): Buffer {
  const set = overrides(spec);
  const keys = Object.keys(set);
  const raw = spec.raw !== null && isUtf8(spec.raw) ? withoutBom(spec.raw) : null;
  if (keys.length === 0 && raw !== null) return raw;
  const close = raw === null ? -1 : closingBrace(raw);
  if (raw === null || close < 0) return Buffer.from(JSON.stringify({ ...spec.body, ...set }));
  let tail = '';
  for (const k of keys) tail += `,${JSON.stringify(k)}:${JSON.stringify(set[k])}`;
  // An empty object gets no leading comma (the validated body never is one; kept correct anyway).
  if (isEmptyObject(raw, close)) tail = tail.slice(1);
  const out = Buffer.allocUnsafe(close + Buffer.byteLength(tail) + 1);
  raw.copy(out, 0, 0, close);
  const end = close + out.write(tail, close);
  out[end] = CLOSE_BRACE;
  return out;
}

/** `raw` past a leading UTF-8 byte-order mark (EF BB BF), if it has one. */
function withoutBom(raw: Buffer): Buffer {
  return raw.length >= 3 && raw[0] === 0xef && raw[1] === 0xbb && raw[2] === 0xbf ? raw.subarray(3) : raw;
}

/**
 * The offset of the object's closing brace, or -1 when the bytes are not `{ ... }` with nothing
 * but whitespace around it.
 */
function closingBrace(raw: Buffer): number {
  let start = 0;
  while (start < raw.length && isJsonSpace(raw[start]!)) start++;
  if (raw[start] !== OPEN_BRACE) return -1;
  let end = raw.length - 1;
  while (end > start && isJsonSpace(raw[end]!)) end--;
  return end > start && raw[end] === CLOSE_BRACE ? end : -1;
}

/** Only whitespace between the opening brace and the closing one at `close`. */
function isEmptyObject(raw: Buffer, close: number): boolean {
  let i = close - 1;
  while (i >= 0 && isJsonSpace(raw[i]!)) i--;
  return raw[i] === OPEN_BRACE;
}
