import { defineConfig } from 'vitest/config';

// Tests run from source (TypeScript) through vite; integration tests need root and
// real runc/mounts/cgroups, so they run in forked processes.
//
// Two test files run at a time. Each test daemon leases a uid-pool slot and a temp root
// of its own (test/integration/harness.ts), so files do not see each other's sandboxes;
// on the 2-core reference host the suite spends half its time waiting on runc, QEMU and
// the kernel, and two workers take it from ~20 to ~13 minutes.
//
// Timeouts are hang detectors, never time bounds (speed is measured in bench/): 300 s
// leaves room for TCG guests booting beside another file's burst.
// No retries: a flaky test is a bug to fix, not to hide.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    pool: 'forks',
    maxWorkers: 2,
    testTimeout: 300_000,
    hookTimeout: 300_000,
    retry: 0,
  },
});
