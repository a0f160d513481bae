import { describe, expect, it } from 'vitest';
import { type SseEvent, SseEventTooLargeError, SseParser } from '../../src/upstream/sse-parser.ts';

function parseChunks(chunks: Buffer[], maxEventBytes = 1 << 20): SseEvent[] {
  const p = new SseParser({ maxEventBytes });
  return chunks.flatMap((c) => p.push(c));
}

const view = (evs: SseEvent[]) => ({
  data: evs.map((e) => e.data),
  raw: Buffer.concat(evs.map((e) => e.raw)).toString('utf8'),
});

describe('SseParser', () => {
  // Multi-byte UTF-8 (2, 3 and 4 bytes), every line ending style, a BOM, a comment, an id field
  // and a multi-line data field.
  const stream = Buffer.concat([
    Buffer.from([0xef, 0xbb, 0xbf]),
    Buffer.from(
      ': keep-alive\r\n\r\n' +
        'data: {"c":"héllo €"}\r\n\r\n' +
        'data: 𝄞 clef\n\n' +
        'id: 7\rdata: a\rdata:b\r\r' +
        'data: [DONE]\n\n',
      'utf8',
    ),
  ]);

  it('splits at every byte offset into the same events (item 21)', () => {
    const whole = view(parseChunks([stream]));
    expect(whole.raw).toBe(stream.subarray(3).toString('utf8'));
    expect(whole.data).toEqual([null, '{"c":"héllo €"}', '𝄞 clef', 'a\nb', '[DONE]']);
    for (let i = 0; i <= stream.length; i++) {
      for (const j of [i, Math.min(stream.length, i + 1), Math.min(stream.length, i + 3)]) {
        const parts = [stream.subarray(0, i), stream.subarray(i, j), stream.subarray(j)];
        expect(view(parseChunks(parts)), `split at ${i}/${j}`).toEqual(whole);
      }
    }
  });

  it('splits into one-byte chunks into the same events', () => {
    const bytes = [...stream].map((b) => Buffer.from([b]));
    expect(view(parseChunks(bytes))).toEqual(view(parseChunks([stream])));
  });

  it('reads a stream sent one event per chunk (its fast path) as the same bytes whole', () => {
    const events = [
      'data: {"a":1}\n\n',
      'data:{"b":2}\n\n',
      'data: \n\n',
      'data: cr\r\n\r\n',
      'event: x\ndata: y\n\n',
      'data: two\ndata: lines\n\n',
      ': comment\n\n',
      'data: [DONE]\n\n',
    ];
    const whole = parseChunks([Buffer.from(events.join(''))]);
    const each = parseChunks(events.map((e) => Buffer.from(e)));
    expect(each.map((e) => [e.data, e.raw.toString()])).toEqual(whole.map((e) => [e.data, e.raw.toString()]));
    expect(each.map((e) => e.data)).toEqual([
      '{"a":1}',
      '{"b":2}',
      '',
      'cr',
      'y',
      'two\nlines',
      null,
      '[DONE]',
    ]);
    // The size limit is the same on both paths: the data line and its LF count.
    expect(() => new SseParser({ maxEventBytes: 6 }).push(Buffer.from('data: \n\n'))).toThrow(
      SseEventTooLargeError,
    );
    expect(new SseParser({ maxEventBytes: 7 }).push(Buffer.from('data: \n\n'))).toHaveLength(1);
    // A whole event right after an unfinished line belongs to that line's event.
    const p = new SseParser({ maxEventBytes: 1024 });
    expect(p.push(Buffer.from('data: par'))).toHaveLength(0);
    expect(p.push(Buffer.from('data: x\n\n')).map((e) => e.data)).toEqual(['pardata: x']);
  });

  it('keeps each event as its original bytes, without the BOM', () => {
    const evs = parseChunks([stream]).map((e) => e.raw.toString('utf8'));
    expect(evs[0]).toBe(': keep-alive\r\n\r\n');
    expect(evs[1]).toBe('data: {"c":"héllo €"}\r\n\r\n');
    expect(evs[3]).toBe('id: 7\rdata: a\rdata:b\r\r');
  });

  it('drops an unfinished event at the end and ignores stray blank lines', () => {
    const p = new SseParser({ maxEventBytes: 1024 });
    expect(p.push(Buffer.from('\n\ndata: x\n\ndata: partial'))).toHaveLength(1);
    p.end();
    expect(p.push(Buffer.from('\n'))).toHaveLength(0);
  });

  it('throws instead of buffering an oversized event, even one without a line end (item 22)', () => {
    const p = new SseParser({ maxEventBytes: 1000 });
    expect(p.push(Buffer.from(`data: ${'x'.repeat(900)}\n\n`))).toHaveLength(1);
    expect(() => {
      for (let i = 0; i < 100; i++) p.push(Buffer.from('y'.repeat(100)));
    }).toThrow(SseEventTooLargeError);
    const q = new SseParser({ maxEventBytes: 1000 });
    expect(() => {
      for (let i = 0; i < 100; i++) q.push(Buffer.from(`data: ${'z'.repeat(50)}\n`));
    }).toThrow(SseEventTooLargeError);
  });

  it('counts a line that straddles chunks whole: data lines each split across two reads still hit the limit', () => {
    // Each read ends mid-line and the next completes it: 100 lines of 56 bytes, 5,600 in one event.
    const p = new SseParser({ maxEventBytes: 1000 });
    let pushed = 0;
    expect(() => {
      p.push(Buffer.from(`data: ${'w'.repeat(25)}`));
      for (let i = 0; i < 100; i++) {
        p.push(Buffer.from(`${'w'.repeat(25)}\ndata: ${'w'.repeat(25)}`));
        pushed += 56;
      }
    }).toThrow(SseEventTooLargeError);
    // It throws as soon as what it holds passes the limit, not after all of it.
    expect(pushed).toBeLessThanOrEqual(1000);
  });
});
