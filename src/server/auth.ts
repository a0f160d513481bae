// API key → tenant → SLA class. Keys are never stored: the config holds their SHA-256, and a
// presented key is hashed before lookup, so a timing difference in the map lookup reveals
// nothing about any stored key.

import { createHash } from 'node:crypto';
import { GatewayError } from './errors.ts';

export interface TenantSpec {
  readonly name: string;
  readonly api_key_sha256: string;
  readonly class: string;
  readonly allowed_classes: readonly string[];
  readonly max_concurrency?: number | undefined;
  readonly tokens_per_minute?: number | undefined;
}

export interface Identity {
  tenant: string;
  class: string;
}

/** The tenant name used when the config lists no tenants (an open gateway). */
export const ANONYMOUS = 'anonymous';

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
  const byHash = new Map<string, TenantSpec>();
  for (const t of tenants ?? []) byHash.set(t.api_key_sha256.toLowerCase(), t);
  const open = byHash.size === 0;

  return {
    identify(authorization, requestedClass) {
      if (open) {
        const cls =
          requestedClass !== undefined && classes.has(requestedClass) ? requestedClass : defaultClass;
        return { tenant: ANONYMOUS, class: cls };
      }
      const match = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? '');
      const tenant = match ? byHash.get(createHash('sha256').update(match[1]!).digest('hex')) : undefined;
      if (tenant === undefined) {
        throw new GatewayError('invalid_api_key', 'Incorrect or missing API key.');
      }
      const cls =
        requestedClass !== undefined && tenant.allowed_classes.includes(requestedClass)
          ? requestedClass
          : tenant.class;
      return { tenant: tenant.name, class: cls };
    },
  };
}
