#!/usr/bin/env node
// The command-line entry. The sources are TypeScript, loaded through ./ts-loader.js (esbuild strips
// the types as each file is imported), so a clean checkout needs no build step:
// `npm ci && npx slagate ...` works as is.
import './register.js';

// Before the command's modules load (seconds on a busy machine): a stop asked for meanwhile is
// held for the command, not lost (src/cli/stop-signals.ts).
const { holdStopSignals } = await import('../src/cli/stop-signals.ts');
holdStopSignals();
await import('../src/cli/main.ts');
