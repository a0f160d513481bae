// Active health checking: GET <url><path> at start and then every interval, on a dedicated
// one-connection client, so probes never queue behind long streams in the backend's request pool.
// A backend starts up (traffic is not refused while the first probe is pending: a refused
// connection is retried elsewhere at no cost to any engine), but not `confirmed` until a probe has
// passed, and readiness waits for that (a gateway in front of replicas still loading their weights
// is not ready); `unhealthyThreshold` consecutive failed probes mark it down, `healthyThreshold`
// consecutive good ones (status 200) mark it up; every probe's result is reported too (a passing
// one can end an outlier ejection).
// Invariant: a probe that timed out says nothing of a backend that began an answer to this
// instance since the probe before it: a busy vLLM answers /health from the same event loop as its
// requests, and may answer it late while it serves (seconds under a load spike). Such a probe is
// not counted; one that times out while the backend began no answer to this instance counts (a
// replica busy with other instances' requests, or only with streams begun earlier, can still be
// taken out by two late probes), and one refused or answered with an error counts always.
// Invariant: at most one probe is in flight and at most one timer is pending; stop() clears both.
import { Client } from 'undici';

export interface HealthOptions {
  /** 0 disables active probing. */
  intervalMs: number;
  timeoutMs: number;
  path: string;
  unhealthyThreshold: number;
  healthyThreshold: number;
}

export class HealthProbe {
  readonly #opts: HealthOptions;
  readonly #client: Client;
  readonly #onChange: (up: boolean) => void;
  readonly #onResult: (ok: boolean) => void;
  readonly #answeredAt: () => number | null;
  /** performance.now() when the last probe began (null: none yet). */
  #lastProbeAt: number | null = null;
  #timer: NodeJS.Timeout | null = null;
  #inflight: AbortController | null = null;
  #stopped = false;
  #up = true;
  #confirmed = false;
  #streak = 0;

  constructor(
    url: string,
    opts: HealthOptions,
    onChange: (up: boolean) => void,
    onResult: (ok: boolean) => void = () => {},
    answeredAt: () => number | null = () => null,
  ) {
    this.#opts = opts;
    this.#onChange = onChange;
    this.#onResult = onResult;
    this.#answeredAt = answeredAt;
    this.#client = new Client(url, { connectTimeout: opts.timeoutMs, pipelining: 1 });
  }

  get up(): boolean {
    return this.#up;
  }

  /** A probe has passed (or probing is off: nothing to wait for). */
  get confirmed(): boolean {
    return this.#confirmed || this.#opts.intervalMs <= 0;
  }

  start(): void {
    if (this.#opts.intervalMs <= 0) return;
    void this.probe().then(() => {
      if (!this.#stopped) this.#schedule();
    });
  }

  /** One probe; updates the state and returns whether the backend answered 200 in time. */
  async probe(): Promise<boolean> {
    const ac = new AbortController();
    this.#inflight = ac;
    const since = this.#lastProbeAt;
    this.#lastProbeAt = performance.now();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ac.abort();
    }, this.#opts.timeoutMs);
    let ok = false;
    try {
      const res = await this.#client.request({ path: this.#opts.path, method: 'GET', signal: ac.signal });
      await res.body.dump();
      ok = res.statusCode === 200;
    } catch {
      ok = false;
    } finally {
      clearTimeout(timer);
      this.#inflight = null;
    }
    const answered = this.#answeredAt();
    if (!ok && timedOut && since !== null && answered !== null && answered >= since) return false;
    if (!this.#stopped) {
      if (ok) this.#confirmed = true;
      this.#record(ok);
      this.#onResult(ok);
    }
    return ok;
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    this.#inflight?.abort();
    await this.#client.destroy();
  }

  #schedule(): void {
    this.#timer = setTimeout(() => {
      this.#timer = null;
      void this.probe().then(() => {
        if (!this.#stopped) this.#schedule();
      });
    }, this.#opts.intervalMs);
  }

  #record(ok: boolean): void {
    if (ok === this.#up) {
      this.#streak = 0;
      return;
    }
    this.#streak++;
    const needed = ok ? this.#opts.healthyThreshold : this.#opts.unhealthyThreshold;
    if (this.#streak >= needed) {
      this.#up = ok;
      this.#streak = 0;
      this.#onChange(ok);
    }
  }
}
