// The entry's TypeScript loader (bin/register.js + bin/ts-loader.js), in a child process on real
// files: what tsc would keep is kept (a side-effect import, class fields, private fields), types
// are stripped, and a stack trace names the .ts file, line and function.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { runNode } from '../helpers/cli.ts';

const REGISTER = fileURLToPath(new URL('../../bin/register.js', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'slagate-loader-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('bin/ts-loader.js', () => {
  it('keeps side-effect imports and class fields, and maps stack traces to .ts lines', async () => {
    writeFileSync(join(dir, 'side.ts'), '(globalThis as { sideRan?: boolean }).sideRan = true;\n');
    writeFileSync(
      join(dir, 'main.ts'),
      [
        "import type { Server } from 'node:http';",
        "import './side.ts';",
        'class Box {',
        '  value = 1;',
        '  readonly #hidden: number = 2;',
        '  get sum(): number {',
        '    return this.value + this.#hidden;',
        '  }',
        '}',
        'const none: Server | null = null;',
        'const ran = (globalThis as { sideRan?: boolean }).sideRan;',
        "process.stdout.write([new Box().sum, ran, none].join(' ') + '\\n');",
        'const boom = (n: number): never => {',
        "  throw new Error('boom ' + n);",
        '};',
        'boom(3);',
        '',
      ].join('\n'),
    );
    const { code, out, err } = await runNode(['--import', REGISTER, join(dir, 'main.ts')]);
    expect(out).toBe('3 true \n');
    expect(code).toBe(1);
    expect(err).toContain('Error: boom 3');
    // Line 14, column 9 of the TypeScript source, in the function named by its binding.
    expect(err).toMatch(new RegExp(`at boom \\(${join(dir, 'main.ts').replaceAll('/', '\\/')}:14:9\\)`));
  });
});
