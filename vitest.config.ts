import { defineConfig } from 'vitest/config';

// Tests run from source (TypeScript) through vite; integration tests need root and
// real runc/mounts/cgroups, so they run in forked processes with generous timeouts.
// No retries: a flaky test is a bug to fix, not to hide.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    pool: 'forks',
    testTimeout: 120_000,
    hookTimeout: 120_000,
    retry: 0,
  },
});
