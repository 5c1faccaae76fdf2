/**
 * Placement: which host takes a new sandbox. Pure functions over a snapshot of the host
 * table, so the same code is unit-tested on 160 simulated hosts and benchmarked.
 *
 * 1. Filter: every host is checked, in this order, and the first filter that excludes it
 *    is counted: `down` (its lease lapsed), `cordoned` (`dsec host cordon/drain`),
 *    `backend` (the tier is not available there), `burst` (a `pool=burst` host, open only
 *    to requests that allow bursting while the primary pool's utilisation is above the
 *    threshold, 80% by default), `refused` (it already refused this
 *    create: ResourceExhausted or Unavailable), `room` (its admission limits, less what
 *    it carries and what this gateway has in flight there, cannot take the request).
 *    When no host passes, the answer names the count each filter excluded (peers' users
 *    complain of opaque "failed to place" errors, e2b-dev/infra#3553).
 * 2. Sample K of the hosts that passed, uniformly without replacement (E2B's best-of-K,
 *    the "power of K choices": K = 3 by default, as theirs), so concurrent decisions of
 *    many gateways spread instead of all choosing the one best host.
 * 3. Take the best sampled host: for a request with a job, first by the job's sandboxes
 *    there (fewest when spreading, most when packing: a topology spread constraint with
 *    no skew allowed among the sampled hosts), then by {@link score}.
 * The create goes to that host; if the host refuses (ResourceExhausted, Unavailable) the
 * gateway adds it to `refused` and decides again (gateway/create.ts).
 */

/** What placement knows of one host (built from the host table, gateway/table.ts). */
export interface PlacementHost {
  name: string;
  up: boolean;
  cordoned: boolean;
  backends: ReadonlySet<string>;
  /** Admission limits: sandboxes, cores and bytes that limits of admitted sandboxes may sum to. */
  cap: { count: number; cpus: number; memoryBytes: number };
  /** What admission counts now: the host's report plus this gateway's in-flight and recent creates there. */
  used: { count: number; cpus: number; memoryBytes: number };
  /** Busy fraction of its CPUs (0..1) and available memory over total (0..1), from its last report. */
  cpuBusy: number;
  memFree: number;
  /** Image refs (`name:tag`) and digests present. */
  images: ReadonlySet<string>;
  /** Ready warm-pool shells by `image|network`. */
  warm: ReadonlyMap<string, number>;
  /** Sandboxes per job (label `job`). */
  jobs: Readonly<Record<string, number>>;
  /** In the burst pool (label `pool=burst`): takes creates only while bursting ({@link primaryUtilisation}). */
  burst?: boolean;
}

/** One create to place. */
export interface PlacementRequest {
  backend: string;
  /** Image ref normalized to `name:tag` (see {@link normalizeImage}). */
  image: string;
  /** Network mode (`none`, `allow`, `open`), for the warm-pool key. */
  network: string;
  cpus: number;
  memoryBytes: number;
  /** Value of the `job` label, or null. */
  job: string | null;
  /** The key (gateway/table.ts tenantImageKey) of the caller's own image of that name (a tenant's own image counts as present too). */
  tenantImage?: string;
  /** Bytes a copy of the image to a host without it moves (its layers' size as hosts report it; 0 unknown). */
  copyBytes?: number;
  /** Hosts that already refused this create. */
  refused?: ReadonlySet<string>;
  /** The request allows a burst host (`X-Dsec-Burst: allow`). */
  allowBurst?: boolean;
}

/** Weights of the score's terms (each term is in 0..1). */
export interface ScoreWeights {
  /** Free capacity (admission room and measured load). */
  free: number;
  /** The image is already on the host (no layer fetch). */
  image: number;
  /** A warm-pool shell for the request is ready there (no runtime start). */
  warm: number;
}

/** How placement decides. */
export interface PlacementPolicy {
  /** Hosts sampled per decision (best of K); default {@link DEFAULT_K}. */
  k: number;
  /** `spread` a job's sandboxes over hosts (default: a host's loss costs a job the least) or `pack` them (fewer hosts to pause and resume). */
  job: 'spread' | 'pack';
  weights: ScoreWeights;
  /** Random numbers in [0, 1): Math.random, or a seeded one in tests. */
  random: () => number;
  /** Burst hosts open above this primary utilisation (0..1); default {@link DEFAULT_BURST_THRESHOLD}. */
  burstThreshold?: number;
}

/** Burst hosts take creates only while the primary pool's utilisation is above 80%, DSec's default. */
export const DEFAULT_BURST_THRESHOLD = 0.8;

/**
 * The primary pool's utilisation, 0..1: of the up, uncordoned hosts not in the burst
 * pool, the largest of admitted sandboxes, cores and memory over the sums of their
 * admission limits (1 when there is no such host: the burst pool is all there is).
 */
