/**
 * Label selectors: `k=v,k2=v2` (every term must match), the one syntax every API that
 * selects sandboxes by label takes (list, bulk, events, leases).
 */

/**
 * Parses a label selector `k=v,k2=v2` (every pair must match; `k` alone means "has k";
 * `k!=v` means "k absent or different").
 * @returns a predicate over label maps.
 * @throws Error with a message naming the bad term and its position (the API turns it into InvalidArgument).
 */
export function parseSelector(sel: string | undefined): (labels: Record<string, string>) => boolean {
  if (!sel || !sel.trim()) return () => true;
  // Each term remembers where it starts in the selector, so an error names the position.
  let pos = 0;
  const terms = sel.split(',').map((raw) => {
    const at = pos + (raw.length - raw.trimStart().length);
    pos += raw.length + 1;
    return { t: raw.trim(), at };
  }).filter((x) => x.t).map(({ t, at }) => {
    const ne = t.indexOf('!=');
    if (ne > 0) return { k: t.slice(0, ne), v: t.slice(ne + 2), op: 'ne' as const, at };
    const eq = t.indexOf('=');
    if (eq === 0) throw new Error(`bad selector term "${t}" at position ${at}: empty key`);
    if (eq < 0) return { k: t, v: '', op: 'has' as const, at };
    return { k: t.slice(0, eq), v: t.slice(eq + 1), op: 'eq' as const, at };
  });
  for (const t of terms) {
    if (!/^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/.test(t.k)) throw new Error(`bad selector key "${t.k}" at position ${t.at}`);
  }
  return (labels) =>
    terms.every((t) => (t.op === 'has' ? t.k in labels : t.op === 'eq' ? labels[t.k] === t.v : labels[t.k] !== t.v));
}
