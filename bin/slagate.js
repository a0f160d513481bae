#!/usr/bin/env node
// The command-line entry. The sources are TypeScript, loaded through ./ts-loader.js (esbuild strips
// the types as each file is imported), so a clean checkout needs no build step:
// `npm ci && npx slagate ...` works as is.
// First: a stop asked for from here on is held for the command, not lost (./hold-stop-signals.js).
import './hold-stop-signals.js';
import './register.js';

await import('../src/cli/main.ts');
