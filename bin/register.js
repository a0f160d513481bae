// Makes `.ts` modules importable in this process: stack traces through their source maps, and
// the hook of ./ts-loader.js. Imported first by the entry; `node --import ./bin/register.js` does
// the same for any other TypeScript entry.
import { register } from 'node:module';

process.setSourceMapsEnabled(true);
register('./ts-loader.js', import.meta.url);
