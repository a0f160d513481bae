// The module hook that runs the TypeScript sources (registered by ./register.js): each `.ts`
// file under file: is read and its types stripped by esbuild, one file at a time, nothing bundled,
// nothing written to disk. Everything else is Node's own loading.
//
// Why not tsx, which the scripts and tests run under: tsx compiles with esbuild's keepNames,
// which wraps every function and closure in a call that redefines its `name` as it is created;
// the request path creates dozens of closures per request, and with tsx's other runtime work that
// cost about a tenth of the gateway's CPU per request (docs/benchmarks.md). V8 names
// `const f = () => …` from the binding anyway, so nothing in a stack trace changes.
//
// The options mirror tsconfig.json where they change emitted code: imports are kept as written
// (verbatimModuleSyntax, so a side-effect import is never dropped as a type), class fields are
// defined as ES2022 defines them, and an inline source map lets stack traces name .ts lines.
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { transform } from 'esbuild';

const OPTIONS = Object.freeze({
  loader: 'ts',
  format: 'esm',
  target: 'es2023',
  sourcemap: 'inline',
  keepNames: false,
  tsconfigRaw: { compilerOptions: { verbatimModuleSyntax: true, useDefineForClassFields: true } },
});

export async function load(url, context, nextLoad) {
  if (!url.startsWith('file:') || !url.endsWith('.ts')) return nextLoad(url, context);
  const file = fileURLToPath(url);
  const { code } = await transform(await readFile(file, 'utf8'), { ...OPTIONS, sourcefile: file });
  return { format: 'module', source: code, shortCircuit: true };
}
