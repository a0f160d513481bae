// The entry's TypeScript loader (bin/register.js + bin/ts-loader.js). The hook's output is read
// for the options that change emitted code (no keepNames wrapper, imports kept as written, class
// fields defined); then a real file runs through it in a child process, where a stack trace must
// name the .ts file, line and function.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { runNode } from '../helpers/cli.ts';

const REGISTER = fileURLToPath(new URL('../../bin/register.js', import.meta.url));
const LOADER: string = new URL('../../bin/ts-loader.js', import.meta.url).href;
const dir = mkdtempSync(join(tmpdir(), 'slagate-loader-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

type Load = (
  url: string,
  context: object,
  next: () => Promise<never>,
) => Promise<{ format: string; source: string }>;

describe('bin/ts-loader.js', () => {
  it('strips types and nothing else: no name wrappers, imports as written, fields defined', async () => {
    const { load } = (await import(LOADER)) as { load: Load };
    const file = join(dir, 'shape.ts');
    writeFileSync(
      file,
      [
        "import type { Server } from 'node:http';",
        "import { unused } from './side.ts';",
        'const twice = (n: number): number => 2 * n;',
        'export class Box {',
        '  value = twice(1);',
        '}',
        'export const none: Server | null = null;',
        '',
      ].join('\n'),
    );
    const next = () => Promise.reject(new Error('a .ts file must not reach the next hook'));
    const { format, source } = await load(pathToFileURL(file).href, {}, next);
    expect(format).toBe('module');
    // keepNames would wrap `twice` (and the class) in __name(...) as they are created.
    expect(source).not.toContain('__name');
    // verbatimModuleSyntax: a value import is kept even when unused; a type import is not.
    expect(source).toMatch(/import \{ unused \} from "\.\/side\.ts"/);
    expect(source).not.toContain('node:http');
    // Define semantics: the field stays in the class body, not an assignment in a constructor.
    expect(source).toMatch(/class Box \{\s*value = twice\(1\);/);
    expect(source).not.toContain('this.value');
  });

  it('runs a file with its side-effect import and private fields, and maps stack traces to .ts lines', async () => {
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
