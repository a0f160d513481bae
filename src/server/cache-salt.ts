// The cache_salt a backend gets. vLLM keys its prefix cache by a prompt's tokens and by the
// request's cache_salt (mixed into the first block's hash): requests under different salts share
// no cached block. A tenant with `isolate_prefix_cache` has a salt of its own, and each of its
// requests is sent under it. Another tenant's requests then never hit its blocks, so they cannot
// tell by timing (a hit answers sooner) which prompts it sent.
//
// Invariants: no other tenant can send a request under an isolated tenant's salt. The tenant's
// part is derived from its API key's digest, which no other tenant knows, and it leads the salt at
// a fixed length, so no client salt of another isolated tenant can reproduce it. The client's own
// salt, when it sends one, follows it: it partitions the tenant's cache further, as it would
// vLLM's. And the salt is the same on every gateway instance with the same configuration, so the
// instances' requests share the tenant's cached blocks.

import { createHash } from 'node:crypto';

/** Hex characters of the tenant's part: 128 bits. */
const TENANT_CHARS = 32;

/** The salt that isolates a tenant's prompts, from its name and its API key's digest. */
export function tenantSalt(name: string, apiKeySha256: string): string {
  return createHash('sha256')
    .update(`slagate cache_salt\u0000${name}\u0000${apiKeySha256.toLowerCase()}`)
    .digest('hex')
    .slice(0, TENANT_CHARS);
}

/**
 * The cache_salt to set on the upstream body: the tenant's salt, then the client's own after a
 * colon when it sent one (a validated non-empty string, or null or absent for none); null when the
 * tenant is not isolated, which leaves the client's body as it is.
 */
export function upstreamSalt(tenant: string | null, client: unknown): string | null {
  if (tenant === null) return null;
  return typeof client === 'string' ? `${tenant}:${client}` : tenant;
}
