/**
 * Placement (gateway/placement.ts) on simulated fleets of 160 hosts: each filter's count
 * in the answer when nothing fits, best-of-K spreading a burst without passing any host's
 * admission limits, a job spread (or packed) over hosts, image and warm-pool preference.
 */
import { describe, expect, it } from 'vitest';
import { choose, COPY_COST_BYTES, DEFAULT_WEIGHTS, score, isNoHost, noHostError, normalizeImage, primaryUtilisation, type PlacementHost, type PlacementPolicy, type PlacementRequest } from '../../gateway/placement.js';

/** A seeded PRNG (mulberry32): the same decisions on every run. */
function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function host(i: number, over: Partial<PlacementHost> = {}): PlacementHost {
  return {
    name: `h${String(i).padStart(3, '0')}`, up: true, cordoned: false, backends: new Set(['container', 'fncall']),
    cap: { count: 100, cpus: 1000, memoryBytes: 100 * 2 ** 30 }, used: { count: 0, cpus: 0, memoryBytes: 0 },
    cpuBusy: 0.1, memFree: 0.8, images: new Set(['busybox:latest']), warm: new Map(), jobs: {}, ...over,
  };
}

const req = (over: Partial<PlacementRequest> = {}): PlacementRequest => ({
  backend: 'container', image: 'busybox:latest', network: 'none', cpus: 1, memoryBytes: 2 ** 29, job: null, ...over,
});

const policy = (over: Partial<PlacementPolicy> = {}): PlacementPolicy => ({ k: 3, job: 'spread', weights: DEFAULT_WEIGHTS, random: seeded(7), ...over });

/** Places `n` creates one after another, counting each on its host as the host table would. */
function placeMany(hosts: PlacementHost[], n: number, r: PlacementRequest, p: PlacementPolicy): Map<string, number> {
  const got = new Map<string, number>();
  for (let i = 0; i < n; i++) {
    const h = choose(hosts, r, p);
    if (isNoHost(h)) throw new Error(`no host for create ${i}: ${JSON.stringify(h)}`);
    h.used = { count: h.used.count + 1, cpus: h.used.cpus + r.cpus, memoryBytes: h.used.memoryBytes + r.memoryBytes };
    if (r.job) h.jobs = { ...h.jobs, [r.job]: (h.jobs[r.job] ?? 0) + 1 };
    got.set(h.name, (got.get(h.name) ?? 0) + 1);
  }
  return got;
}