export function primaryUtilisation(hosts: readonly PlacementHost[]): number {
  let uc = 0, cc = 0, um = 0, cm = 0, un = 0, cn = 0;
  for (const h of hosts) {
    if (h.burst || !h.up || h.cordoned) continue;
    un += h.used.count;
    cn += h.cap.count;
    uc += h.used.cpus;
    cc += h.cap.cpus;
    um += h.used.memoryBytes;
    cm += h.cap.memoryBytes;
  }
  if (cn === 0) return 1;
  return Math.max(un / cn, cc > 0 ? uc / cc : 0, cm > 0 ? um / cm : 0);
}

/** K of best-of-K: 3, as E2B's default. */
export const DEFAULT_K = 3;

/**
 * Default weights: free capacity counts most; a ready warm shell (a create that skips the
 * runtime) more than a present image (a create that skips a layer fetch).
 */
export const DEFAULT_WEIGHTS: ScoreWeights = { free: 1, image: 0.3, warm: 0.5 };

/** The filters, in the order they are applied. */
export const FILTERS = ['down', 'cordoned', 'backend', 'burst', 'refused', 'room'] as const;
export type FilterName = (typeof FILTERS)[number];

/** Why no host was chosen: how many hosts each filter excluded. */
export interface NoHost {
  hosts: number;
  excluded: Record<FilterName, number>;
  /** Of the hosts without room, which admission limit each hit first: sandbox count, cores, memory. */
  full?: { sandboxes: number; cpus: number; memory: number };
}

/** Which admission limit of `h` a create of `req` would pass first, or null when it fits. */
export function fullOn(h: PlacementHost, req: PlacementRequest): 'sandboxes' | 'cpus' | 'memory' | null {
  if (h.used.count + 1 > h.cap.count) return 'sandboxes';
  if (h.used.cpus + req.cpus > h.cap.cpus) return 'cpus';
  if (h.used.memoryBytes + req.memoryBytes > h.cap.memoryBytes) return 'memory';
  return null;
}

/** `name` or `name:tag` -> `name:tag` (tag `latest` when absent; a digest reference is kept). */
export function normalizeImage(ref: string): string {
  if (ref.includes('@') || ref.startsWith('sha256:') || ref.startsWith('disk:')) return ref;
  const slash = ref.lastIndexOf('/');
  return ref.indexOf(':', slash + 1) >= 0 ? ref : `${ref}:latest`;
}

/**
 * The first filter that excludes `h` for `req`, or null when it passes.
 * @param burstOpen whether burst hosts take this request (it allows them and the primary pool is above the threshold)
 */
export function excludedBy(h: PlacementHost, req: PlacementRequest, burstOpen = false): FilterName | null {
  if (!h.up) return 'down';
  if (h.cordoned) return 'cordoned';
  if (!h.backends.has(req.backend)) return 'backend';
  if (h.burst && !burstOpen) return 'burst';
  if (req.refused?.has(h.name)) return 'refused';
  if (fullOn(h, req) !== null) return 'room';
  return null;
}

/**
 * Bytes of image copy that cost a whole image term: 1 GiB, about a second at 10 Gb/s
 * between hosts plus the write, the order of a create's own work on a cold host.
 */
export const COPY_COST_BYTES = 1024 ** 3;

/**
 * The score of `h` for `req` (higher is better), a weighted sum of terms in 0..1:
 * - free: 0.6 x (1 - the fullest admission ratio after placing: count, cores, memory)
 *   + 0.4 x (1 - the larger of CPU busy and memory in use), so both the limits a host
 *   promised and what it really carries count;
 * - image: 1 when the image (by ref, or the caller's own of that name) is on the host;
 *   else minus the copy's cost, min(1, bytes to move / {@link COPY_COST_BYTES}) (the
 *   gateway copies it from a peer first, gateway/image-copy.ts), so a host with the image
 *   wins when otherwise equal and a large copy weighs more than a small one;
 * - warm: 1 when a warm-pool shell of (image, network) is ready there.
 * A job's spread is not a term of the score but the first key of the choice ({@link choose}):
 * a weighted term would lose to noise in measured load once a host holds a few of the job.
 */
