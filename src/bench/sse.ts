// Incremental server-sent-events framing: bytes arrive in arbitrary pieces, events end at a
// blank line. Only the `data` field matters to an OpenAI stream; comments (":" lines, used as
// keep-alive pings) and other fields are dropped.

export class SseDecoder {
  private readonly decoder = new TextDecoder();
  private buffer = '';
  /** A CR at the end of a piece is held back: it may be the first half of a CRLF. */
  private carry = '';

  /** Feed raw bytes; returns the data payloads of every event completed by them. */
  push(bytes: Uint8Array): string[] {
    let text = this.carry + this.decoder.decode(bytes, { stream: true });
    this.carry = '';
    if (text.endsWith('\r')) {
      this.carry = '\r';
      text = text.slice(0, -1);
    }
    this.buffer += text.replace(/\r\n?/g, '\n');
    const events: string[] = [];
    for (;;) {
      const end = this.buffer.indexOf('\n\n');
      if (end < 0) break;
      const data = dataOf(this.buffer.slice(0, end));
      this.buffer = this.buffer.slice(end + 2);
      if (data !== null) events.push(data);
    }
    return events;
  }

  /** At end of stream: a final event not followed by a blank line still counts. */
  end(): string[] {
    const rest = this.buffer + (this.carry + this.decoder.decode()).replace(/\r\n?/g, '\n');
    this.buffer = '';
    this.carry = '';
    const data = dataOf(rest);
    return data === null ? [] : [data];
  }
}

/** The joined `data:` lines of one event, or null when it has none. */
function dataOf(event: string): string | null {
  let data: string | null = null;
  for (const line of event.split('\n')) {
    if (!line.startsWith('data:')) continue;
    const value = line.startsWith('data: ') ? line.slice(6) : line.slice(5);
    data = data === null ? value : `${data}\n${value}`;
  }
  return data;
}