describe('placement over 160 hosts', () => {
  it('when nothing fits, says how many hosts each filter excluded', () => {
    const hosts = Array.from({ length: 160 }, (_, i) => host(i));
    for (let i = 0; i < 20; i++) hosts[i].up = false;
    for (let i = 20; i < 30; i++) hosts[i].cordoned = true;
    for (let i = 30; i < 70; i++) hosts[i].backends = new Set(['container']);
    for (let i = 70; i < 75; i++) hosts[i].backends = new Set(['container', 'fncall', 'microvm']);
    for (let i = 75; i < 160; i++) hosts[i].backends = new Set(['container', 'fncall', 'microvm']);
    for (let i = 75; i < 155; i++) hosts[i].used = { count: 100, cpus: 0, memoryBytes: 0 };
    for (let i = 155; i < 160; i++) hosts[i].used = { count: 0, cpus: 999.5, memoryBytes: 0 };
    const r = req({ backend: 'microvm', refused: new Set(['h070', 'h071', 'h072', 'h073', 'h074']) });
    const a = choose(hosts, r, policy());
    expect(isNoHost(a)).toBe(true);
    if (!isNoHost(a)) return;
    expect(a).toEqual({ hosts: 160, excluded: { down: 20, cordoned: 10, backend: 40, burst: 0, refused: 5, room: 85 }, full: { sandboxes: 80, cpus: 5, memory: 0 } });
    const e = noHostError(a, r);
    expect(e.kind).toBe('ResourceExhausted');
    expect(e.message).toBe('no host can take this sandbox: of 160 hosts, 20 down, 10 cordoned, 40 without the microvm backend, 5 refused it (ResourceExhausted or Unavailable), '
      + '85 without room for 1 cores and 536870912 bytes of memory (admission limits: 80 at their sandbox limit, 5 out of cores)');
  });

  it('names the kind by cause: all down is Unavailable, no backend anywhere is FailedPrecondition', () => {
    const down = Array.from({ length: 160 }, (_, i) => host(i, { up: false }));
    const a = choose(down, req(), policy());
    expect(isNoHost(a) && noHostError(a, req()).kind).toBe('Unavailable');
    const noVm = Array.from({ length: 160 }, (_, i) => host(i));
    const b = choose(noVm, req({ backend: 'vm' }), policy());
    expect(isNoHost(b) && noHostError(b, req({ backend: 'vm' })).kind).toBe('FailedPrecondition');
  });

  it('spreads a burst of 4,000 over 160 hosts without passing any host\'s admission limit', () => {
    const hosts = Array.from({ length: 160 }, (_, i) => host(i, { cap: { count: 30, cpus: 1000, memoryBytes: 2 ** 40 } }));
    const got = placeMany(hosts, 4000, req(), policy());
    expect(got.size).toBe(160);
    for (const h of hosts) expect(h.used.count).toBeLessThanOrEqual(30);
    const counts = [...got.values()];
    // Best of 3 keeps the fullest host close to the mean (25): far from the 30-cap everywhere-first fill of a greedy pick.
    expect(Math.max(...counts) - Math.min(...counts)).toBeLessThanOrEqual(4);
    // The fleet's room is 4,800: 800 more fit, then the answer names room as the cause.
    placeMany(hosts, 800, req(), policy());
    const full = choose(hosts, req(), policy());
    expect(isNoHost(full) && full.excluded.room).toBe(160);
  });

  it('spreads a job of 12 over 3 hosts 4/4/4, or packs it on one host', () => {
    const three = () => [host(1), host(2), host(3)];
    const spread = placeMany(three(), 12, req({ job: 'j1' }), policy());
    expect([...spread.values()]).toEqual([4, 4, 4]);
    const packed = placeMany(three(), 12, req({ job: 'j2' }), policy({ job: 'pack' }));
    expect([...packed.values()]).toEqual([12]);
  });

  it('prefers a host with the image, and more a host with a ready warm shell, between equal hosts', () => {
    const hosts = Array.from({ length: 160 }, (_, i) => host(i, { images: new Set() }));
    hosts[42].images = new Set(['py:3.11']);
    hosts[99].images = new Set(['py:3.11']);
    hosts[99].warm = new Map([['py:3.11|none', 2]]);
    const all = policy({ k: 160 });
    const a = choose(hosts, req({ image: 'py:3.11' }), all);
    expect(!isNoHost(a) && a.name).toBe('h099');
    hosts[99].warm = new Map();
    const b = choose(hosts, req({ image: 'py:3.11' }), all);
    expect(['h042', 'h099']).toContain(!isNoHost(b) && b.name);
  });

  it("counts the copy of an image a host lacks (bytes to move) against it, and a tenant's own image as present", () => {
    const has = host(1, { images: new Set(['py:3.11']) });
    const lacks = host(2, { images: new Set() });
    const w = { weights: DEFAULT_WEIGHTS };
    // A small copy costs little, a copy of COPY_COST_BYTES or more a whole image term: always behind the host that has it.
    const small = req({ image: 'py:3.11', copyBytes: 1024 ** 2 });
    const big = req({ image: 'py:3.11', copyBytes: 4 * COPY_COST_BYTES });
    expect(score(has, small, w)).toBeGreaterThan(score(lacks, small, w));
    expect(score(lacks, small, w)).toBeGreaterThan(score(lacks, big, w));
    expect(score(has, big, w) - score(lacks, big, w)).toBeCloseTo(2 * DEFAULT_WEIGHTS.image, 9);
    // A tenant's own image of that name (its table key) is present too; another tenant's is not.
    const own = host(3, { images: new Set(['team-a|py:3.11']) });
    expect(score(own, req({ image: 'py:3.11', tenantImage: 'team-a|py:3.11', copyBytes: COPY_COST_BYTES }), w)).toBeCloseTo(score(has, big, w), 9);
    expect(score(own, req({ image: 'py:3.11', tenantImage: 'team-b|py:3.11', copyBytes: COPY_COST_BYTES }), w)).toBeCloseTo(score(lacks, big, w), 9);
  });

  it('normalizes image references to name:tag', () => {
    expect(normalizeImage('busybox')).toBe('busybox:latest');
    expect(normalizeImage('team/py:3.11')).toBe('team/py:3.11');
    expect(normalizeImage('reg:5000/team/py')).toBe('reg:5000/team/py:latest');
  });

  it('opens burst hosts only above the primary threshold and only to requests that allow it', () => {
    const primary = (used: number) => [host(1, { used: { count: used, cpus: used, memoryBytes: 0 } }), host(2, { used: { count: used, cpus: used, memoryBytes: 0 } })];
    const burst = host(3, { burst: true });
    expect(primaryUtilisation(primary(80))).toBeCloseTo(0.8, 9);
    // At 80%: not above the threshold, even when allowed.
    for (let i = 0; i < 50; i++) expect((choose([...primary(80), burst], req({ allowBurst: true }), policy({ random: seeded(i) })) as PlacementHost).name).not.toBe('h003');
    // Above it: only when allowed; the burst host, empty, scores best.
    for (let i = 0; i < 50; i++) expect((choose([...primary(81), burst], req(), policy({ random: seeded(i) })) as PlacementHost).name).not.toBe('h003');
    expect(placeMany([...primary(81), burst], 20, req({ allowBurst: true }), policy()).get('h003') ?? 0).toBeGreaterThan(0);
    // A full primary pool with the burst pool closed: refused at once, naming both.
    const full = choose([...primary(100), burst], req(), policy());
    expect(isNoHost(full)).toBe(true);
    const e = noHostError(full as never, req());
    expect(e.kind).toBe('ResourceExhausted');
    expect(e.message).toContain('1 in the burst pool (closed');
    expect(e.message).toContain('admission limits: 2 at their sandbox limit');
    // A lower threshold opens it sooner.
    expect(placeMany([...primary(50), burst], 20, req({ allowBurst: true }), policy({ burstThreshold: 0.4 })).get('h003') ?? 0).toBeGreaterThan(0);
  });
});
