/**
 * Ordered schema migrations, keyed on SQLite's `PRAGMA user_version`.
 *
 * Migration N (1-based) brings a database at user_version N-1 to N. Migrations are
 * append-only: never edit one that has shipped; add the next. Each has a test in
 * test/unit/store.test.ts that applies it to a database at the previous version.
 */

/** One migration: `sql` runs inside a transaction together with the user_version bump. */
export interface Migration {
  /** Target user_version. */
  version: number;
  /** What it does, for logs. */
  description: string;
  /** DDL/DML to run. */
  sql: string;
}

/** All migrations, in order. */
export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    description: 'sandboxes, uid ranges, events',
    sql: `
      CREATE TABLE sandboxes (
        id              TEXT PRIMARY KEY,
        backend         TEXT NOT NULL,
        image           TEXT NOT NULL,
        image_layers    TEXT NOT NULL,          -- JSON array of digests, lowest first
        image_config    TEXT NOT NULL,          -- JSON: env, cwd, user, cmd
        state           TEXT NOT NULL,          -- creating|running|paused|stopped|failed|destroyed
        desired         TEXT,                   -- target of an in-flight transition (intent), else NULL
        acknowledged    INTEGER NOT NULL DEFAULT 0, -- 1 once create has committed
        cpus            REAL NOT NULL,
        memory_bytes    INTEGER NOT NULL,
        pids            INTEGER NOT NULL,
        labels          TEXT NOT NULL,          -- JSON object
        env             TEXT NOT NULL,          -- JSON object
        ttl_s           INTEGER,
        created_at      INTEGER NOT NULL,       -- ms since epoch
        updated_at      INTEGER NOT NULL,
        init_pid        INTEGER,                -- host pid of the sandbox init
        init_start      INTEGER,                -- /proc/PID/stat starttime (clock ticks), guards pid reuse
        uid_base        INTEGER,
        uid_count       INTEGER,
        error           TEXT
      );
      CREATE INDEX sandboxes_state ON sandboxes(state);
      CREATE TABLE uid_ranges (
        base       INTEGER PRIMARY KEY,
        sandbox_id TEXT NOT NULL UNIQUE
      );
      CREATE TABLE events (
        seq        INTEGER PRIMARY KEY AUTOINCREMENT,
        time       INTEGER NOT NULL,
        type       TEXT NOT NULL,
        sandbox_id TEXT,
        state      TEXT,
        labels     TEXT,
        message    TEXT
      );
      CREATE INDEX events_time ON events(time);
    `,
  },
  {
    version: 2,
    description: 'priority, idle timeout and last activity on sandboxes; job leases',
    sql: `
      ALTER TABLE sandboxes ADD COLUMN priority TEXT NOT NULL DEFAULT 'latency'; -- latency | batch
      ALTER TABLE sandboxes ADD COLUMN idle_timeout_s INTEGER;                 -- pause after this long without an exec
      ALTER TABLE sandboxes ADD COLUMN last_active_at INTEGER;                 -- ms; last exec start (or creation)
      CREATE TABLE leases (
        job         TEXT PRIMARY KEY,          -- value of the sandboxes' "job" label
        ttl_s       INTEGER NOT NULL,
        expires_at  INTEGER NOT NULL,          -- ms; a renewal at or after this instant is refused
        lapsed_at   INTEGER,                   -- ms; set by the reaper when it paused the job
        created_at  INTEGER NOT NULL
      );
    `,
  },
  {
    version: 3,
    description: 'snapshots; the trajectory log; the snapshot a sandbox was restored from',
    sql: `
      ALTER TABLE sandboxes ADD COLUMN snapshot_id TEXT;                     -- snapshot restored or forked from, else NULL
      CREATE TABLE snapshots (
        id            TEXT PRIMARY KEY,        -- snap-<16 hex>
        name          TEXT UNIQUE,             -- optional, unique per host
        kind          TEXT NOT NULL,           -- filesystem
        sandbox_id    TEXT NOT NULL,           -- source (may be gone)
        backend       TEXT NOT NULL,
        image         TEXT NOT NULL,
        image_layers  TEXT NOT NULL,           -- JSON array, lowest first; the last is the snapshot layer
        image_config  TEXT NOT NULL,           -- JSON: env, cwd, user, cmd
        layer         TEXT NOT NULL,           -- digest of the snapshot layer
        size_bytes    INTEGER NOT NULL,
        cpus          REAL NOT NULL,
        memory_bytes  INTEGER NOT NULL,
        pids          INTEGER NOT NULL,
        priority      TEXT NOT NULL,
        labels        TEXT NOT NULL,           -- JSON object
        env           TEXT NOT NULL,           -- JSON object
        created_at    INTEGER NOT NULL
      );
      CREATE TABLE trajectories (
        id            TEXT PRIMARY KEY,
        created_at    INTEGER NOT NULL,
        updated_at    INTEGER NOT NULL,
        truncations   INTEGER NOT NULL DEFAULT 0,
        removed_at    INTEGER                  -- set by rm or retention: the id is never reused
      );
      CREATE TABLE trajectory_steps (
        trajectory    TEXT NOT NULL REFERENCES trajectories(id) ON DELETE CASCADE,
        step          INTEGER NOT NULL,
        hash          TEXT NOT NULL,           -- sha256 hex of the canonical request
        sandbox_id    TEXT NOT NULL,
        request       TEXT NOT NULL,           -- JSON: argv, env, cwd, user, timeout_ms, stdin_sha256
        started_at    INTEGER NOT NULL,
        finished_at   INTEGER,                 -- NULL: started and not (yet) finished
        result        TEXT,                    -- JSON: exit_code, signal, oom, timed_out, duration_ms, truncation flags
        stdout        BLOB,
        stderr        BLOB,
        error         TEXT,                    -- why the outcome is unknown, when known to be
        replays       INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (trajectory, step)
      );
      CREATE INDEX trajectories_updated ON trajectories(updated_at);
    `,
  },
  {
    version: 4,
    description: 'fork intents: a fork is all or nothing across a dsecd crash',
    sql: `
      CREATE TABLE fork_intents (
        id          TEXT PRIMARY KEY,          -- fork-<16 hex>; also the dsec.fork label of its sandboxes
        snapshot_id TEXT NOT NULL,
        count       INTEGER NOT NULL,
        created_at  INTEGER NOT NULL
      );
    `,
  },
  {
    version: 5,
    description: 'per-sandbox seccomp override',
    sql: `
      ALTER TABLE sandboxes ADD COLUMN seccomp TEXT;                         -- JSON {allow?, deny?} over the default profile, else NULL
    `,
  },
  {
    version: 6,
    description: 'hardening: network, writable-layer quota and filesystem options on sandboxes and snapshots',
    sql: `
      ALTER TABLE sandboxes ADD COLUMN network TEXT;                         -- JSON NetworkSpec, else NULL (mode none)
      ALTER TABLE sandboxes ADD COLUMN disk_bytes INTEGER;                   -- quota on the writable layer, else NULL (none)
      ALTER TABLE sandboxes ADD COLUMN filesystem TEXT;                      -- JSON FilesystemSpec, else NULL (defaults)
      ALTER TABLE snapshots ADD COLUMN network TEXT;                         -- the source's, restored by default
      ALTER TABLE snapshots ADD COLUMN disk_bytes INTEGER;
      ALTER TABLE snapshots ADD COLUMN filesystem TEXT;
    `,
  },
  {
    version: 7,
    description: 'machine snapshots of microVMs (kind vm)',
    sql: `
      ALTER TABLE snapshots ADD COLUMN machine TEXT;                         -- JSON MachineSnapshot of a kind vm snapshot, else NULL
    `,
  },
  {
    version: 8,
    description: 'per-sandbox I/O weight and limits',
    sql: `
      ALTER TABLE sandboxes ADD COLUMN io TEXT;                              -- JSON IoLimits (daemon/host/cgroups/io.ts), else NULL (none)
    `,
  },
  {
    version: 9,
    description: 'API tokens of the TCP door (hashes only)',
    sql: `
      CREATE TABLE tokens (
        id          TEXT PRIMARY KEY,               -- 16 hex, the first part of the token text
        tenant      TEXT NOT NULL,
        role        TEXT NOT NULL,                  -- admin|user|reader|metrics
        hash        TEXT NOT NULL,                  -- HMAC-SHA256 of the token text (daemon/remote/tokens.ts)
        description TEXT,
        created_at  INTEGER NOT NULL,               -- ms since epoch
        expires_at  INTEGER,                        -- ms since epoch, NULL: never
        revoked_at  INTEGER                         -- ms since epoch, NULL: not revoked
      );
    `,
  },
  {
    version: 10,
    description: 'tenancy: a tenant on sandboxes, snapshots, trajectories, leases and events; snapshot names unique per tenant, leases keyed on (tenant, job)',
    sql: `
      ALTER TABLE sandboxes ADD COLUMN tenant TEXT NOT NULL DEFAULT 'system';
      CREATE INDEX sandboxes_tenant ON sandboxes(tenant);
      ALTER TABLE events ADD COLUMN tenant TEXT NOT NULL DEFAULT 'system';
      -- Trajectory ids are the caller's names: the row's id is the tenant's key,
      -- the name alone for tenant system and tenant/name for the others (daemon/sandbox/trajectory.ts).
      ALTER TABLE trajectories ADD COLUMN tenant TEXT NOT NULL DEFAULT 'system';
      -- UNIQUE(name) cannot be dropped in place: the table is rebuilt with UNIQUE(tenant, name).
      CREATE TABLE snapshots_v10 (
        id            TEXT PRIMARY KEY,
        tenant        TEXT NOT NULL DEFAULT 'system',
        name          TEXT,                    -- optional, unique per tenant
        kind          TEXT NOT NULL,
        sandbox_id    TEXT NOT NULL,
        backend       TEXT NOT NULL,
        image         TEXT NOT NULL,
        image_layers  TEXT NOT NULL,
        image_config  TEXT NOT NULL,
        layer         TEXT NOT NULL,
        size_bytes    INTEGER NOT NULL,
        cpus          REAL NOT NULL,
        memory_bytes  INTEGER NOT NULL,
        pids          INTEGER NOT NULL,
        priority      TEXT NOT NULL,
        labels        TEXT NOT NULL,
        env           TEXT NOT NULL,
        created_at    INTEGER NOT NULL,
        network       TEXT,
        disk_bytes    INTEGER,
        filesystem    TEXT,
        machine       TEXT,
        UNIQUE (tenant, name)
      );
      INSERT INTO snapshots_v10 (id, tenant, name, kind, sandbox_id, backend, image, image_layers, image_config, layer, size_bytes, cpus,
          memory_bytes, pids, priority, labels, env, created_at, network, disk_bytes, filesystem, machine)
        SELECT id, 'system', name, kind, sandbox_id, backend, image, image_layers, image_config, layer, size_bytes, cpus,
          memory_bytes, pids, priority, labels, env, created_at, network, disk_bytes, filesystem, machine FROM snapshots;
      DROP TABLE snapshots;
      ALTER TABLE snapshots_v10 RENAME TO snapshots;
      CREATE TABLE leases_v10 (
        tenant      TEXT NOT NULL DEFAULT 'system',
        job         TEXT NOT NULL,             -- value of the tenant's sandboxes' "job" label
        ttl_s       INTEGER NOT NULL,
        expires_at  INTEGER NOT NULL,
        lapsed_at   INTEGER,
        created_at  INTEGER NOT NULL,
        PRIMARY KEY (tenant, job)
      );
      INSERT INTO leases_v10 (tenant, job, ttl_s, expires_at, lapsed_at, created_at)
        SELECT 'system', job, ttl_s, expires_at, lapsed_at, created_at FROM leases;
      DROP TABLE leases;
      ALTER TABLE leases_v10 RENAME TO leases;
    `,
  },
  {
    version: 11,
    description: 'admission totals per tenant kept by triggers, so admitting a create reads one row per tenant instead of scanning every sandbox',
    sql: `
      -- What counts against admission (daemon/sandbox/admission.ts): every sandbox but
      -- warm-pool shells (labels hold "dsec.pool"): its count, memory limits (bytes), CPU
      -- limits (millicores, an integer so that adding and removing never drifts) and the
      -- writable-layer quotas of container sandboxes (bytes).
      CREATE TABLE admission_totals (
        tenant  TEXT PRIMARY KEY,
        n       INTEGER NOT NULL,
        mem     INTEGER NOT NULL,
        mcpus   INTEGER NOT NULL,
        disk    INTEGER NOT NULL
      );
      INSERT INTO admission_totals (tenant, n, mem, mcpus, disk)
        SELECT tenant, COUNT(*), SUM(memory_bytes), SUM(CAST(ROUND(cpus * 1000) AS INTEGER)),
          SUM(CASE WHEN backend = 'container' THEN COALESCE(disk_bytes, 0) ELSE 0 END)
        FROM sandboxes WHERE json_extract(labels, '$."dsec.pool"') IS NULL GROUP BY tenant;
      CREATE TRIGGER admission_totals_insert AFTER INSERT ON sandboxes
        WHEN json_extract(NEW.labels, '$."dsec.pool"') IS NULL
      BEGIN
        INSERT INTO admission_totals (tenant, n, mem, mcpus, disk)
          VALUES (NEW.tenant, 1, NEW.memory_bytes, CAST(ROUND(NEW.cpus * 1000) AS INTEGER),
            CASE WHEN NEW.backend = 'container' THEN COALESCE(NEW.disk_bytes, 0) ELSE 0 END)
          ON CONFLICT (tenant) DO UPDATE SET n = n + excluded.n, mem = mem + excluded.mem,
            mcpus = mcpus + excluded.mcpus, disk = disk + excluded.disk;
      END;
      CREATE TRIGGER admission_totals_delete AFTER DELETE ON sandboxes
        WHEN json_extract(OLD.labels, '$."dsec.pool"') IS NULL
      BEGIN
        UPDATE admission_totals SET n = n - 1, mem = mem - OLD.memory_bytes,
            mcpus = mcpus - CAST(ROUND(OLD.cpus * 1000) AS INTEGER),
            disk = disk - CASE WHEN OLD.backend = 'container' THEN COALESCE(OLD.disk_bytes, 0) ELSE 0 END
          WHERE tenant = OLD.tenant;
      END;
      -- A claimed warm-pool shell (labels, tenant and limits rewritten) starts counting here;
      -- any other change of these columns moves the row's share.
      CREATE TRIGGER admission_totals_update AFTER UPDATE OF tenant, labels, memory_bytes, cpus, disk_bytes, backend ON sandboxes
      BEGIN
        UPDATE admission_totals SET n = n - 1, mem = mem - OLD.memory_bytes,
            mcpus = mcpus - CAST(ROUND(OLD.cpus * 1000) AS INTEGER),
            disk = disk - CASE WHEN OLD.backend = 'container' THEN COALESCE(OLD.disk_bytes, 0) ELSE 0 END
          WHERE tenant = OLD.tenant AND json_extract(OLD.labels, '$."dsec.pool"') IS NULL;
        INSERT INTO admission_totals (tenant, n, mem, mcpus, disk)
          SELECT NEW.tenant, 1, NEW.memory_bytes, CAST(ROUND(NEW.cpus * 1000) AS INTEGER),
            CASE WHEN NEW.backend = 'container' THEN COALESCE(NEW.disk_bytes, 0) ELSE 0 END
          WHERE json_extract(NEW.labels, '$."dsec.pool"') IS NULL
          ON CONFLICT (tenant) DO UPDATE SET n = n + excluded.n, mem = mem + excluded.mem,
            mcpus = mcpus + excluded.mcpus, disk = disk + excluded.disk;
      END;
    `,
  },
];
