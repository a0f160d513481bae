// ConfigError: the one error a configuration can produce. It carries every violation at once (an
// operator fixes a file in one pass, not one error per restart) and a stable code to branch on.

export const CONFIG_INVALID = 'SLAGATE_CONFIG_INVALID';
export const CONFIG_UNREADABLE = 'SLAGATE_CONFIG_UNREADABLE';
export type ConfigErrorCode = typeof CONFIG_INVALID | typeof CONFIG_UNREADABLE;

export interface ConfigIssue {
  /** Readable path to the offending key: `sla.classes.batch.priority`, `backends[1].url`; '' is the root. */
  readonly path: string;
  readonly message: string;
  /** 1-based position in the source text, when the key (or its nearest parent) is in the file. */
  readonly line?: number;
  readonly column?: number;
}

export class ConfigError extends Error {
  override readonly name = 'ConfigError';
  readonly code: ConfigErrorCode;
  /** The file name (or the name given to parseConfig) the issues refer to. */
  readonly source: string;
  readonly issues: readonly ConfigIssue[];

  constructor(code: ConfigErrorCode, source: string, issues: readonly ConfigIssue[]) {
    const count = issues.length === 1 ? '1 problem' : `${issues.length} problems`;
    const lines = issues.map((issue) => `  - ${formatIssue(issue, source)}`);
    const what = code === CONFIG_UNREADABLE ? 'cannot read configuration' : 'invalid configuration';
    super(`${source}: ${what} (${count}):\n${lines.join('\n')}`);
    this.code = code;
    this.source = source;
    this.issues = Object.freeze(issues.map((issue) => Object.freeze({ ...issue })));
  }
}

export function isConfigError(err: unknown): err is ConfigError {
  return err instanceof ConfigError;
}

/** One line per issue: `backends[1].url: must be an http(s) URL (gateway.yaml:7:10)`. */
export function formatIssue(issue: ConfigIssue, source: string): string {
  const where = issue.line === undefined ? '' : ` (${source}:${issue.line}:${issue.column ?? 1})`;
  return `${issue.path === '' ? '(root)' : issue.path}: ${issue.message}${where}`;
}
