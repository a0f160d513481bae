// A binary min-heap over a comparator, with lazy removal: an item that is no longer wanted is
// skipped when it reaches the top (`alive` says which), so removing from the middle is O(1) and
// the heap never needs a position index. Invariant: every live item is in the array exactly once.

export class Heap<T> {
  readonly #items: T[] = [];
  readonly #before: (a: T, b: T) => boolean;
  readonly #alive: (item: T) => boolean;

  /** `before(a, b)`: a comes out first. */
  constructor(before: (a: T, b: T) => boolean, alive: (item: T) => boolean) {
    this.#before = before;
    this.#alive = alive;
  }

  push(item: T): void {
    const a = this.#items;
    a.push(item);
    let i = a.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!this.#before(a[i] as T, a[parent] as T)) break;
      [a[i], a[parent]] = [a[parent] as T, a[i] as T];
      i = parent;
    }
  }

  /** The first live item, without removing it (dead items above it are dropped on the way). */
  peek(): T | undefined {
    const a = this.#items;
    while (a.length > 0 && !this.#alive(a[0] as T)) this.#popTop();
    return a[0];
  }

  pop(): T | undefined {
    const top = this.peek();
    if (top !== undefined) this.#popTop();
    return top;
  }

  /** Every item held, in no particular order (dead ones included). */
  values(): readonly T[] {
    return this.#items;
  }

  /** Drops every dead item now (for when many die below the top and never surface). */
  compact(): void {
    const live = this.#items.filter(this.#alive);
    this.#items.length = 0;
    for (const item of live) this.push(item);
  }

  #popTop(): void {
    const a = this.#items;
    const last = a.pop() as T;
    if (a.length === 0) return;
    a[0] = last;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < a.length && this.#before(a[l] as T, a[m] as T)) m = l;
      if (r < a.length && this.#before(a[r] as T, a[m] as T)) m = r;
      if (m === i) return;
      [a[i], a[m]] = [a[m] as T, a[i] as T];
      i = m;
    }
  }
}
