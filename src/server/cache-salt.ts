// The cache_salt a backend gets. vLLM keys its prefix cache by a prompt's tokens and by the
// request's cache_salt (mixed into the first block's hash): requests under different salts share
// no cached block. A tenant with `isolate_prefix_cache` has a salt of its own, and each of its
// requests is sent under it. Another tenant's requests then never hit its blocks, so they cannot
// tell by timing (a hit answers sooner) which prompts it sent.
//
// Invariants:
// - No other client can send a request under an isolated tenant's salt. On a gateway with tenants
//   the gateway owns the namespace of salts: an isolated tenant's salt leads with its 32 hex
//   characters, and every other tenant's client salt is sent after `shared:`, which no hex string
//   begins with. The hex part is derived from the tenant's name and key digest; it is not a
//   secret (whoever reads the configuration can compute it), and it need not be one. Shared
//   tenants are under `shared:` whether or not a tenant is isolated now: blocks cached under a
//   tenant's salt while it was isolated stay out of reach once it no longer is, and an instance
//   that has not yet reloaded the isolation sends no client's salt bare either.
// - The client's own salt, when it sends one, follows its tenant's part: it partitions the
//   tenant's cache further, as it would vLLM's.
// - The salt is the same on every gateway instance with the same configuration, so the
//   instances' requests share the tenant's cached blocks.

import { createHash } from 'node:crypto';

/** How a tenant's requests are salted: its part of the salt, and whether a request without a salt of its own gets it. */
export interface SaltRule {
  readonly prefix: string;
  readonly always: boolean;
}

/** Hex characters of an isolated tenant's part: 128 bits. */
const TENANT_CHARS = 32;

/** The rule of a tenant that shares the backends' caches (it is not isolated) on a gateway with tenants. */
export const SHARED_SALT: SaltRule = Object.freeze({ prefix: 'shared', always: false });

/** The rule of an isolated tenant: its part, from its name and its API key's digest, leads every salt. */
export function isolatedSalt(name: string, apiKeySha256: string): SaltRule {
  const prefix = createHash('sha256')
    .update(`slagate cache_salt\u0000${name}\u0000${apiKeySha256.toLowerCase()}`)
    .digest('hex')
    .slice(0, TENANT_CHARS);
  return Object.freeze({ prefix, always: true });
}

/**
 * The cache_salt to set on the upstream body, from its tenant's rule and the client's own salt (a
 * validated non-empty string, or null or absent for none); null leaves the body as it is (no rule:
 * an open gateway; or a shared tenant's request without a salt).
 */
export function upstreamSalt(rule: SaltRule | null, client: unknown): string | null {
  if (rule === null) return null;
  if (typeof client === 'string') return `${rule.prefix}:${client}`;
  return rule.always ? rule.prefix : null;
}
