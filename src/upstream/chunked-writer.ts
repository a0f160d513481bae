// A committed stream's events, written to the client as HTTP/1.1 chunks on its socket.
//
// Why not res.write: ServerResponse frames every call itself, as three writes into a corked socket
// (the size line, the bytes, CRLF), a process.nextTick to uncork, and a writev of the three parts.
// A relayed stream makes that call once per event. Framing the chunk here and writing it whole
// costs one buffer and one write per event.
//
// Invariants:
// - A writer exists only once the response's head is on its socket and the response is chunked
//   (ChunkedWriter.of). Before that, and for a response Node does not chunk (an HTTP/1.0 client),
//   the relay writes through res.write.
// - Bytes handed over in one tick (one upstream read can carry several events) leave as one chunk
//   in one write, at the end of the tick, as res.write's cork made them do.
// - ServerResponse still ends the response: res.end() writes the last chunk. Whoever ends or
//   destroys the response calls flush() or discard() first, so that nothing written here can
//   follow the last chunk, and nothing is written to a destroyed socket.
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

const CRLF = 0x0a0d; // "\r\n" as a little-endian uint16

export class ChunkedWriter {
  readonly socket: Socket;
  readonly #onWritten: (ok: boolean) => void;
  /** What is queued for this tick's write: the first #n slots, the list kept from write to write. */
  readonly #pending: (Buffer | undefined)[] = [];
  #n = 0;
  #queued = false;

  private constructor(socket: Socket, onWritten: (ok: boolean) => void) {
    this.socket = socket;
    this.#onWritten = onWritten;
  }

  /**
   * A writer for `res` once its head has been written, or null when the response must keep going
   * through res.write. `onWritten` gets each write's result (false: the socket's buffer is full,
   * 'drain' on `socket` follows).
   */
  static of(res: ServerResponse, onWritten: (ok: boolean) => void): ChunkedWriter | null {
    const socket = res.socket as Socket | null;
    // `chunkedEncoding` is set by writeHead when Node frames the body in chunks (not for an
    // HTTP/1.0 client, or with a content-length).
    const chunked = (res as ServerResponse & { chunkedEncoding?: boolean }).chunkedEncoding === true;
    return socket !== null && chunked && res.headersSent && !socket.destroyed
      ? new ChunkedWriter(socket, onWritten)
      : null;
  }

  /** Queues bytes for the write at the end of this tick. */
  push(b: Buffer): void {
    this.#pending[this.#n++] = b;
    if (this.#queued) return;
    this.#queued = true;
    process.nextTick(this.#flushQueued);
  }

  /** Writes what is queued now, as one chunk. */
  flush(): void {
    if (this.#n === 0) return;
    // The framed chunk holds copies: the slots are emptied before the write, whose callbacks could
    // push again. (Emptied slot by slot: a list cut to length 0 loses its storage, and would make
    // it anew at every event.)
    const chunk = frame(this.#pending, this.#n);
    this.discard();
    const socket = this.socket;
    if (socket.destroyed || socket.writableEnded) return;
    this.#onWritten(socket.write(chunk));
  }

  /** Drops what is queued (the response is being destroyed). */
  discard(): void {
    const pending = this.#pending;
    for (let i = 0; i < this.#n; i++) pending[i] = undefined;
    this.#n = 0;
  }

  #flushQueued = (): void => {
    this.#queued = false;
    this.flush();
  };
}

/** The first `count` of `bufs` as one HTTP/1.1 chunk: the size in hex, CRLF, the bytes, CRLF. */
function frame(bufs: readonly (Buffer | undefined)[], count: number): Buffer {
  let n = 0;
  for (let i = 0; i < count; i++) n += bufs[i]!.length;
  const size = n.toString(16);
  const out = Buffer.allocUnsafe(size.length + 2 + n + 2);
  let at = out.write(size, 0, 'latin1');
  at = out.writeUInt16LE(CRLF, at);
  for (let i = 0; i < count; i++) at += bufs[i]!.copy(out, at);
  out.writeUInt16LE(CRLF, at);
  return out;
}
