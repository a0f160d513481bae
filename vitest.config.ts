import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Two cores: simulated fleets and gateways are timing-sensitive, so files run in
    // at most two workers.
    maxWorkers: 2,
    reporters: ['default'],
  },
});
