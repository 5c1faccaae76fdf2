/**
 * The import rules of dsec's TypeScript tree (docs/ARCHITECTURE.md "Layers and import
 * rules"), checked by dependency-cruiser: test/unit/dependencies.test.ts runs it over
 * daemon/, sdk/, cli/ and gateway/ (scripts/test.sh runs that file before the rest of the
 * suite), and checks that the rules catch a fixture tree built to break them
 * (test/fixtures/depcruise/). By hand:
 *
 *     npx depcruise --config .dependency-cruiser.cjs daemon sdk cli
 *
 * Paths are relative to the directory depcruise runs in (the repository root, or the
 * fixture tree). Type-only imports count (tsPreCompilationDeps): a layer that names
 * another's types depends on it as much as one that calls it.
 *
 * Severity: `error` fails the check. Imports that break a rule today and that another
 * change of issue 18 removes are listed one by one as `warn`, with the item, so
 * any new violation is still an error; a `warn` rule whose import is gone matches nothing
 * and can be deleted. Cycles and imports of daemon/api/ from below are errors even where
 * they exist today: they are what issue 18 removes.
 */

/** Modules under daemon/ allowed to import daemon/api/: the process entry and the
 * composition root that wires the API to the services (add it here if it leaves main.ts). */
const COMPOSITION_ROOTS = ['^daemon/main[.]ts$'];

/** Today's known violations: [rule, from, to, issue item]. */
const KNOWN = [
];

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'No import cycles in daemon/, sdk/, cli/, gateway/ or pki/ (issue 18 item 5), type-only imports included.',
      from: { path: '^(daemon|sdk|cli|gateway|pki)/' },
      to: { circular: true },
    },
    {
      name: 'api-only-from-the-top',
      severity: 'error',
      comment:
        'daemon/api/ (the wire schema, routes, server) is the top of the daemon: below it, only the ' +
        'entry and the composition root may import it (issue 18 items 1 and 5). Drivers, security, ' +
        'net, fncall, storage, image, sandbox take the domain model (daemon/model/) instead.',
      from: { path: '^daemon/', pathNot: ['^daemon/api/', ...COMPOSITION_ROOTS] },
      to: { path: '^daemon/api/' },
    },
    {
      name: 'model-is-the-bottom',
      severity: 'error',
      comment: 'daemon/model/ (the domain types) imports nothing of daemon/ but daemon/errors.ts (issue 18 item 1).',
      from: { path: '^daemon/model/' },
      to: { path: '^daemon/', pathNot: ['^daemon/model/', '^daemon/errors[.]ts$'] },
    },
    ...knownSplit(
      'sdk-not-to-daemon-or-cli',
      'sdk/ is a client: it imports nothing of daemon/ nor cli/ (issue 18 item 7).',
      { path: '^sdk/' },
      { path: '^(daemon|cli)/' },
    ),
    {
      name: 'pki-is-a-library',
      severity: 'error',
      comment: 'pki/ (X.509 for the TCP door, the fleet and `dsec fleet`) is used by daemon/, cli/ and gateway/ and imports none of them, nor sdk/.',
      from: { path: '^pki/' },
      to: { path: '^(daemon|sdk|cli|gateway)/' },
    },
    ...knownSplit(
      'cli-not-to-daemon',
      'cli/ talks to dsecd through sdk/ and imports nothing of daemon/ (issue 18 item 9).',
      { path: '^cli/' },
      { path: '^daemon/' },
    ),
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^(node_modules|dist)/' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: require('node:path').join(__dirname, 'tsconfig.json') },
    enhancedResolveOptions: { exportsFields: ['exports'], conditionNames: ['import', 'require', 'node', 'default'] },
  },
};

/**
 * Rule `name` as an error for every import it matches except today's known pairs (KNOWN),
 * plus one `warn` rule per known pair. dependency-cruiser matches each rule on its own,
 * so the error rule lists the known pairs' targets per source in a `pathNot`.
 */
function knownSplit(name, comment, from, to) {
  const known = KNOWN.filter(([r]) => r === name);
  const rules = [{ name, severity: 'error', comment, from, to }];
  // A source with known violations: an error for every other target of the rule.
  const sources = [...new Set(known.map(([, f]) => f))];
  if (sources.length) {
    rules[0] = { name, severity: 'error', comment, from: { ...from, pathNot: sources }, to };
    for (const f of sources) {
      const targets = known.filter(([, kf]) => kf === f).map(([, , t]) => t);
      rules.push({ name, severity: 'error', comment, from: { path: f }, to: { ...to, pathNot: targets } });
    }
  }
  for (const [, f, t, why] of known)
    rules.push({ name, severity: 'warn', comment: `Known violation, to be removed (${why}).`, from: { path: f }, to: { path: t } });
  return rules;
}
