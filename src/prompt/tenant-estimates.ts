// The token estimate each tenant's requests are counted with: its own, learnt from its own prompts,
// over the fleet's, learnt from everyone's.
//
// Invariant: one tenant's prompts move no other tenant's counts once that tenant has OWN_PROMPTS
// of its own. A tenant writing in another script (or sending prompts made to drag the ratio) would
// otherwise have every other tenant's prompts counted at its ratio: an English prompt counted as
// three times its tokens is refused against its tenant's tokens_per_minute, and predicted three
// times as slow to prefill. Until a tenant has learnt a figure from that many prompts it reads the
// fleet's (learnt from every prompt, its own included). The fleet's estimate is what /admin/state
// shows, and what a block a peer told of weighs in the prefix index (LiveState's indexBlockTokens).
import { TokenEstimate } from './canonical.ts';

/** Prompts a tenant's own figure is learnt from before it replaces the fleet's. */
export const OWN_PROMPTS = 8;

export class TokenEstimates {
  readonly fleet = new TokenEstimate();
  /** One per tenant that has sent a prompt to learn from: the configured tenants, or `anonymous`. */
  readonly #own = new Map<string, TokenEstimate>();
  /** The tenants configured (retain); null until told: any. */
  #tenants: ReadonlySet<string> | null = null;

  /** The estimate `tenant`'s requests are counted with. */
  of(tenant: string): TokenEstimate {
    return this.#own.get(tenant) ?? this.fleet;
  }

  /** A backend counted `promptTokens` for a prompt of `tenant`'s rendered as `p`. */
  learn(tenant: string, ...counted: Parameters<TokenEstimate['learn']>): void {
    this.fleet.learn(...counted);
    this.#ownOf(tenant)?.learn(...counted);
  }

  /** A request of `tenant`'s completed with `tokens` output tokens per sequence. */
  learnOutput(tenant: string, tokens: number): void {
    this.fleet.learnOutput(tokens);
    this.#ownOf(tenant)?.learnOutput(tokens);
  }

  /** `tenant`'s own estimate, made on its first use; null for a tenant a reload removed. */
  #ownOf(tenant: string): TokenEstimate | null {
    let own = this.#own.get(tenant);
    if (own === undefined) {
      // A request of a tenant a reload removed, ending now, makes no estimate of its own.
      if (this.#tenants !== null && !this.#tenants.has(tenant)) return null;
      own = new TokenEstimate(undefined, undefined, this.fleet, OWN_PROMPTS);
      this.#own.set(tenant, own);
    }
    return own;
  }

  /** The tenants configured (at start and at every reload): the others' estimates are forgotten. */
  retain(tenants: ReadonlySet<string>): void {
    this.#tenants = tenants;
    for (const name of this.#own.keys()) if (!tenants.has(name)) this.#own.delete(name);
  }
}
