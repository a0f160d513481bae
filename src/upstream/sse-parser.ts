// Incremental Server-Sent Events parser working on raw bytes (WHATWG "event stream
// interpretation"): lines end in CR, LF or CRLF, a leading UTF-8 BOM is dropped, a line starting
// with ':' is a comment, a blank line ends an event. Each event keeps its original bytes so the
// relay can forward it unchanged without re-serialising.
//
// Invariant: bytes are decoded only as whole lines. CR (0x0d) and LF (0x0a) never occur inside a
// multi-byte UTF-8 sequence, so a character split across network chunks is always reassembled
// before decoding, and the result equals a streaming TextDecoder over the same bytes.

const LF = 0x0a;
const CR = 0x0d;
const COLON = 0x3a;
const SPACE = 0x20;
const BOM = Buffer.from([0xef, 0xbb, 0xbf]);
const DATA = Buffer.from('data');
const [DATA_0, DATA_1, DATA_2, DATA_3] = DATA;

export interface SseEvent {
  /**
   * The `data` field lines joined by '\n', decoded on first read (a relay that only forwards the
   * event never pays for it); null when the event had no data field (a comment or keep-alive).
   */
  readonly data: string | null;
  /** The same value as bytes, undecoded: the relay classifies an event by these. */
  readonly dataBytes: Buffer | null;
  /**
   * The event's bytes as received, through its terminating blank line (it may start with the LF
   * of a CRLF split across chunks). All raws concatenated equal the stream, minus a BOM and the
   * blank lines that stand alone, before any field (they carry no event and are not returned).
   */
  readonly raw: Buffer;
}

const NEWLINE = Buffer.from([LF]);

class Event implements SseEvent {
  readonly dataBytes: Buffer | null;
  readonly raw: Buffer;
  #data: string | null | undefined = undefined;
  constructor(dataBytes: Buffer | null, raw: Buffer) {
    this.dataBytes = dataBytes;
    this.raw = raw;
  }
  get data(): string | null {
    if (this.#data === undefined)
      this.#data = this.dataBytes === null ? null : this.dataBytes.toString('utf8');
    return this.#data;
  }
}

/** An event (or one line) grew past the configured maximum before it ended. */
export class SseEventTooLargeError extends Error {
  constructor(limit: number) {
    super(`SSE event exceeds ${limit} bytes`);
    this.name = 'SseEventTooLargeError';
  }
}

export class SseParser {
  readonly #maxEventBytes: number;
  /** Stream start: up to 3 bytes held back until we know whether they are a BOM. */
  #head: Buffer | null = Buffer.alloc(0);
  /** The previous chunk ended in CR, so a leading LF in the next chunk belongs to that line end. */
  #skipLf = false;
  /** Bytes of the current, unfinished line from earlier chunks. */
  #lineParts: Buffer[] = [];
  /** Bytes of the current, unfinished event from earlier chunks (they include #lineParts' bytes). */
  #eventParts: Buffer[] = [];
  #eventBytes = 0;
  /** Values of the current event's data lines, as bytes (whole lines only: see the invariant). */
  #dataLines: Buffer[] = [];

  constructor(opts: { maxEventBytes: number }) {
    this.#maxEventBytes = opts.maxEventBytes;
  }