export function score(h: PlacementHost, req: PlacementRequest, p: Pick<PlacementPolicy, 'weights'>): number {
  const ratio = Math.max(
    (h.used.count + 1) / Math.max(1, h.cap.count),
    (h.used.cpus + req.cpus) / Math.max(1e-9, h.cap.cpus),
    (h.used.memoryBytes + req.memoryBytes) / Math.max(1, h.cap.memoryBytes),
  );
  const load = Math.max(h.cpuBusy, 1 - h.memFree);
  const free = 0.6 * (1 - Math.min(1, ratio)) + 0.4 * (1 - Math.min(1, load));
  const image = h.images.has(req.image) || (req.tenantImage !== undefined && h.images.has(req.tenantImage)) ? 1 : -Math.min(1, (req.copyBytes ?? 0) / COPY_COST_BYTES);
  const warm = (h.warm.get(`${req.image}|${req.network}`) ?? 0) > 0 ? 1 : 0;
  const w = p.weights;
  return w.free * free + w.image * image + w.warm * warm;
}

/**
 * Chooses a host for `req`: filter, sample K, best score (see the module comment).
 * @returns the host, or {@link NoHost} when every host was excluded.
 */
export function choose(hosts: readonly PlacementHost[], req: PlacementRequest, p: PlacementPolicy): PlacementHost | NoHost {
  const excluded: Record<FilterName, number> = { down: 0, cordoned: 0, backend: 0, burst: 0, refused: 0, room: 0 };
  const ok: PlacementHost[] = [];
  const burstOpen = req.allowBurst === true && hosts.some((h) => h.burst) && primaryUtilisation(hosts) > (p.burstThreshold ?? DEFAULT_BURST_THRESHOLD);
  for (const h of hosts) {
    const f = excludedBy(h, req, burstOpen);
    if (f) excluded[f] += 1;
    else ok.push(h);
  }
  if (ok.length === 0) {
    const full = { sandboxes: 0, cpus: 0, memory: 0 };
    for (const h of hosts) {
      const l = excludedBy(h, req, burstOpen) === 'room' ? fullOn(h, req) : null;
      if (l) full[l] += 1;
    }
    return { hosts: hosts.length, excluded, full };
  }
  // Partial Fisher-Yates: the first k entries of `ok` become a uniform sample.
  const k = Math.min(Math.max(1, p.k), ok.length);
  let best: PlacementHost | null = null;
  let bestJob = 0;
  let bestScore = -Infinity;
  for (let i = 0; i < k; i++) {
    const j = i + Math.floor(p.random() * (ok.length - i));
    const t = ok[i];
    ok[i] = ok[j];
    ok[j] = t;
    const h = ok[i];
    // The job key: fewer of the job's sandboxes is better when spreading, more when packing.
    const jk = req.job === null ? 0 : (p.job === 'spread' ? -1 : 1) * (h.jobs[req.job] ?? 0);
    if (best !== null && jk < bestJob) continue;
    const s = score(h, req, p);
    if (best === null || jk > bestJob || s > bestScore) {
      best = h;
      bestJob = jk;
      bestScore = s;
    }
  }
  return best!;
}

/** Whether a {@link choose} answer is {@link NoHost}. */
export function isNoHost(x: PlacementHost | NoHost): x is NoHost {
  return (x as NoHost).excluded !== undefined;
}

/** Which limits the full hosts hit, in words: `2 at their sandbox limit, 1 out of memory`. */
function fullText(f: NonNullable<NoHost['full']>): string {
  const t = [[f.sandboxes, 'at their sandbox limit'], [f.cpus, 'out of cores'], [f.memory, 'out of memory']] as const;
  return t.filter(([n]) => n > 0).map(([n, w]) => `${n} ${w}`).join(', ');
}

/**
 * The message and kind of a create no host could take: ResourceExhausted when some host
 * has the backend but no room (or refused), Unavailable when no host is up, else
 * FailedPrecondition (no up host offers the backend, or every one is cordoned).
 */
export function noHostError(n: NoHost, req: Pick<PlacementRequest, 'backend' | 'cpus' | 'memoryBytes'>): { kind: 'ResourceExhausted' | 'Unavailable' | 'FailedPrecondition'; message: string } {
  const e = n.excluded;
  const parts = [
    `${e.down} down`, `${e.cordoned} cordoned`, `${e.backend} without the ${req.backend} backend`,
    ...(e.burst ? [`${e.burst} in the burst pool (closed: the request does not allow bursting or the primary pool is not above its threshold)`] : []),
    `${e.refused} refused it (ResourceExhausted or Unavailable)`,
    `${e.room} without room for ${req.cpus} cores and ${req.memoryBytes} bytes of memory (admission limits${n.full && e.room ? `: ${fullText(n.full)}` : ''})`,
  ];
  const message = n.hosts === 0
    ? 'no host is registered in the fleet'
    : `no host can take this sandbox: of ${n.hosts} hosts, ${parts.join(', ')}`;
  const kind = e.room + e.refused > 0 ? 'ResourceExhausted' : n.hosts === e.down ? 'Unavailable' : 'FailedPrecondition';
  return { kind, message };
}
