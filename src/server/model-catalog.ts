// GET /v1/models and the context limit, built from the configured served names and what the
// backends report. The configured names are the allowlist: a model a backend serves but the
// config does not name is not offered, and a configured model is offered even before any
// backend has answered (vLLM fields then fall back to safe values: `root` the name itself,
// `parent` null). A card's `root` (the model's path, which `vllm bench serve` loads its tokenizer
// from when it is given no model) and `parent` (a LoRA adapter's base) are a backend's; its
// `owned_by` is the gateway's, which serves the list itself.

import { request } from 'undici';

export interface ModelCard {
  id: string;
  object: 'model';
  created: number;
  owned_by: string;
  root: string;
  parent: string | null;
  max_model_len: number | null;
  permission: unknown[];
}

/** Largest /v1/models answer read: vLLM's lists its models and adapters in a few KB. */
const MAX_MODELS_BODY = 1024 * 1024;

/** When no backend has told us its context length, refuse nothing on length grounds. */
const UNKNOWN_MAX_LEN = Number.POSITIVE_INFINITY;

/**
 * A backend the catalog asks: its origin, its Authorization header value (its API key) or null,
 * and where the names it lists go (Backend.models, which the scheduler and admission filter on).
 */
export interface CatalogTarget {
  readonly url: string;
  readonly authorization?: string | null;
  learned?(models: ReadonlySet<string>): void;
}

/** Where a served model comes from, as vLLM's card says: its path, and a LoRA adapter's base. */
interface Lineage {
  root: string;
  parent: string | null;
}

export class ModelCatalog {
  readonly #served: readonly string[];
  readonly #created = Math.floor(Date.now() / 1000);
  /** model id → the smallest max_model_len any backend reported for it. */
  readonly #maxLen = new Map<string, number>();
  /**
   * model id → the root and parent a backend's card gave it: of a refresh, the first backend in the
   * configured order that listed it; a model no backend listed keeps what it had.
   */
  readonly #lineage = new Map<string, Lineage>();

  constructor(served: readonly string[]) {
    this.#served = served;
  }

  has(model: string): boolean {
    return this.#served.includes(model);
  }

  /** The configured model names, in order. */
  names(): readonly string[] {
    return this.#served;
  }

  /** The one model served, or null when there are several: what a request naming none gets. */
  only(): string | null {
    return this.#served.length === 1 ? this.#served[0]! : null;
  }

  /** Context length of a model: the smallest the backends reported in the last refresh that heard of it (a request must fit all). */
  maxModelLen(model: string): number {
    return this.#maxLen.get(model) ?? UNKNOWN_MAX_LEN;
  }

  /**
   * Records one backend's /v1/models answer (its context lengths into `lens`, by default the
   * catalog's) and returns the ids it lists (vLLM's: its served names and its LoRA adapters); null
   * for a body of another shape, which is ignored (not read as "serves nothing").
   */
  learn(
    body: unknown,
    lens: Map<string, number> = this.#maxLen,
    lineage: Map<string, Lineage> = this.#lineage,
  ): Set<string> | null {
    const data = (body as { data?: unknown } | null)?.data;
    if (!Array.isArray(data)) return null;
    const ids = new Set<string>();
    for (const card of data) {
      const id = (card as { id?: unknown } | null)?.id;
      if (typeof id !== 'string') continue;
      ids.add(id);
      // Lengths of the names it serves only: a backend's other names (adapters loaded at run
      // time, one per job) would otherwise be kept for good, never looked up.
      if (!this.has(id)) continue;
      const { root, parent } = card as { root?: unknown; parent?: unknown };
      if (typeof root === 'string' && root !== '' && !lineage.has(id))
        lineage.set(id, { root, parent: typeof parent === 'string' ? parent : null });
      const len = (card as { max_model_len?: unknown }).max_model_len;
      if (typeof len !== 'number' || !(len > 0)) continue;
      const prev = lens.get(id);
      if (prev === undefined || len < prev) lens.set(id, len);
    }
    return ids;
  }

