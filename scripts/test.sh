#!/usr/bin/env bash
# The whole test suite: unit, integration (root; real runc, mounts, cgroups, SQLite)
# and attacks. Works as the first command on a fresh machine: installs what is missing
# (without the demo) first. Ends with the plain line `N passed, N failed`.
#
#   bash scripts/test.sh [vitest filters...]
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ ! -d node_modules || ! -x native/agent/dsec-agent || ! -d dist ]] || ! command -v runc >/dev/null || ! command -v crun >/dev/null || ! command -v mkfs.erofs >/dev/null; then
  bash scripts/install.sh --no-demo || { echo "install failed"; echo "0 passed, 1 failed"; exit 1; }
else
  make -s -C native && npx tsc -p tsconfig.json || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }
fi
out=$(mktemp -d)
# The import rules first (.dependency-cruiser.cjs; a few seconds): a layering break shows
# at the top of the output and counts in the final line like any failed test.
deps=test/unit/dependencies.test.ts
npx vitest run --reporter=default --reporter=json --outputFile.json="$out/deps.json" "$deps"
rc_deps=$?
npx vitest run --reporter=default --reporter=json --outputFile.json="$out/results.json" --exclude "$deps" "$@"
rc=$?
[[ $rc_deps -ne 0 ]] && rc=1
node -e '
  let passed = 0, failed = 0, skipped = 0;
  for (const file of process.argv.slice(1)) {
    const r = JSON.parse(require("fs").readFileSync(file, "utf8"));
    passed += r.numPassedTests;
    skipped += r.numPendingTests + (r.numTodoTests || 0);
    failed += r.numFailedTests;
    // A test file that failed with no failed test (it did not load, or a beforeAll threw
    // and its tests were skipped) counts as one failure.
    for (const f of r.testResults) if (f.status === "failed" && !f.assertionResults.some((a) => a.status === "failed")) failed++;
  }
  console.log(`${passed} passed, ${failed} failed` + (skipped ? `, ${skipped} skipped` : ""));
' "$out/deps.json" "$out/results.json" || { echo "0 passed, 1 failed"; rc=1; }
rm -rf "$out"
exit $rc
