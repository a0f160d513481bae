// API key → tenant → SLA class. Keys are never stored: the config holds their SHA-256. A presented
// key is hashed and its digest looked up in a map of the tenants' digests: one hash and one lookup
// per request, however many tenants there are (comparing the digest with every tenant's in turn
// cost 60–89 µs per request at a thousand tenants on the 2-core build machine, the lookup 1.7–2.3
// µs with its hash: a probe, not in the repo). The
// lookup's timing can only tell a client how its own key's digest compares with a stored digest,
// which is no step towards a key that hashes to it: SHA-256 has no known preimage attack.

import { createHash } from 'node:crypto';
import { GatewayError } from '../errors/index.ts';
import { isolatedSalt, type SaltRule, SHARED_SALT } from './cache-salt.ts';

export interface TenantSpec {
  readonly name: string;
  readonly api_key_sha256: string;
  readonly class: string;
  readonly allowed_classes: readonly string[];
  readonly max_concurrency?: number | undefined;
  readonly tokens_per_minute?: number | undefined;
  readonly isolate_prefix_cache?: boolean | undefined;
}

export interface Identity {
  tenant: string;
  class: string;
  /** The tenant's limits; null for an open gateway (no tenants configured). */
  limits: { max_concurrency?: number | undefined; tokens_per_minute?: number | undefined } | null;
  /**
   * How its requests' cache_salt is made (cache-salt.ts); null on an open gateway (no tenants),
   * which leaves every body's salt as it is.
   */
  cacheSalt: SaltRule | null;
}

/** The tenant name used when the config lists no tenants (an open gateway). */
export const ANONYMOUS = 'anonymous';

/** The tenant a record or a log line names: null on an open gateway (ANONYMOUS is only a usage key). */
export function namedTenant(identity: Identity): string | null {
  return identity.limits === null ? null : identity.tenant;
}

export interface Authenticator {
  /**
   * @param authorization the raw Authorization header
   * @param requestedClass the x-slagate-class header, honoured only when the tenant may use it
   */
  identify(authorization: string | undefined, requestedClass: string | undefined): Identity;
}

export function createAuthenticator(
  tenants: readonly TenantSpec[] | undefined,
  defaultClass: string,
  classes: ReadonlySet<string>,
): Authenticator {
  // Key hashes are unique (config validation); the first tenant of a hash would win regardless.
  // Each tenant's salt rule is derived here, once per configuration, not per request (a hash each).
  const byDigest = new Map<string, { tenant: TenantSpec; salt: SaltRule }>();
  for (const t of tenants ?? []) {
    const digest = t.api_key_sha256.toLowerCase();
    if (byDigest.has(digest)) continue;
    const salt = t.isolate_prefix_cache === true ? isolatedSalt(t.name, t.api_key_sha256) : SHARED_SALT;
    byDigest.set(digest, { tenant: t, salt });
  }
  const open = byDigest.size === 0;
  const find = (key: string) => byDigest.get(createHash('sha256').update(key).digest('hex'));

  return {
    identify(authorization, requestedClass) {
      if (open) {
        const cls =
          requestedClass !== undefined && classes.has(requestedClass) ? requestedClass : defaultClass;
        return { tenant: ANONYMOUS, class: cls, limits: null, cacheSalt: null };
      }
      const match = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? '');
      const found = match ? find(match[1]!) : undefined;
      if (found === undefined) {
        throw new GatewayError('invalid_api_key', 'Incorrect or missing API key.');
      }
      const { tenant, salt } = found;
      const cls =
        requestedClass !== undefined && tenant.allowed_classes.includes(requestedClass)
          ? requestedClass
          : tenant.class;
      return {
        tenant: tenant.name,
        class: cls,
        limits: { max_concurrency: tenant.max_concurrency, tokens_per_minute: tenant.tokens_per_minute },
        cacheSalt: salt,
      };
    },
  };
}
