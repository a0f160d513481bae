#!/usr/bin/env node
// The command-line entry. The sources are TypeScript run through tsx's loader, so a clean
// checkout needs no build step: `npm ci && npx slagate ...` works as is.
import { register } from 'tsx/esm/api';

register();
await import('../src/cli/main.ts');
