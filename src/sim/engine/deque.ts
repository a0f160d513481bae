// A growable ring buffer: O(1) push and pop at both ends, for the waiting queue (FCFS at the
// back, preempted requests at the front).

export class Deque<T> {
  private buf: (T | undefined)[] = new Array(16);
  private head = 0;
  private size = 0;

  peekFront(): T | undefined {
    return this.size === 0 ? undefined : this.buf[this.head];
  }

  pushBack(x: T): void {
    if (this.size === this.buf.length) this.grow();
    this.buf[(this.head + this.size) % this.buf.length] = x;
    this.size++;
  }

  pushFront(x: T): void {
    if (this.size === this.buf.length) this.grow();
    this.head = (this.head - 1 + this.buf.length) % this.buf.length;
    this.buf[this.head] = x;
    this.size++;
  }

  shift(): T | undefined {
    if (this.size === 0) return undefined;
    const x = this.buf[this.head];
    this.buf[this.head] = undefined;
    this.head = (this.head + 1) % this.buf.length;
    this.size--;
    return x;
  }

  clear(): void {
    this.buf = new Array(16);
    this.head = 0;
    this.size = 0;
  }

  private grow(): void {
    const old = this.buf;
    const next: (T | undefined)[] = new Array(old.length * 2);
    for (let i = 0; i < this.size; i++) next[i] = old[(this.head + i) % old.length];
    this.buf = next;
    this.head = 0;
  }
}
