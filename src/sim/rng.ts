// A small seeded PRNG so that every simulated output, workload and arrival schedule is a pure
// function of its seed: the same seed gives byte-identical text and send times on any machine.
// Here in the simulator, the lowest layer that needs it; the benchmark imports it from here.
// Core: sfc32 (Chris Doty-Humphrey's small fast counting generator), seeded through splitmix32.

function splitmix32(state: number): () => number {
  let s = state >>> 0;
  return () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return (z ^ (z >>> 16)) >>> 0;
  };
}

/** FNV-1a of a label, so that independent streams can be derived from one seed by name. */
function hashLabel(label: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < label.length; i++) {
    h ^= label.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

export class Rng {
  private a: number;
  private b: number;
  private c: number;
  private d: number;
  /** Second normal deviate of the last Box–Muller pair. */
  private spareNormal: number | null = null;

  constructor(seed: number) {
    const sm = splitmix32(seed);
    this.a = sm();
    this.b = sm();
    this.c = sm();
    this.d = 1;
    // Discard the first outputs: sfc32 mixes poorly for the first few draws.
    for (let i = 0; i < 12; i++) this.nextU32();
  }

  /** An independent stream for a named purpose (e.g. "arrivals", "tenant-3"). */
  fork(label: string): Rng {
    return new Rng((this.nextU32() ^ hashLabel(label)) >>> 0);
  }

  nextU32(): number {
    const t = (((this.a + this.b) >>> 0) + this.d) >>> 0;
    this.d = (this.d + 1) >>> 0;
    this.a = this.b ^ (this.b >>> 9);
    this.b = (this.c + (this.c << 3)) >>> 0;
    this.c = ((this.c << 21) | (this.c >>> 11)) >>> 0;
    this.c = (this.c + t) >>> 0;
    return t;
  }

  /** Uniform on [0, 1). */
  next(): number {
    return this.nextU32() / 4294967296;
  }

  /** Uniform integer on [lo, hi] (both inclusive). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }

  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new Error('pick from an empty list');
    return items[Math.floor(this.next() * items.length)] as T;
  }

  /** Standard normal deviate (Box–Muller, both values of each pair used). */
  normal(): number {
    if (this.spareNormal !== null) {
      const z = this.spareNormal;
      this.spareNormal = null;
      return z;
    }
    const u = 1 - this.next(); // (0, 1]: log(u) is finite
    const v = this.next();
    const r = Math.sqrt(-2 * Math.log(u));
    this.spareNormal = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }

  /** Lognormal given its median (= e^mu) and sigma of the underlying normal. */
  lognormal(median: number, sigma: number): number {
    return median * Math.exp(sigma * this.normal());
  }

  /** Gamma(shape, scale) by Marsaglia–Tsang; shape < 1 via the U^(1/shape) boost. */
  gamma(shape: number, scale: number): number {
    if (!(shape > 0) || !(scale > 0)) throw new Error(`gamma needs shape > 0 and scale > 0`);
    if (shape < 1) {
      const u = 1 - this.next();
      return this.gamma(shape + 1, scale) * u ** (1 / shape);
    }
    const d = shape - 1 / 3;
    const c = 1 / Math.sqrt(9 * d);
    for (;;) {
      let x: number;
      let v: number;
      do {
        x = this.normal();
        v = 1 + c * x;
      } while (v <= 0);
      v = v * v * v;
      const u = 1 - this.next();
      if (u < 1 - 0.0331 * x ** 4) return d * v * scale;
      if (Math.log(u) < 0.5 * x * x + d * (1 - v + Math.log(v))) return d * v * scale;
    }
  }
}
