// The shared log's wire form of prefix blocks: what one instance tells the others of the blocks it
// sent each backend (docs/state.md, "The prefix index"). Pure text in and out;
// the live state decides what to tell and what to learn.
import { createHash } from 'node:crypto';

/**
 * The version of how a prompt's chain of hashes is made (src/prompt/canonical.ts: the root, the
 * markers). Invariant: two instances share blocks only when they hash alike: a change there bumps
 * this, and an instance skips the blocks its peers of another version tell (a rolling upgrade, a
 * restart within the log's lifetime), as it skips those of another block size. 1 was untagged
 * (the size alone); 2 names the endpoint in the root and marks roles; 3 puts a piece's length
 * after its text (a shared opening of one message shares its blocks).
 */
export const PREFIX_HASHING = 3;

/**
 * `backend@size.v:h,h,…,~digest/start;backend@size.v:h,…,~digest` with each 53-bit hash in base 36
 * ('' when there is nothing); `tag` is `@size.v`, or '' for untagged parts; `~digest` the backend's
 * server (urlKey: base64url, so no ',', ';', ':', '@' or '/' in it); `/start` the backend's engine
 * start (process_start_time_seconds) as the sender knows it, absent when it knows none. A backend
 * name never holds '@' (SAFE_NAME), and a version that predates the tag reads a tagged part as an
 * unknown backend and skips it. The digest and the start go last, where a version that predates
 * them reads no hash in `~digest` (parseInt gives NaN, which it drops) and learns the part as
 * before.
 */
export function encodePrefixLog(
  recent: Map<string, number[]>,
  tag: string,
  entryOf: (backend: string) => { server: string; startS: number | null } | undefined,
): string {
  const parts: string[] = [];
  for (const [backend, hashes] of recent) {
    const entry = entryOf(backend);
    if (hashes.length === 0 || entry === undefined) continue;
    const start = entry.startS;
    parts.push(
      `${backend}${tag}:${hashes.map((h) => h.toString(36)).join(',')},~${entry.server}${start === null ? '' : `/${start}`}`,
    );
  }
  return parts.join(';');
}

/**
 * What a log part names a backend's server by, beside its name: a digest of its URL, short, after
 * the hashes (`~` and the digest: a version before this one reads it as no hash, and skips it). A
 * name is the operator's, and a reload may move it to another server, reaching one instance
 * before another: parts told of the other server are skipped, not learnt as this one's.
 */
export function urlKey(url: string): string {
  return createHash('sha256').update(url).digest('base64url').slice(0, 8);
}

/**
 * The inverse of encodePrefixLog for parts tagged `tag` (exactly: an untagged reader reads only
 * untagged parts); any other part, or a malformed one, is skipped on its own.
 */
export function decodePrefixLog(
  text: string,
  tag: string,
  insert: (backend: string, server: string | null, hashes: number[], startS: number | null) => void,
): void {
  for (const part of text.split(';')) {
    const colon = part.indexOf(':');
    if (colon <= 0) continue;
    const at = part.indexOf('@');
    const nameEnd = at >= 0 && at < colon ? at : colon;
    if (part.slice(nameEnd, colon) !== tag) continue;
    const slash = part.indexOf('/', colon);
    const start = slash < 0 ? null : Number(part.slice(slash + 1));
    const tokens = part.slice(colon + 1, slash < 0 ? undefined : slash).split(',');
    // A part without the server's digest (written before parts had it) is taken as of the name's.
    const last = tokens.at(-1) ?? '';
    const server = last.startsWith('~') ? last.slice(1) : null;
    const hashes = tokens.map((h) => Number.parseInt(h, 36)).filter((h) => Number.isSafeInteger(h) && h >= 0);
    if (hashes.length > 0)
      insert(part.slice(0, nameEnd), server, hashes, start !== null && Number.isFinite(start) ? start : null);
  }
}