  /** Feeds bytes; returns the events completed by them. Throws SseEventTooLargeError. */
  push(input: Buffer): SseEvent[] {
    let chunk = input;
    if (this.#head !== null) {
      const head = Buffer.concat([this.#head, chunk]);
      if (head.length < BOM.length && BOM.subarray(0, head.length).equals(head)) {
        this.#head = head;
        return [];
      }
      this.#head = null;
      chunk = head.subarray(0, BOM.length).equals(BOM) ? head.subarray(BOM.length) : head;
    }
    return this.#scan(chunk);
  }

  /** The stream ended; an unfinished event is discarded, as the SSE specification says. */
  end(): void {
    this.#lineParts = [];
    this.#eventParts = [];
    this.#eventBytes = 0;
    this.#dataLines = [];
  }

  #scan(chunk: Buffer): SseEvent[] {
    const one = this.#wholeDataEvent(chunk);
    if (one !== null) return [one];
    const events: SseEvent[] = [];
    let pos = 0;
    if (this.#skipLf && chunk.length > 0) {
      this.#skipLf = false;
      // The LF of a CRLF split across chunks ends no line of its own. Its byte stays in the raw
      // bytes (of the current event, or leading the next one), so raw bytes concatenate back to
      // exactly the stream received.
      if (chunk[0] === LF) pos = 1;
    }
    let eventStart = 0;
    let nextCr = -2;
    while (pos < chunk.length) {
      const lf = chunk.indexOf(LF, pos);
      if (nextCr !== -1 && nextCr < pos) nextCr = chunk.indexOf(CR, pos);
      let end: number;
      if (lf === -1 && nextCr === -1) break;
      if (nextCr === -1 || (lf !== -1 && lf < nextCr)) end = lf;
      else end = nextCr;
      let after = end + 1;
      if (chunk[end] === CR) {
        if (after < chunk.length) {
          if (chunk[after] === LF) after++;
        } else {
          this.#skipLf = true;
        }
      }
      this.#checkSize(end - pos);
      const line = this.#takeLine(chunk.subarray(pos, end));
      if (line.length === 0) {
        this.#eventParts.push(chunk.subarray(eventStart, after));
        const ev = this.#dispatch();
        if (ev !== null) events.push(ev);
        eventStart = after;
      } else {
        // The whole line: its head from earlier chunks left #lineParts (where #checkSize counted
        // it) when #takeLine joined it to this tail.
        this.#eventBytes += line.length + (after - end);
        this.#field(line);
      }
      pos = after;
    }
    if (pos < chunk.length) {
      const rest = chunk.subarray(pos);
      this.#checkSize(rest.length);
      this.#lineParts.push(rest);
    }
    // Held parts are views: undici hands each socket read over in a fresh buffer it never reuses.
    if (eventStart < chunk.length) this.#eventParts.push(chunk.subarray(eventStart));
    return events;
  }

  /**
   * The common case, read without the line machinery: nothing is pending and the chunk is exactly
   * one event of one data line (`data: …` LF LF, no CR anywhere), as vLLM writes each token. The
   * event is what #scan would make of the same bytes; anything else returns null and takes #scan.
   */
  #wholeDataEvent(chunk: Buffer): SseEvent | null {
    const n = chunk.length;
    if (this.#skipLf || this.#eventParts.length > 0 || this.#lineParts.length > 0) return null;
    if (n < 7 || chunk[n - 1] !== LF || chunk[n - 2] !== LF) return null;
    // `data:`, byte by byte (a view to compare with would be one more object per event).
    if (chunk[0] !== DATA_0 || chunk[1] !== DATA_1 || chunk[2] !== DATA_2 || chunk[3] !== DATA_3) return null;
    if (chunk[4] !== COLON) return null;
    // The general path counts the data line and its LF against the limit: so does this one.
    if (n - 1 > this.#maxEventBytes || chunk.indexOf(LF, 5) !== n - 2 || chunk.indexOf(CR) !== -1)
      return null;
    const valueStart = chunk[5] === SPACE ? 6 : 5;
    return new Event(chunk.subarray(valueStart, n - 2), chunk);
  }

  /** Guards memory: the unfinished event (and its current line) must stay under the limit. */
  #checkSize(extra: number): void {
    let held = this.#eventBytes + extra;
    for (const p of this.#lineParts) held += p.length;
    if (held > this.#maxEventBytes) throw new SseEventTooLargeError(this.#maxEventBytes);
  }

  #takeLine(tail: Buffer): Buffer {
    if (this.#lineParts.length === 0) return tail;
    const line = Buffer.concat([...this.#lineParts, tail]);
    this.#lineParts = [];
    return line;
  }

  #field(line: Buffer): void {
    if (line[0] === COLON) return;
    const colon = line.indexOf(COLON);
    const nameEnd = colon === -1 ? line.length : colon;
    if (nameEnd !== DATA.length || !line.subarray(0, nameEnd).equals(DATA)) return;
    let valueStart = colon === -1 ? line.length : colon + 1;
    if (line[valueStart] === SPACE) valueStart++;
    this.#dataLines.push(line.subarray(valueStart));
  }

  #dispatch(): SseEvent | null {
    const raw = this.#eventParts.length === 1 ? this.#eventParts[0]! : Buffer.concat(this.#eventParts);
    this.#eventParts = [];
    this.#eventBytes = 0;
    const lines = this.#dataLines;
    let data: Buffer | null = null;
    if (lines.length === 1) data = lines[0]!;
    else if (lines.length > 1) data = Buffer.concat(lines.flatMap((l, i) => (i === 0 ? [l] : [NEWLINE, l])));
    if (lines.length > 0) this.#dataLines = [];
    // Blank lines with nothing before them carry no event.
    if (data === null && raw.every((b) => b === CR || b === LF)) return null;
    return new Event(data, raw);
  }
}
