// A gateway of any checkout, for the scripts that compare paths or commits in front of the fixed
// backend (scripts/lib/fixed-backend.ts).
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * The gateway in front of one fixed backend with targets no load there reaches and limits above
 * 256 streams, so nothing queues or is refused: every stage runs, none decides.
 */
export function undecidingGatewayYaml(url: string, dir: string): string {
  return [
    'server: { host: 127.0.0.1, port: 0, body_limit_bytes: 4194304 }',
    'models: [meta-llama/Llama-3.1-8B-Instruct]',
    'backends:',
    `  - { name: r0, url: "${url}" }`,
    'router: { policy: least_loaded }',
    'sla:',
    '  default_class: bench',
    '  classes:',
    '    bench: { ttft_p99_ms: 600000, tpot_p99_ms: 60000, priority: 0, sheddable: false }',
    'scheduler: { max_queue: 4096, concurrency: { max: 1024, initial: 1024, prefill_tokens: 0 } }',
    'upstream: { max_connections_per_backend: 1024 }',
    `logging: { level: warn, admission_log: ${dir}/admission.log }`,
  ].join('\n');
}

/** How long a checkout's gateway may take to say it serves. */
const START_TIMEOUT_MS = 60_000;

export interface CheckoutGateway {
  url: string;
  child: ChildProcess;
  /** The temporary directory holding its config and admission log. */
  dir: string;
}

/**
 * `node DIR/bin/slagate.js serve` of the checkout in `checkout`, with the config `yaml` makes of a
 * fresh temporary directory; resolves at its "serving on" line, rejects if it exits first.
 */
export async function startCheckoutGateway(
  checkout: string,
  yaml: (dir: string) => string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<CheckoutGateway> {
  const dir = mkdtempSync(join(tmpdir(), 'slagate-checkout-'));
  const config = join(dir, 'gateway.yaml');
  writeFileSync(config, yaml(dir));
  const child = spawn(
    process.execPath,
    [join(checkout, 'bin/slagate.js'), 'serve', '--config', config, '--port', '0'],
    { cwd: checkout, env, stdio: ['ignore', 'ignore', 'pipe'] },
  );
  const url = await new Promise<string>((resolve, reject) => {
    let err = '';
    // A checkout that never says it serves (an old one, a wrong directory) ends the script, not
    // its wait.
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`gateway of ${checkout} did not start within ${START_TIMEOUT_MS} ms: ${err}`));
    }, START_TIMEOUT_MS);
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`gateway of ${checkout} exited with ${code}: ${err}`));
    });
    child.stderr!.on('data', (d: Buffer) => {
      err += d.toString();
      const m = /serving on (http:\/\/[\d.]+:\d+)/.exec(err);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
  });
  return { url, child, dir };
}