  /**
   * Asks each backend for /v1/models; failures are skipped. A model's context length becomes the
   * smallest of this refresh's answers, so it grows again once a backend with a shorter one is
   * gone (or restarted with a longer one); a model no backend answered for keeps the length it had.
   *
   * Invariant: a refresh ends within `timeoutMs`, whatever a backend does (no answer to its
   * connect, a body trickled a byte at a time, a body without end), and holds at most
   * MAX_MODELS_BODY bytes of each answer; a call made while one runs for the same backends shares it,
   * or with `again` (something changed since it asked) shares the one more that follows it. The
   * gateway's start and a reload wait for a refresh, a timer starts one every 30 s, and a backend
   * that comes up or restarts asks for one `again`.
   */
  refresh(
    backends: readonly CatalogTarget[],
    timeoutMs = 2000,
    opts: { again?: () => readonly CatalogTarget[] } = {},
  ): Promise<void> {
    const key = backends.map((b) => b.url).join(' ');
    const running = this.#refreshing.get(key);
    // Joined only by the same targets: a reload's new backends at the old URLs learn their own
    // models, not the old objects'.
    if (running?.targets.every((t, i) => t === backends[i])) {
      const again = opts.again;
      if (again === undefined) return running.done;
      // Something changed since the running one asked (a backend came up): one more after it, which
      // every such call meanwhile shares, of the backends in force then (a reload may have changed them).
      running.again ??= running.done.then(() => this.refresh(again(), timeoutMs));
      return running.again;
    }
    const done = this.#refresh(backends, timeoutMs).finally(() => {
      if (this.#refreshing.get(key)?.done === done) this.#refreshing.delete(key);
    });
    this.#refreshing.set(key, { targets: backends, done, again: null });
    return done;
  }

  /**
   * Refreshes running, by the backend list they ask: a reload's new list never joins an old one.
   * `again`: the refresh asked for after it (refresh's `again`: the backends to ask then), once.
   */
  readonly #refreshing = new Map<
    string,
    { targets: readonly CatalogTarget[]; done: Promise<void>; again: Promise<void> | null }
  >();

  /** Refreshes started, and the latest whose answers were applied: an older one never overwrites it. */
  #started = 0;
  #applied = 0;

  async #refresh(backends: readonly CatalogTarget[], timeoutMs: number): Promise<void> {
    const seq = ++this.#started;
    const fresh = new Map<string, number>();
    const lineage = new Map<string, Lineage>();
    const listed = new Map<CatalogTarget, Set<string>>();
    // Not AbortSignal.timeout: its timer would outlive the refresh (and a closed gateway).
    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(), timeoutMs);
    const signal = deadline.signal;
    try {
      await this.#ask(backends, signal, fresh, lineage, listed);
    } finally {
      clearTimeout(timer);
    }
    // A refresh of an older backend list (the timer's, as a reload started another) that ends
    // after a newer one applied its answers keeps out of the way.
    if (seq < this.#applied) return;
    this.#applied = seq;
    for (const [id, len] of fresh) this.#maxLen.set(id, len);
    for (const [id, from] of lineage) this.#lineage.set(id, from);
    // A backend that did not answer keeps the names it last listed: down now, it serves them
    // again when it comes back, most likely.
    for (const [target, models] of listed) target.learned?.(models);
  }

  async #ask(
    backends: readonly CatalogTarget[],
    signal: AbortSignal,
    fresh: Map<string, number>,
    lineage: Map<string, Lineage>,
    listed: Map<CatalogTarget, Set<string>>,
  ): Promise<void> {
    const lineages: (Map<string, Lineage> | undefined)[] = [];
    await Promise.all(
      backends.map(async (target, i) => {
        const { url, authorization } = target;
        try {
          const res = await request(new URL('/v1/models', url), {
            signal,
            ...(authorization ? { headers: { authorization } } : {}),
          });
          if (res.statusCode !== 200) {
            await res.body.dump();
            return;
          }
          const chunks: Buffer[] = [];
          let size = 0;
          for await (const chunk of res.body) {
            size += (chunk as Buffer).length;
            if (size > MAX_MODELS_BODY) {
              res.body.destroy();
              return;
            }
            chunks.push(chunk as Buffer);
          }
          // Each backend's lineage apart, taken in the configured order below: the first to answer
          // would make a card's root change from one refresh to the next where backends differ.
          const own = new Map<string, Lineage>();
          lineages[i] = own;
          const models = this.learn(JSON.parse(Buffer.concat(chunks).toString('utf8')), fresh, own);
          if (models !== null) listed.set(target, models);
        } catch {
          // A backend that cannot answer now is retried at the next refresh.
        }
      }),
    );
    for (const own of lineages) {
      if (own === undefined) continue;
      for (const [id, from] of own) if (!lineage.has(id)) lineage.set(id, from);
    }
  }

  list(): { object: 'list'; data: ModelCard[] } {
    return {
      object: 'list',
      data: this.#served.map((id) => ({
        id,
        object: 'model',
        created: this.#created,
        owned_by: 'slagate',
        root: this.#lineage.get(id)?.root ?? id,
        parent: this.#lineage.get(id)?.parent ?? null,
        max_model_len: this.#maxLen.get(id) ?? null,
        permission: [],
      })),
    };
  }
}
